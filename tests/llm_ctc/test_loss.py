"""The LLM-CTC loss: dense CTC over the full head, eta's gradient, what trains."""

import warnings

import pytest
import torch

from pruned_ctc import pruned_ctc_loss
from references.tiny_llm import assert_loss_equals_dense_ctc, random_features

TEXTS = ["hello world", "the cat", "Speech"]


@pytest.fixture
def exact_beam(ctc_model):
    saved = ctc_model.config.alignment_beam
    ctc_model.config.alignment_beam = float("inf")
    yield ctc_model
    ctc_model.config.alignment_beam = saved


def batch(model):
    features, lengths = random_features([120, 96, 80], seed=4)
    return features, lengths, model.encode_texts(TEXTS)


def test_targets_are_lowercased_llm_tokens_without_special_tokens(ctc_model, qwen3_tokenizer):
    ids = ctc_model.encode_texts(["Hello World"])
    assert ids == [qwen3_tokenizer("hello world", add_special_tokens=False)["input_ids"]]
    assert all(i < len(qwen3_tokenizer) and i != ctc_model.blank_id for i in ids[0])


def test_loss_equals_dense_ctc_over_the_full_head(exact_beam):
    model = exact_beam
    stats = assert_loss_equals_dense_ctc(model, *batch(model))
    assert stats["excluded"] == 0 and stats["utterances"] == 3
    assert model.head_weight.shape[0] == 151_936


def test_unalignable_utterance_is_excluded_and_reported(ctc_model):
    features, lengths = random_features([40, 96], seed=5)
    targets = [list(range(100, 130)), ctc_model.encode_texts(["hi"])[0]]  # 30 tokens, 5 frames
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, stats = ctc_model.loss(features, lengths, targets)
    assert stats["not_alignable"] == 1 and stats["excluded"] == 1


def test_blank_offset_gradient_equals_finite_difference(exact_beam):
    model = exact_beam
    features, lengths, targets = batch(model)
    model.zero_grad()
    loss, _ = model.loss(features, lengths, targets)
    loss.backward()
    with torch.no_grad():
        states, lens = model.ctc_states(features, lengths)
    states, weight = states.double(), model.head_weight.double()
    bias = model.pretrained_bias.double()
    eta = model.blank_offset.detach().double()
    step = 1e-4

    def loss_at(value):
        shifted = bias.clone()
        shifted[model.blank_id] += value
        return pruned_ctc_loss(states, weight, shifted, targets, lens, blank_id=model.blank_id, beam=None)

    finite_difference = (loss_at(eta + step) - loss_at(eta - step)) / (2 * step)
    assert abs(finite_difference.item()) > 1.0  # a real signal, not a vanishing one
    torch.testing.assert_close(model.blank_offset.grad.double(), finite_difference, rtol=1e-3, atol=1e-3)


def test_only_lora_projector_query_and_blank_offset_get_gradients(ctc_model):
    model = ctc_model
    features, lengths, targets = batch(model)
    model.zero_grad(set_to_none=True)
    loss, _ = model.loss(features, lengths, targets)
    loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    frozen_with_grad = {name for name, p in model.named_parameters() if not p.requires_grad and p.grad is not None}
    assert not frozen_with_grad
    assert "blank_offset" in trained and "query" in trained
    assert {name for name in trained if name.startswith("projector.")} == {
        name for name, _ in model.projector.named_parameters(prefix="projector")}
    lora = {name for name, _ in model.named_parameters() if "lora_" in name}
    assert lora and lora <= trained
    assert trained == lora | {"blank_offset", "query"} | {
        name for name in trained if name.startswith("projector.")}
    assert not model.lm_head.weight.requires_grad and model.lm_head.weight.grad is None
    assert all(not p.requires_grad for p in model.encoder.parameters())
    base = [p for name, p in model.llm.named_parameters() if "lora_" not in name]
    assert base and all(not p.requires_grad and p.grad is None for p in base)
    model.zero_grad(set_to_none=True)


def test_encoder_stays_in_evaluation_mode(ctc_model):
    ctc_model.train()
    try:
        assert not any(module.training for module in ctc_model.encoder.modules())
        assert ctc_model.projector.training
    finally:
        ctc_model.eval()
