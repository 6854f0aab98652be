"""benchmarks.head_loss: the head + CTC loss benchmark runs end to end on a tiny grid,
measures less memory for Pruned CTC, and marks and extrapolates out-of-memory points."""

import pytest

from benchmarks.head_loss.out_of_memory import extrapolate_linear, extrapolate_oom_rows, oom_row


def test_head_loss_benchmark_measures_less_memory_for_pruned_ctc(tmp_path, run_program, read_csv):
    run_program("benchmarks.head_loss", "--vocab-sizes", "30000", "--frames", "400", "--dim", "64",
                "--runs", "1", "--no-dp", "--interleave-rounds", "1", "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "head_loss_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    # Standard CTC holds several (M, V) FP32 arrays: 400 x 30,000 x 4 bytes = 46 MB each.
    assert float(rows["standard"]["activation_mb"]) > 100
    assert float(rows["pruned"]["activation_mb"]) < float(rows["standard"]["activation_mb"]) / 3
    # The paper's measure keeps the (V, D) weight gradient: 30,000 x 64 x 4 bytes = 7.3 MB.
    for row in rows.values():
        assert float(row["peak_extra_mb"]) >= float(row["gradient_mb"]) > 7
    (interleaved,) = read_csv(tmp_path / "interleaved_cpu.csv")
    assert len(interleaved["pruned_times_s"].split()) == 1
    assert float(interleaved["pruned_over_standard"]) == pytest.approx(
        float(interleaved["pruned_s"]) / float(interleaved["standard_s"]))
    assert (tmp_path / "head_loss_cpu.png").exists()
    assert "Command: `python -m benchmarks.head_loss --vocab-sizes 30000" in (tmp_path / "results_cpu.md").read_text()


def test_head_loss_oom_extrapolation_is_the_least_squares_line():
    import numpy

    vs, ys = [2000, 5000, 10000, 20000], [0.31, 0.52, 1.13, 1.95]
    for v in (50000, 100000, 3000):
        assert extrapolate_linear(vs, ys, v) == pytest.approx(numpy.polyval(numpy.polyfit(vs, ys, 1), v), rel=1e-12)
    assert extrapolate_linear([1, 3], [2.0, 6.0], 10) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        extrapolate_linear([5], [1.0], 10)

    # OOM rows: fit over the four largest feasible V of the same (method, M) only.
    def feasible(method, v, frames, y):
        return dict(method=method, vocab_size=v, frames=frames, time_s=y, peak_extra_mb=10 * y,
                    activation_mb=5 * y, oom=False, extrapolated=False)
    rows = [feasible("standard", v, 400, y) for v, y in
            [(500, 99.0), (1000, 1.0), (2000, 2.5), (3000, 2.9), (4000, 4.2)]]
    rows += [feasible("pruned", 1000, 400, 7.0), feasible("standard", 1000, 800, 7.0)]
    rows += [oom_row("standard", 100000, 400, 64, 4096), oom_row("pruned", 100000, 400, 64, 4096)]
    extrapolate_oom_rows(rows)
    standard, pruned = rows[-2:]
    fit = numpy.polyfit([1000, 2000, 3000, 4000], [1.0, 2.5, 2.9, 4.2], 1)
    assert standard["extrapolated"] and standard["oom"]
    assert standard["time_s"] == pytest.approx(numpy.polyval(fit, 100000), abs=1e-3)
    assert standard["peak_extra_mb"] == pytest.approx(10 * numpy.polyval(fit, 100000), abs=0.1)
    assert pruned["oom"] and not pruned["extrapolated"] and pruned["time_s"] == ""


def test_head_loss_benchmark_marks_and_extrapolates_out_of_memory_points(tmp_path, run_program, read_csv):
    import numpy

    # Address-space cap of 900 MB: Python + torch map ~0.6 GB; standard CTC at V = 4,000
    # peaks near 0.6 GB, at V = 100,000 (several 160 MB (M, V) arrays) above 1.2 GB.
    completed = run_program(
        "benchmarks.head_loss", "--methods", "standard", "--vocab-sizes", "1000", "2000", "3000", "4000", "100000",
        "--frames", "400", "--dim", "64", "--runs", "1", "--warmup", "1", "--no-dp", "--memory-limit-mb", "900",
        "--output-dir", str(tmp_path), environment=dict(OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2"), timeout=300)
    assert "V=100000 M=400: out of memory (marked OOM)" in completed.stdout
    rows = {int(r["vocab_size"]): r for r in read_csv(tmp_path / "head_loss_cpu.csv")}
    assert sorted(rows) == [1000, 2000, 3000, 4000, 100000]
    assert all(rows[v]["oom"] == "False" and rows[v]["extrapolated"] == "False"
               for v in (1000, 2000, 3000, 4000))
    oom = rows[100000]
    assert oom["oom"] == "True" and oom["extrapolated"] == "True"
    vs = [1000, 2000, 3000, 4000]
    for field, tolerance in (("time_s", 1e-3), ("activation_mb", 0.1), ("peak_extra_mb", 0.1)):
        fit = numpy.polyfit(vs, [float(rows[v][field]) for v in vs], 1)
        assert float(oom[field]) == pytest.approx(numpy.polyval(fit, 100000), abs=tolerance)
    results = (tmp_path / "results_cpu.md").read_text()
    assert f"OOM (~{float(oom['activation_mb']):.0f} MB, ~{float(oom['time_s']):.3f} s " \
        "extrapolated)" in results
    assert (tmp_path / "head_loss_cpu.png").exists()
