"""The analysis scripts run end to end on tiny grids and write results that hold up."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def checkout_environment() -> dict:
    """The scripts import this checkout's packages, not an installed copy's."""
    import os

    paths = [str(SCRIPTS.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def run(script: str, *arguments: str) -> None:
    subprocess.run([sys.executable, str(SCRIPTS / script), *arguments], check=True,
                   capture_output=True, text=True, timeout=300, env=checkout_environment())


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
        "--bias-scales", "0", "0.5", "--output-dir", str(tmp_path))
    (row,) = read_csv(tmp_path / "accuracy_grid.csv")
    assert float(row["loss_error"]) <= 1e-6
    assert float(row["input_grad_error"]) <= 1e-5
    assert float(row["selected_weight_grad_error"]) <= 1e-4
    precision_rows = read_csv(tmp_path / "precision_table.csv")
    assert len(precision_rows) == 10
    assert {r["bias_scale"] for r in precision_rows} == {"0.0", "0.5"}


def test_head_loss_benchmark_measures_less_memory_for_pruned_ctc(tmp_path):
    run("benchmark_head_loss.py", "--vocab-sizes", "30000", "--frames", "400", "--dim", "64",
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


def test_head_loss_benchmark_frozen_head_trains_only_the_input_and_the_blank_offset(tmp_path):
    run("benchmark_head_loss.py", "--vocab-sizes", "30000", "--frames", "400", "--dim", "64",
        "--runs", "1", "--no-dp", "--frozen-head", "--methods", "standard", "pruned",
        "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "head_loss_cpu.csv")}
    for row in rows.values():
        assert row["frozen_head"] == "True" and float(row["gradient_mb"]) == 0
    # Standard CTC's (M, V) logits and their gradient: 46 MB each; Pruned CTC one block.
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"]) / 3


def test_training_benchmark_times_the_presets_model_with_each_loss(tmp_path):
    import dataclasses

    from zipformer.model import CTCModel
    from asr.config import load_run_config

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


def test_beam_sweep_on_real_features_reads_a_recipes_relative_feature_paths(tmp_path, make_cut_corpus):
    import gzip
    import json

    recipe = tmp_path / "recipe"
    recipe.mkdir()
    cuts = {f"utt-{i}": (2.0 + 0.5 * i, text) for i, text in
            enumerate(["HELLO WORLD", "A SMALL TEST", "BEAMS AND LATTICES", "ONE MORE"])}
    corpus = make_cut_corpus(recipe, train=cuts, valid={"v": (1.5, "V")})
    lang_dir = tmp_path / "lang_char"
    lang_dir.mkdir()
    (lang_dir / "tokens.txt").write_text(corpus["tokens"].read_text())
    # As a recipe writes them: feature paths relative to the recipe folder.
    manifest = recipe / "data/fbank/cuts_train.jsonl.gz"
    manifest.parent.mkdir(parents=True)
    with gzip.open(corpus["train"], "rt") as source, gzip.open(manifest, "wt") as target:
        for line in source:
            cut = json.loads(line)
            cut["features"]["storage_path"] = str(Path(cut["features"]["storage_path"]).relative_to(recipe))
            target.write(json.dumps(cut) + "\n")
    output = tmp_path / "out"
    run("beam_sweep.py", "--cuts", str(manifest), "--lang-dir", str(lang_dir), "--preset", "tiny",
        "--seeds", "0", "1", "--beams", "3", "150", "--max-duration", "6", "--output-dir", str(output))
    required = read_csv(output / "required_beam_real_tiny_v29_cpu.csv")
    assert {r["seed"] for r in required} == {"0", "1"}
    assert sum(int(r["utterances"]) for r in required if r["seed"] == "0") == len(cuts)
    by_beam = {}
    for row in read_csv(output / "discarded_mass_real_tiny_v29_cpu.csv"):
        by_beam[float(row["beam"])] = max(by_beam.get(float(row["beam"]), 0.0), float(row["max_delta"]))
    assert by_beam[150.0] <= 1e-11 < by_beam[3.0]
    assert "randomly initialized" in (output / "results_real_tiny_v29_cpu.md").read_text()


def test_beam_sweep_names_the_missing_corpus_and_how_to_make_it(tmp_path):
    missing = tmp_path / "no_cuts.jsonl.gz"
    completed = subprocess.run([sys.executable, str(SCRIPTS / "beam_sweep.py"), "--cuts", str(missing)],
                               capture_output=True, text=True, timeout=120,
                               env=checkout_environment())
    assert completed.returncode != 0
    assert str(missing) in completed.stderr
    assert "cd egs/mini && ./run.sh --stop-stage 3" in completed.stderr
    # The lang dir that recipe builds (egs/mini/conf/data.sh: vocab_size=500).
    assert "egs/mini/data/full/lang_bpe_500" in completed.stderr


def test_full_step_benchmark_pruned_ctc_matches_standard_loss_with_less_memory(tmp_path):
    frames, vocab_size = 400, 40000
    run("benchmark_full_step.py", "--preset", "tiny", "--grid", f"{frames}:{vocab_size}", "--warmup", "0",
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
    assert "Command: `python" in report and "Load average" in report and "| 400 | 40,000 |" in report


def load_head_loss_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_head_loss",
                                                  SCRIPTS / "benchmark_head_loss.py")
    module = importlib.util.module_from_spec(spec)
    # As when it runs as a script: its own folder first, for benchmark_support.
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def test_head_loss_oom_extrapolation_is_the_least_squares_line():
    import numpy

    benchmark = load_head_loss_benchmark()
    vs, ys = [2000, 5000, 10000, 20000], [0.31, 0.52, 1.13, 1.95]
    for v in (50000, 100000, 3000):
        assert benchmark.extrapolate_linear(vs, ys, v) == pytest.approx(
            numpy.polyval(numpy.polyfit(vs, ys, 1), v), rel=1e-12)
    assert benchmark.extrapolate_linear([1, 3], [2.0, 6.0], 10) == pytest.approx(20.0)
    with pytest.raises(ValueError):
        benchmark.extrapolate_linear([5], [1.0], 10)

    # OOM rows: fit over the four largest feasible V of the same (method, M) only.
    def feasible(method, v, frames, y):
        return dict(method=method, vocab_size=v, frames=frames, time_s=y, peak_extra_mb=10 * y,
                    activation_mb=5 * y, oom=False, extrapolated=False)
    rows = [feasible("standard", v, 400, y) for v, y in
            [(500, 99.0), (1000, 1.0), (2000, 2.5), (3000, 2.9), (4000, 4.2)]]
    rows += [feasible("pruned", 1000, 400, 7.0), feasible("standard", 1000, 800, 7.0)]
    rows += [benchmark.oom_row("standard", 100000, 400, 64, 4096),
             benchmark.oom_row("pruned", 100000, 400, 64, 4096)]
    benchmark.extrapolate_oom_rows(rows)
    standard, pruned = rows[-2:]
    fit = numpy.polyfit([1000, 2000, 3000, 4000], [1.0, 2.5, 2.9, 4.2], 1)
    assert standard["extrapolated"] and standard["oom"]
    assert standard["time_s"] == pytest.approx(numpy.polyval(fit, 100000), abs=1e-3)
    assert standard["peak_extra_mb"] == pytest.approx(10 * numpy.polyval(fit, 100000), abs=0.1)
    assert pruned["oom"] and not pruned["extrapolated"] and pruned["time_s"] == ""


def test_head_loss_benchmark_marks_and_extrapolates_out_of_memory_points(tmp_path):
    import numpy

    # Address-space cap of 900 MB: Python + torch map ~0.6 GB; standard CTC at V = 4,000
    # peaks near 0.6 GB, at V = 100,000 (several 160 MB (M, V) arrays) above 1.2 GB.
    environment = dict(checkout_environment(), OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2")
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / "benchmark_head_loss.py"), "--methods", "standard",
         "--vocab-sizes", "1000", "2000", "3000", "4000", "100000", "--frames", "400",
         "--dim", "64", "--runs", "1", "--warmup", "1", "--no-dp", "--memory-limit-mb", "900",
         "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
        env=environment, check=True)
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


def test_head_loss_benchmark_tells_out_of_memory_from_other_failures():
    import signal

    benchmark = load_head_loss_benchmark()
    for returncode, stderr in [
            (1, "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 160000000 bytes."),
            (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            (1, "Traceback (most recent call last):\nMemoryError"),
            (-signal.SIGKILL, "")]:
        assert benchmark.failure_reason(returncode, stderr)[0], stderr
    assert benchmark.failure_reason(1, "x\nValueError: bad frames") == (
        False, "ValueError: bad frames")
    assert benchmark.failure_reason(-signal.SIGSEGV, "") == (False, "killed by SIGSEGV")
