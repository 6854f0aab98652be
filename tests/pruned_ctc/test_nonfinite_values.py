"""Values a head meets outside finite, valid frames, for both losses: NaN or inf in the
padding beyond encoder_out_lens, and -inf logits (a class masked by its bias)."""

import pytest
import torch

from pruned_ctc import ExcludedUtteranceWarning, pruned_ctc_loss, standard_ctc_loss
from references.ctc_reference import relative_error
from references.logit_reference import brute_force_logit_reference

BOTH_LOSSES = pytest.mark.parametrize("loss_function", [pruned_ctc_loss, standard_ctc_loss])
NEG_INF = float("-inf")


def head_batch(vocab_size=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    encoder_out = torch.randn(3, 8, 6, generator=generator)
    weight = torch.randn(vocab_size, 6, generator=generator)
    bias = torch.randn(vocab_size, generator=generator)
    return encoder_out, weight, bias


def losses_and_gradients(loss_function, encoder_out, weight, bias, targets, lengths):
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    losses = loss_function(*tensors, targets, lengths, beam=None, reduction="none")
    losses.sum().backward()
    return [losses.detach()] + [t.grad for t in tensors]


@BOTH_LOSSES
@pytest.mark.parametrize("fill", [float("nan"), float("inf"), NEG_INF, 3e38])
def test_padding_beyond_the_lengths_changes_nothing_and_gets_exactly_zero_gradient(
        loss_function, fill):
    encoder_out, weight, bias = head_batch()
    targets, lengths = [[1, 2, 3], [4, 4], [5]], [8, 5, 3]
    padded = encoder_out.clone()
    for n, frames in enumerate(lengths):
        padded[n, frames:] = fill
    clean = losses_and_gradients(loss_function, encoder_out, weight, bias, targets, lengths)
    dirty = losses_and_gradients(loss_function, padded, weight, bias, targets, lengths)
    for name, value, expected in zip(("losses", "dX", "dW", "db"), dirty, clean):
        assert torch.equal(value, expected), name
    for n, frames in enumerate(lengths):
        assert torch.equal(dirty[1][n, frames:], torch.zeros_like(dirty[1][n, frames:]))


def enumerated_reference(encoder_out, weight, bias, targets, lengths):
    """Losses and head gradients in float64 from enumeration over the logits (-inf kept)."""
    x, w, b = (t.double() for t in (encoder_out, weight, bias))
    logits = x @ w.t() + b
    losses, grad_logits = torch.zeros(len(targets), dtype=torch.float64), torch.zeros_like(logits)
    for n, (target, frames) in enumerate(zip(targets, lengths)):
        losses[n], grad_logits[n, :frames] = brute_force_logit_reference(logits[n, :frames],
                                                                         target, 0)
    flat_grad, flat_x = grad_logits.reshape(-1, w.shape[0]), x.reshape(-1, x.shape[2])
    return losses, grad_logits @ w, flat_grad.t() @ flat_x, flat_grad.sum(0)


@BOTH_LOSSES
@pytest.mark.parametrize("masked_class, targets", [
    (3, [[1, 2], [2], [1]]),        # a class no target uses
    (0, [[1, 2, 1], [2, 1], [1]]),  # blank: only alignments without blanks remain
])
def test_minus_infinity_logits_give_the_enumerated_loss_and_finite_gradients(
        loss_function, masked_class, targets):
    encoder_out, weight, bias = head_batch(vocab_size=4, seed=1)
    encoder_out, lengths = encoder_out[:, :4], [4, 3, 2]
    bias[masked_class] = NEG_INF
    result = losses_and_gradients(loss_function, encoder_out, weight, bias, targets, lengths)
    expected = enumerated_reference(encoder_out, weight, bias, targets, lengths)
    for name, value, reference in zip(("losses", "dX", "dW", "db"), result, expected):
        assert bool(torch.isfinite(value).all()), name
        assert relative_error(value, reference) <= 1e-5, name
    assert result[3][masked_class].item() == 0.0  # a class of probability 0 everywhere


@BOTH_LOSSES
def test_a_target_class_masked_by_minus_infinity_excludes_its_utterance(loss_function):
    encoder_out, weight, bias = head_batch(seed=2)
    bias[6] = NEG_INF
    targets, lengths = [[1, 6, 2], [4, 4], [5]], [8, 5, 3]
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    with pytest.warns(ExcludedUtteranceWarning, match="nonfinite loss: 1"):
        losses, stats = loss_function(*tensors, targets, lengths, beam=None, reduction="none",
                                      return_stats=True)
    assert stats.excluded.tolist() == [True, False, False] and losses[0].item() == 0.0
    losses.sum().backward()
    assert torch.equal(tensors[0].grad[0], torch.zeros(8, 6))
    others = losses_and_gradients(loss_function, encoder_out[1:], weight, bias, targets[1:],
                                  lengths[1:])
    torch.testing.assert_close(losses[1:].detach(), others[0])
    for tensor, expected in zip(tensors[1:], others[2:]):
        assert bool(torch.isfinite(tensor.grad).all())
        torch.testing.assert_close(tensor.grad, expected)
