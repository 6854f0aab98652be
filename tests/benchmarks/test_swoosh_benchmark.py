"""benchmarks.swoosh compares what it says: inside ``plain_formula()`` every Swoosh of the
stage-10 encoder (its SwooshL/R modules and the activations of its feed-forward layers)
computes the plain formula, outside none does, and the encoder's output and gradients
agree either way (the same function, summed in another order)."""

import contextlib
import random
from pathlib import Path
from unittest import mock

import torch

from asr.chunk_windows import encode_windows
from asr.config import load_run_config
from asr.family import load_family
from benchmarks.support import batch_windows
from benchmarks.swoosh.__main__ import plain_formula, plain_swoosh
from zipformer import scaling

CONFIG = Path(__file__).resolve().parents[2] / "egs/mini/conf/train_streaming.yaml"


def swoosh_applications(encoder: torch.nn.Module) -> int:
    """Modules whose forward applies a Swoosh once: SwooshL/R and ActivationDropoutAndLinear."""
    kinds = (scaling.SwooshL, scaling.SwooshR, scaling.ActivationDropoutAndLinear)
    return sum(isinstance(module, kinds) for module in encoder.modules())


def test_plain_formula_reaches_every_swoosh_of_the_encoder_and_changes_nothing_else():
    torch.manual_seed(0)
    config = load_run_config(CONFIG)
    encoder = load_family(config.family).build_model(config.model, 500, 0).train().encoder
    windows = batch_windows("sentences", 6.0, 2, random.Random(0))
    results = {}
    for name in ("logaddexp", "plain"):
        calls = []

        def counted(x, shift, offset, calls=calls):
            calls.append(shift)
            return plain_swoosh(x, shift, offset)

        encoder.zero_grad()
        torch.manual_seed(1), random.seed(1)  # the balancers draw from both
        with mock.patch("benchmarks.swoosh.__main__.plain_swoosh", counted):
            context = plain_formula() if name == "plain" else contextlib.nullcontext()
            with context:
                outputs = encode_windows(encoder, windows)
                sum(output.square().mean() for output in outputs).backward()
        results[name] = (torch.cat(outputs), [p.grad.clone() for p in encoder.parameters() if p.grad is not None],
                         len(calls))
    applications = swoosh_applications(encoder)
    assert applications >= 10
    # Forward: each module at least once per encoder call; backward recomputes the
    # feed-forward layers' activations.
    assert results["plain"][2] >= applications and results["logaddexp"][2] == 0
    assert scaling.swoosh_value is not plain_swoosh
    torch.testing.assert_close(results["plain"][0], results["logaddexp"][0], rtol=1e-4, atol=1e-5)
    for plain, fused in zip(results["plain"][1], results["logaddexp"][1]):
        torch.testing.assert_close(plain, fused, rtol=1e-3, atol=2e-5)
