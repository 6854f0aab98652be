"""The analysis scripts run end to end on tiny grids and write results that hold up."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def run(script: str, *arguments: str) -> None:
    subprocess.run([sys.executable, str(SCRIPTS / script), *arguments], check=True,
                   capture_output=True, text=True, timeout=300)


def read_csv(path: Path) -> list:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_beam_sweep_reaches_the_numerical_floor_at_a_wide_beam(tmp_path):
    run("beam_sweep.py", "--vocab-sizes", "300", "--frames", "400", "--seeds", "0",
        "--beams", "5", "150", "--dim", "32", "--output-dir", str(tmp_path))
    rows = read_csv(tmp_path / "discarded_mass_cpu.csv")
    by_beam = {float(r["beam"]): float(r["max_delta"]) for r in rows}
    assert by_beam[150.0] <= 1e-11 < by_beam[5.0]
    assert "Command: `python" in (tmp_path / "results_cpu.md").read_text()


def test_numerical_accuracy_meets_the_library_tolerances(tmp_path):
    run("numerical_accuracy.py", "--vocab-sizes", "300", "--frames", "400", "--seeds", "0",
        "--precision-vocab", "50", "--precision-frames", "400", "--dim", "32",
        "--output-dir", str(tmp_path))
    (row,) = read_csv(tmp_path / "accuracy_grid.csv")
    assert float(row["loss_error"]) <= 1e-6
    assert float(row["input_grad_error"]) <= 1e-5
    assert float(row["selected_weight_grad_error"]) <= 1e-4
    assert len(read_csv(tmp_path / "precision_table.csv")) == 5


def test_head_loss_benchmark_measures_less_memory_for_pruned_ctc(tmp_path):
    run("benchmark_head_loss.py", "--vocab-sizes", "30000", "--frames", "400", "--dim", "64",
        "--runs", "1", "--no-dp", "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "head_loss_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    # Standard CTC holds several (M, V) FP32 arrays: 400 x 30,000 x 4 bytes = 46 MB each.
    assert float(rows["standard"]["activation_mb"]) > 100
    assert float(rows["pruned"]["activation_mb"]) < float(rows["standard"]["activation_mb"]) / 3
    assert (tmp_path / "head_loss_cpu.png").exists()


def test_training_benchmark_times_the_presets_model_with_each_loss(tmp_path):
    import dataclasses

    from zipformer.model import CTCModel
    from zipformer.run_config import load_run_config

    preset = SCRIPTS.parent / "egs/mini/conf/train.yaml"
    overrides = ["model.preset=tiny", "data.max_duration=6"]
    run("benchmark_training.py", "--config", str(preset), "--threads", "1", "--warmup", "1", "--steps", "2",
        "--vocab-size", "40", "--output-dir", str(tmp_path), *overrides)
    rows = {r["ctc_loss"]: r for r in read_csv(tmp_path / "training_cpu.csv")}
    assert set(rows) == {"pruned", "standard"}
    config = load_run_config(preset, overrides)
    expected_params = CTCModel(dataclasses.replace(config.model, vocab_size=40, blank_id=0)).num_parameters()
    for row in rows.values():
        assert int(row["threads"]) == 1 and int(row["params"]) == expected_params
        audio_per_batch = float(row["audio_s_per_batch"])
        assert 2.0 <= audio_per_batch <= 6.0  # utterances of 2-4 s, batches up to max_duration
        assert float(row["audio_s_per_s"]) == pytest.approx(
            float(row["batches_per_s"]) * audio_per_batch, rel=0.02)
        assert 0 < float(row["peak_rss_after_warmup_mib"]) <= float(row["peak_rss_mib"])
        assert float(row["cpu_s_per_step"]) > 0
    report = (tmp_path / "training_cpu.md").read_text()
    assert "Command: `python" in report and "Load average" in report
    assert "`egs/mini/conf/train.yaml` with model.preset=tiny data.max_duration=6" in report
