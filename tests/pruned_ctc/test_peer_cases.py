"""Both losses on the test cases of TensorFlow, warp-ctc, k2, optax, MXNet, flashlight and
PyTorch (tests/references/peer_ctc_cases.py): the peers' published numbers within the
peers' tolerances, float64 references, and gradients that are finite and exactly zero
wherever nothing contributes (frames beyond the lengths, excluded utterances)."""

import functools
import warnings

import pytest
import torch

from pruned_ctc import ExcludedUtteranceWarning, pruned_ctc_loss, standard_ctc_loss
from references.ctc_reference import relative_error
from references.logit_reference import (brute_force_logit_reference, head_for_logits,
                                        logit_reference)
from references.peer_ctc_cases import peer_cases

CASES = {case.name: case for case in peer_cases()}
LOSS_FUNCTIONS = {"pruned": pruned_ctc_loss, "standard": standard_ctc_loss}
# The repository's FP32 tolerances against an FP64 reference (relative Frobenius norms).
LOSS_TOLERANCE, GRADIENT_TOLERANCE = 1e-6, 1e-5


def names(with_field=None):
    return [name for name, case in CASES.items()
            if with_field is None or getattr(case, with_field) is not None]


@functools.cache
def run(function_name, case_name):
    """(losses, d(sum_n w_n L_n)/d logits (N, T, V), weight gradient, stats)."""
    case = CASES[case_name]
    encoder_out, weight = head_for_logits(case.logits)
    encoder_out.requires_grad_(True)
    weight.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExcludedUtteranceWarning)
        losses, stats = LOSS_FUNCTIONS[function_name](
            encoder_out, weight, None, case.targets, case.frame_counts, blank_id=case.blank_id,
            beam=None, reduction="none", return_stats=True)
    weights = torch.tensor(case.weights or [1.0] * len(case.targets))
    (losses * weights).sum().backward()
    return losses.detach(), encoder_out.grad[..., :case.logits.shape[2]], weight.grad, stats


def reference(case):
    """float64 losses and logit gradient, 0 for excluded utterances: torch's CTC over the
    full vocabulary, or enumeration where valid frames hold -inf logits."""
    excluded = case.excluded or [False] * len(case.targets)
    weights = [0.0 if out else w for out, w in
               zip(excluded, case.weights or [1.0] * len(case.targets))]
    valid_logits = [case.logits[n, :frames] for n, frames in enumerate(case.frame_counts)]
    if not any(bool(torch.isneginf(logits).any()) for logits in valid_logits):
        losses, gradient = logit_reference(case.logits, case.targets, case.frame_counts,
                                           case.blank_id, weights)
        return losses.masked_fill(torch.tensor(excluded), 0.0), gradient
    losses = torch.zeros(len(case.targets), dtype=torch.float64)
    gradient = torch.zeros(case.logits.shape, dtype=torch.float64)
    for n, logits in enumerate(valid_logits):
        if not excluded[n]:
            loss, utterance_gradient = brute_force_logit_reference(logits, case.targets[n],
                                                                   case.blank_id)
            losses[n], gradient[n, :logits.shape[0]] = loss, weights[n] * utterance_gradient
    return losses, gradient


@pytest.mark.parametrize("case_name", names("expected_losses"))
@pytest.mark.parametrize("function_name", LOSS_FUNCTIONS)
def test_losses_meet_the_peers_published_values(function_name, case_name):
    case = CASES[case_name]
    losses = run(function_name, case_name)[0]
    rtol, atol = case.loss_tolerance
    torch.testing.assert_close(losses.double(), case.expected_losses.double(), rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("case_name", names("expected_gradient"))
@pytest.mark.parametrize("function_name", LOSS_FUNCTIONS)
def test_logit_gradients_meet_the_peers_published_values(function_name, case_name):
    case = CASES[case_name]
    gradient = run(function_name, case_name)[1]
    rtol, atol = case.gradient_tolerance
    torch.testing.assert_close(gradient.double(), case.expected_gradient.double(), rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("case_name", names())
@pytest.mark.parametrize("function_name", LOSS_FUNCTIONS)
def test_losses_and_logit_gradients_match_the_float64_reference(function_name, case_name):
    losses, gradient, _, _ = run(function_name, case_name)
    expected_losses, expected_gradient = reference(CASES[case_name])
    assert relative_error(losses, expected_losses) <= LOSS_TOLERANCE
    assert relative_error(gradient, expected_gradient) <= GRADIENT_TOLERANCE


@pytest.mark.parametrize("case_name", names())
@pytest.mark.parametrize("function_name", LOSS_FUNCTIONS)
def test_gradients_are_finite_and_exactly_zero_where_nothing_contributes(function_name,
                                                                         case_name):
    case = CASES[case_name]
    losses, gradient, weight_gradient, stats = run(function_name, case_name)
    excluded = case.excluded or [False] * len(case.targets)
    assert stats.excluded.tolist() == excluded
    assert bool(torch.isfinite(gradient).all()) and bool(torch.isfinite(weight_gradient).all())
    for n, frames in enumerate(case.frame_counts):
        silent = gradient[n] if excluded[n] else gradient[n, frames:]
        assert torch.equal(silent, torch.zeros_like(silent))
        assert not excluded[n] or losses[n].item() == 0.0
