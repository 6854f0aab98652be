"""benchmarks.full_step: full Zipformer training steps, standard CTC against Pruned CTC."""

import pytest


def test_full_step_benchmark_pruned_ctc_matches_standard_loss_with_less_memory(tmp_path, run_program, read_csv):
    frames, vocab_size = 400, 40000
    run_program("benchmarks.full_step", "--preset", "tiny", "--grid", f"{frames}:{vocab_size}", "--warmup", "0",
                "--steps", "1", "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "full_step_cpu.csv")}
    assert set(rows) == {"standard", "pruned"}
    standard, pruned = rows["standard"], rows["pruned"]
    assert standard["initial_checksum"] == pruned["initial_checksum"]
    first_standard, first_pruned = float(standard["first_step_loss"]), float(pruned["first_step_loss"])
    assert first_pruned == pytest.approx(first_standard, rel=1e-5)
    # Standard CTC holds logits, log-probs and their gradients: several (M, V) FP32 arrays
    # of 400 x 40,000 x 4 bytes = 61 MiB; Pruned CTC one (M, 4096) block at a time.
    array_mib = frames * vocab_size * 4 / 2 ** 20
    assert float(standard["peak_mib"]) - float(pruned["peak_mib"]) > 2 * array_mib
    (summary,) = read_csv(tmp_path / "summary_cpu.csv")
    assert float(summary["memory_reduction"]) > 1.5
    assert float(summary["first_loss_rel_diff"]) < 1e-5
    report = (tmp_path / "results_cpu.md").read_text()
    assert "Command: `python -m benchmarks.full_step" in report and "Load average" in report
    assert "| 400 | 40,000 |" in report
