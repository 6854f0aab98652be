"""scripts/streaming_consistency.py end to end on a tiny random LLM: FP32 parallel and
cached computation agree (App. E's FP32 condition), the cache stays within its bound."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]


def test_streaming_consistency_fp32_agrees_and_the_cache_is_bounded(tmp_path):
    environment = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "streaming_consistency.py"), "--layers", "1",
                    "--width", "64", "--utterances", "2", "--min-seconds", "3", "--max-seconds", "7",
                    "--histories", "1", "4", "--prompt-len", "3", "--output-dir", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=300, env=environment)
    with open(tmp_path / "consistency.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8  # 4 conditions x 2 histories
    for row in rows:
        if row["dtype"] == "float32":
            assert float(row["relative_logit_error"]) <= 1e-5
            assert float(row["greedy_disagreement"]) == 0
    with open(tmp_path / "chunk_costs.csv") as handle:
        costs = list(csv.DictReader(handle))
    assert len(costs) == 30
    assert max(int(r["cache_during"]) for r in costs) == 3 + 260
    assert max(int(r["cache_after"]) for r in costs) == 3 + 208
    assert "Command: `python" in (tmp_path / "results.md").read_text()
