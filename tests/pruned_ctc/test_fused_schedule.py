"""The three-product schedule of reductions "sum" and "mean" against the dense FP64
reference, its exclusions, the frozen head and its count of head products."""

import pytest
import torch

from pruned_ctc import ExcludedUtteranceWarning, pruned_ctc_loss
from references.ctc_reference import dense_reference, relative_error
from references.head_batches import make_batch
from references.product_counter import ProductCounter


def gradients_of(loss_function_call, encoder_out, weight, bias, frozen=False):
    x = encoder_out.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(not frozen)
    b = bias.clone().requires_grad_(True)
    loss = loss_function_call(x, w, b)
    loss.backward()
    return loss.detach(), x.grad, w.grad, b.grad


def reference_for(reduction, encoder_out, weight, bias, targets, lengths):
    losses, *grads = dense_reference(encoder_out, weight, bias, targets, lengths)
    if reduction == "sum":
        return [losses.sum()] + grads
    tokens = sum(len(t) for t in targets)
    return [losses.sum() / tokens] + [g / tokens for g in grads]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("beam", [None, 100.0])
@pytest.mark.parametrize("chunk_size", [7, 64, 4096])
def test_scalar_reductions_match_the_dense_float64_reference(reduction, beam, chunk_size):
    encoder_out, weight, bias, targets, lengths = make_batch()
    result = gradients_of(lambda x, w, b: pruned_ctc_loss(
        x, w, b, targets, lengths, reduction=reduction, beam=beam, chunk_size=chunk_size),
        encoder_out, weight, bias)
    expected = reference_for(reduction, encoder_out, weight, bias, targets, lengths)
    for value, reference in zip(result, expected):
        assert relative_error(value, reference) < 1e-11


def test_float32_agrees_with_the_deferred_schedule():
    encoder_out, weight, bias, targets, lengths = make_batch(dtype=torch.float32, seed=1)
    fused = gradients_of(lambda x, w, b: pruned_ctc_loss(x, w, b, targets, lengths),
                         encoder_out, weight, bias)
    deferred = gradients_of(lambda x, w, b: pruned_ctc_loss(
        x, w, b, targets, lengths, reduction="none").sum(), encoder_out, weight, bias)
    torch.testing.assert_close(fused[0], deferred[0], rtol=1e-6, atol=0)
    for value, reference in zip(fused[1:], deferred[1:]):
        assert relative_error(value, reference) < 1e-6


def test_incoming_gradient_scales_every_gradient():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=2)
    once = gradients_of(lambda x, w, b: pruned_ctc_loss(x, w, b, targets, lengths),
                        encoder_out, weight, bias)
    scaled = gradients_of(lambda x, w, b: -2.5 * pruned_ctc_loss(x, w, b, targets, lengths),
                          encoder_out, weight, bias)
    for value, reference in zip(scaled[1:], once[1:]):
        torch.testing.assert_close(value, -2.5 * reference, rtol=1e-14, atol=0)


def test_a_second_backward_is_refused_with_a_clear_error():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=3)
    x = encoder_out.clone().requires_grad_(True)
    loss = pruned_ctc_loss(x, weight, bias, targets, lengths)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="reduction='none'"):
        loss.backward()


@pytest.mark.filterwarnings("ignore::pruned_ctc.ExcludedUtteranceWarning")
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("beam", [None, 100.0])
def test_an_utterance_the_dp_excludes_leaves_exactly_the_others_gradients(reduction, beam):
    encoder_out, weight, bias, targets, lengths = make_batch(seed=4)
    # Class 99 can never be emitted: utterance 1's lattice is empty, though it is
    # alignable and its frames are finite (the pass weighted it before the DP).
    bias[99] = float("-inf")
    with pytest.warns(ExcludedUtteranceWarning):
        result = gradients_of(lambda x, w, b: pruned_ctc_loss(
            x, w, b, targets, lengths, reduction=reduction, beam=beam), encoder_out, weight,
            bias)
    keep = [0, 2, 3]
    # For the reference (torch's CTC gives nan with -inf inputs) a bias of -1e4 is the same
    # head: exp(-1e4) is 0 in FP64.
    finite_bias = bias.clone()
    finite_bias[99] = -1e4
    expected = reference_for(reduction, encoder_out[keep], weight, finite_bias,
                             [targets[i] for i in keep], [lengths[i] for i in keep])
    assert result[1][1].abs().max() == 0
    assert relative_error(result[0], expected[0]) < 1e-12
    assert relative_error(result[1][keep], expected[1]) < 1e-11
    for value, reference in zip(result[2:], expected[2:]):
        assert relative_error(value, reference) < 1e-11


def test_frozen_head_gets_no_weight_gradient_and_exact_input_and_bias_gradients():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=5)
    loss, grad_input, grad_weight, grad_bias = gradients_of(
        lambda x, w, b: pruned_ctc_loss(x, w, b, targets, lengths), encoder_out, weight,
        bias, frozen=True)
    expected = reference_for("sum", encoder_out, weight, bias, targets, lengths)
    assert grad_weight is None
    assert relative_error(grad_input, expected[1]) < 1e-11
    assert relative_error(grad_bias, expected[3]) < 1e-11


@pytest.mark.parametrize("frozen,expected_products", [(False, 3), (True, 2)])
def test_head_products_three_trainable_two_frozen(frozen, expected_products):
    encoder_out, weight, bias, targets, lengths = make_batch(vocab_size=2000, dim=32,
                                                             dtype=torch.float32)
    x = encoder_out.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(not frozen)
    with ProductCounter() as counter:
        pruned_ctc_loss(x, w, bias, targets, lengths, chunk_size=256).backward()
    one_product = sum(lengths) * weight.shape[0] * weight.shape[1]
    # The K = 9 selected columns add (M, K, D) products: under 1% of one here.
    assert expected_products <= counter.multiply_adds / one_product < expected_products + 0.03
