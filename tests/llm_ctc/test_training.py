"""End to end: AdamW steps on two utterances lower each model's loss quickly and, given
enough steps (slow), make it reproduce their transcripts: every gradient path, from the
loss to LoRA, projector, q and eta, works."""

import dataclasses

import pytest
import torch

from llm_ctc import build_model
from llm_ctc.decoding import recognize
from references.tiny_llm import random_features

TEXTS = ["Hello world", "good morning"]


def train(objective, steps, ctc_config, tokenizer):
    torch.manual_seed(51)
    config = dataclasses.replace(ctc_config, objective=objective, projector_hidden=64, lora_rank=8, lora_alpha=8,
                                 max_new_tokens=10)
    model = build_model(config, tokenizer=tokenizer).train()
    features, lengths = random_features([100, 90], seed=52)
    targets = model.encode_texts(TEXTS)
    optimizer = torch.optim.AdamW(model.parameter_groups(weight_decay=0.0), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss, _ = model.loss(features, lengths, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model.eval(), features, lengths, losses


@pytest.mark.parametrize("objective", ["ctc", "ce"])
def test_loss_falls_quickly(objective, ctc_config, qwen3_tokenizer):
    _, _, _, losses = train(objective, 20, ctc_config, qwen3_tokenizer)
    assert losses[-1] < losses[0] / 3


@pytest.mark.slow
@pytest.mark.parametrize("objective, steps", [("ctc", 150), ("ce", 120)])
def test_two_utterances_are_learned(objective, steps, ctc_config, qwen3_tokenizer):
    model, features, lengths, losses = train(objective, steps, ctc_config, qwen3_tokenizer)
    if objective == "ctc":
        _, texts = recognize(model, features, lengths, method="ctc-prefix-beam-search", beam=4)
    else:
        texts = [model.decode_ids(ids) for ids in model.generate_ids(features, lengths, beam=4)]
    assert texts == [text.lower() for text in TEXTS]
