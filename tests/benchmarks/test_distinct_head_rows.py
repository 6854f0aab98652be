"""benchmarks.distinct_head_rows: the head it builds has the tiny LM's groups, and its two
losses (all rows, distinct rows) agree with the full head's in float64 on a small run whose results it writes."""

import csv

import pytest
import torch

from benchmarks.distinct_head_rows.__main__ import QWEN3_BLANK, QWEN3_HEAD_ROWS, main, tiny_lm_head
from llm_ctc.head_rows import find_row_groups


def test_head_has_its_token_rows_and_one_shared_row_that_blank_belongs_to():
    weight, own = tiny_lm_head(QWEN3_HEAD_ROWS, 4, 30, torch.Generator().manual_seed(1))
    groups = find_row_groups(weight, None)
    assert groups.num_groups == 31 and (own < QWEN3_BLANK).all()
    assert torch.equal(weight[QWEN3_BLANK], weight[QWEN3_HEAD_ROWS - 1])
    assert int(groups.counts.max()) == QWEN3_HEAD_ROWS - 30


def test_small_run_writes_equal_losses_and_their_times(tmp_path):
    main(["--dim", "8", "--tokens", "20", "--frames", "200", "--rounds", "1", "--threads", "1",
          "--output-dir", str(tmp_path)])
    row, = csv.DictReader(open(tmp_path / "distinct_head_rows_cpu.csv"))
    assert int(row["distinct_rows"]) == 22  # 20 tokens, the shared row, blank
    # Against the full head in float64: the groups are the accurate float32 loss (the full
    # head adds 151,916 equal rows' terms in float32).
    assert float(row["grouped_loss_error"]) < 1e-6 and float(row["grouped_gradient_error"]) < 1e-5
    assert float(row["full_loss_error"]) < 1e-5 and float(row["full_gradient_error"]) < 1e-2
    assert float(row["grouped_s"]) > 0 and float(row["full_s"]) > 0
    assert "| 200 | 22 |" in (tmp_path / "results_cpu.md").read_text()


def test_token_count_outside_the_tokenizer_is_refused():
    with pytest.raises(SystemExit, match=r"--tokens must be in \[1, 151669\), got 0"):
        main(["--tokens", "0"])
