"""Checkpoints hold the trainable parameters and the config; LoRA merging."""

import dataclasses

import pytest
import torch

from llm_ctc.checkpoint import load_model_checkpoint, save_model_checkpoint
from llm_ctc.model import LLMCTCModel
from references.tiny_llm import perturb_lora, random_features


@pytest.fixture(scope="module")
def trained_model(ctc_config, qwen3_tokenizer):
    torch.manual_seed(31)
    model = LLMCTCModel(ctc_config, tokenizer=qwen3_tokenizer)
    perturb_lora(model)
    with torch.no_grad():
        model.blank_offset.fill_(1.7)
    return model.eval()


def test_round_trip_gives_identical_outputs(trained_model, tmp_path, qwen3_tokenizer):
    path = save_model_checkpoint(tmp_path / "epoch-1.pt", trained_model)
    torch.manual_seed(32)  # a different random start for everything trainable
    loaded = load_model_checkpoint(path, tokenizer=qwen3_tokenizer).eval()
    features, lengths = random_features([80, 64], seed=33)
    with torch.no_grad():
        expected, expected_lens = trained_model.log_probs(features, lengths)
        found, found_lens = loaded.log_probs(features, lengths)
    assert torch.equal(found_lens, expected_lens)
    assert torch.equal(found, expected)
    assert loaded.blank_offset.item() == pytest.approx(1.7)


def test_checkpoint_holds_only_trainable_parameters(trained_model, tmp_path):
    path = save_model_checkpoint(tmp_path / "epoch-1.pt", trained_model)
    saved = torch.load(path, weights_only=False)
    trainable = {name for name, p in trained_model.named_parameters() if p.requires_grad}
    assert set(saved["trainable"]) == trainable
    assert any("lora_" in name for name in trainable)
    assert {"query", "blank_offset"} <= trainable
    stored = sum(v.numel() for v in saved["trainable"].values())
    assert stored == trained_model.num_trainable_parameters()
    assert stored < trained_model.lm_head.weight.numel() / 10
    assert saved["config"]["model"]["llm"] == trained_model.config.llm


def test_trainable_state_of_another_configuration_is_refused(trained_model, ctc_config, qwen3_tokenizer):
    other = LLMCTCModel(dataclasses.replace(ctc_config, readout="speech"), tokenizer=qwen3_tokenizer)
    with pytest.raises(KeyError, match="query"):
        other.load_checkpoint_state_dict(trained_model.checkpoint_state_dict())


def test_merged_lora_gives_the_same_outputs(ctc_config, qwen3_tokenizer):
    torch.manual_seed(34)
    model = LLMCTCModel(ctc_config, tokenizer=qwen3_tokenizer).eval()
    perturb_lora(model)
    features, lengths = random_features([70], seed=35)
    with torch.no_grad():
        before, _ = model.ctc_states(features, lengths)
        with model.llm.disable_adapter():
            without_lora, _ = model.ctc_states(features, lengths)
        model.prepare_for_decoding()
        after, _ = model.ctc_states(features, lengths)
    assert not any("lora_" in name for name, _ in model.named_parameters())
    assert set(model.checkpoint_state_dict()) == {"query", "blank_offset"} | {
        name for name, _ in model.projector.named_parameters(prefix="projector")}
    assert (before - without_lora).abs().max() > 1e-3  # LoRA really changes the output
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="LLM checkpoint not found"):
        load_model_checkpoint(tmp_path / "nope.pt")
