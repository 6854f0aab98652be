"""Excluded utterances contribute zero loss and exactly zero gradient, and are counted."""

import math

import pytest
import torch

from pruned_ctc import ExcludedUtteranceWarning, PrunedCTCLoss, pruned_ctc_loss, standard_ctc_loss
from references.ctc_reference import dense_reference, relative_error

BOTH_LOSSES = pytest.mark.parametrize("loss_function", [pruned_ctc_loss, standard_ctc_loss])


@BOTH_LOSSES
def test_unalignable_utterance_is_excluded_and_counted(loss_function):
    generator = torch.Generator().manual_seed(0)
    encoder_out = torch.randn(3, 6, 8, generator=generator, requires_grad=True)
    weight = torch.randn(12, 8, generator=generator, requires_grad=True)
    bias = torch.zeros(12, requires_grad=True)
    # [5, 5, 5] needs 3 labels + 2 repeats = 5 frames; utterance 0 has 4.
    targets = [[5, 5, 5], [3, 4], [7]]
    with pytest.warns(ExcludedUtteranceWarning, match="1 of 3 utterances"):
        losses, stats = loss_function(encoder_out, weight, bias, targets, [4, 6, 5],
                                      reduction="none", return_stats=True)
    assert stats.num_not_alignable == 1 and stats.num_excluded == 1
    assert stats.excluded.tolist() == [True, False, False]
    assert losses[0].item() == 0.0
    losses.sum().backward()
    assert torch.equal(encoder_out.grad[0], torch.zeros(6, 8))
    reference = dense_reference(encoder_out, weight, bias, targets, [4, 6, 5])
    assert relative_error(losses, reference[0]) < 1e-6
    assert relative_error(weight.grad, reference[2]) < 1e-4


def test_exactly_enough_frames_is_alignable():
    encoder_out = torch.randn(1, 5, 4)
    loss, stats = pruned_ctc_loss(encoder_out, torch.randn(8, 4), None, [[5, 5, 5]], [5],
                                  return_stats=True)
    assert stats.num_excluded == 0 and math.isfinite(loss.item()) and loss.item() > 0


@BOTH_LOSSES
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_frames_are_excluded_without_poisoning_other_gradients(loss_function, value):
    generator = torch.Generator().manual_seed(1)
    data = torch.randn(2, 5, 6, generator=generator)
    data[0, 2, 1] = value
    encoder_out = data.clone().requires_grad_(True)
    weight = torch.randn(10, 6, generator=generator, requires_grad=True)
    bias = torch.randn(10, generator=generator, requires_grad=True)
    with pytest.warns(ExcludedUtteranceWarning, match="nonfinite loss: 1"):
        loss, stats = loss_function(encoder_out, weight, bias, [[1, 2], [3]], [5, 5],
                                    return_stats=True)
    assert stats.excluded.tolist() == [True, False]
    loss.backward()
    assert torch.equal(encoder_out.grad[0], torch.zeros(5, 6))
    for grad in (encoder_out.grad, weight.grad, bias.grad):
        assert torch.isfinite(grad).all()
    clean_weight = weight.detach().clone().requires_grad_(True)
    clean = loss_function(data[1:].clone(), clean_weight, bias.detach(), [[3]], [5])
    clean.backward()
    torch.testing.assert_close(loss.detach(), clean.detach())
    torch.testing.assert_close(weight.grad, clean_weight.grad)


def test_empty_targets_are_valid():
    encoder_out = torch.randn(2, 4, 5, dtype=torch.float64)
    weight = torch.randn(6, 5, dtype=torch.float64)
    losses, stats = pruned_ctc_loss(encoder_out, weight, None, [[], []], [4, 2],
                                    reduction="none", return_stats=True)
    assert stats.num_excluded == 0 and stats.num_selected_classes == 1
    blank_log_probs = (encoder_out @ weight.t()).log_softmax(-1)[..., 0]
    expected = torch.stack([-blank_log_probs[0, :4].sum(), -blank_log_probs[1, :2].sum()])
    torch.testing.assert_close(losses, expected, rtol=1e-12, atol=0)


def test_module_keeps_options_and_last_stats():
    module = PrunedCTCLoss(blank_id=2, chunk_size=3, beam=None, reduction="mean")
    encoder_out = torch.randn(2, 7, 4)
    weight = torch.randn(9, 4)
    loss = module(encoder_out, weight, None, [[1, 3], [4, 5, 6]], [7, 6])
    functional = pruned_ctc_loss(encoder_out, weight, None, [[1, 3], [4, 5, 6]], [7, 6],
                                 blank_id=2, chunk_size=3, beam=None, reduction="mean")
    torch.testing.assert_close(loss, functional)
    assert module.last_stats.num_selected_classes == 6
    assert "chunk_size=3" in repr(module)
