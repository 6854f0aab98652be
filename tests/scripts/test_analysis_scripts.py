"""The analysis scripts run end to end on tiny grids and write results that hold up."""

import csv
import subprocess
import sys
from pathlib import Path

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
