"""LLM-CE (Sec. 4.1, eq. 10): loss at the transcript positions only; generation."""

import dataclasses

import pytest
import torch

from llm_ctc.ce_model import LLMCEModel
from references.tiny_llm import perturb_lora, random_features, states_of_one_sequence


@pytest.fixture(scope="module")
def ce_model(ctc_config, tiny_untied_qwen3_dir, qwen3_tokenizer):
    torch.manual_seed(11)
    config = dataclasses.replace(ctc_config, llm=str(tiny_untied_qwen3_dir), objective="ce", max_new_tokens=12)
    model = LLMCEModel(config, tokenizer=qwen3_tokenizer)
    perturb_lora(model)
    return model.eval()


def test_template_is_the_qwen3_chat_template_around_the_speech(ce_model, qwen3_tokenizer):
    before = qwen3_tokenizer.decode(ce_model.template_before)
    after = qwen3_tokenizer.decode(ce_model.template_after)
    assert before == "<|im_start|>user\nTranscribe the speech."
    assert after.startswith("<|im_end|>\n<|im_start|>assistant\n")
    assert ce_model.eos_id == qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_loss_equals_cross_entropy_of_the_full_sequence(ce_model):
    features, lengths = random_features([100, 70], seed=12)
    targets = ce_model.encode_texts(["hello world", "yes"])
    with torch.no_grad():
        loss, stats = ce_model.loss(features, lengths, targets)
        speech, speech_lens = ce_model.speech_embeddings(features, lengths)
        before, after = ce_model.template_embeddings()
        expected = torch.zeros((), dtype=torch.float64)
        for n, target in enumerate(targets):
            ids = torch.tensor(target)
            sequence = torch.cat([before, speech[n, :speech_lens[n]], after, ce_model.embed_tokens(ids)])
            total = sequence.shape[0]
            hidden = states_of_one_sequence(ce_model.llm, sequence)
            log_probs = ce_model.head_logits(hidden).double().log_softmax(-1)  # every position
            labels = target + [ce_model.eos_id]
            first = total - len(target) - 1
            expected -= sum(log_probs[first + i, label] for i, label in enumerate(labels))
    assert stats["tokens"] == len(targets[0]) + len(targets[1]) + 2
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-4)


def test_loss_trains_lora_and_projector_only(ce_model):
    features, lengths = random_features([80], seed=13)
    ce_model.zero_grad(set_to_none=True)
    loss, _ = ce_model.loss(features, lengths, ce_model.encode_texts(["ok"]))
    loss.backward()
    with_grad = {name for name, p in ce_model.named_parameters() if p.grad is not None}
    assert with_grad == {name for name, p in ce_model.named_parameters() if p.requires_grad}
    assert any("lora_" in name for name in with_grad) and any(n.startswith("projector.") for n in with_grad)
    assert all("lora_" in name or name.startswith("projector.") for name in with_grad)
    ce_model.zero_grad(set_to_none=True)


def test_greedy_with_and_without_kv_cache_gives_the_same_tokens(ce_model):
    features, lengths = random_features([90, 60], seed=14)
    cached = ce_model.generate_ids(features, lengths, use_cache=True)
    uncached = ce_model.generate_ids(features, lengths, use_cache=False)
    assert cached == uncached
    assert all(len(tokens) == ce_model.config.max_new_tokens for tokens in cached)  # no EOS in 12 steps


def test_greedy_stops_at_eos(ce_model):
    features, lengths = random_features([90], seed=14)
    tokens = ce_model.generate_ids(features, lengths)[0]
    stop = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    saved = ce_model.eos_id
    ce_model.eos_id = tokens[stop]
    try:
        assert ce_model.generate_ids(features, lengths)[0] == tokens[:stop]
        assert ce_model.generate_ids(features, lengths, beam=1)[0] == tokens[:stop]
    finally:
        ce_model.eos_id = saved


def test_beam_one_equals_greedy(ce_model):
    features, lengths = random_features([90, 60], seed=15)
    assert ce_model.generate_ids(features, lengths, beam=1) == ce_model.generate_ids(features, lengths)


def test_beam_four_is_at_least_as_probable_as_greedy(ce_model):
    features, lengths = random_features([90], seed=16)

    def summed_log_prob(tokens):
        with torch.no_grad():
            speech, lens = ce_model.speech_embeddings(features, lengths)
            before, after = ce_model.template_embeddings()
            prefix = torch.cat([before, speech[0, :lens[0]], after])
            sequence = torch.cat([prefix, ce_model.embed_tokens(torch.tensor(tokens, dtype=torch.long))])
            hidden = states_of_one_sequence(ce_model.llm, sequence)
            log_probs = ce_model.head_logits(hidden).double().log_softmax(-1)
            return sum(log_probs[prefix.shape[0] - 1 + i, t].item() for i, t in enumerate(tokens))

    greedy = ce_model.generate_ids(features, lengths)[0]
    beam = ce_model.generate_ids(features, lengths, beam=4)[0]
    assert len(beam) == len(greedy) == ce_model.config.max_new_tokens
    assert summed_log_prob(beam) >= summed_log_prob(greedy) - 1e-6


def test_teacher_forcing_on_the_greedy_tokens_predicts_them(ce_model):
    # Training and generation must build the same sequence (template, speech, positions):
    # fed the greedy hypothesis, the loss's states choose each of its tokens again.
    features, lengths = random_features([90, 60], seed=17)
    greedy = ce_model.generate_ids(features, lengths)
    with torch.no_grad():
        states, labels = ce_model.teacher_forced_states(features, lengths, greedy)
        chosen = ce_model.head_logits(states).argmax(dim=-1)
    expected_labels = [token for tokens in greedy for token in tokens + [ce_model.eos_id]]
    assert labels.tolist() == expected_labels
    keep = torch.tensor([i < len(tokens) for tokens in greedy for i in range(len(tokens) + 1)])
    assert chosen[keep].tolist() == labels[keep].tolist()
