"""bfloat16 / float16 inputs, autocast regions and the dtypes of gradients."""

import pytest
import torch

from pruned_ctc import pruned_ctc_loss, standard_ctc_loss
from references.ctc_reference import dense_reference, relative_error


def make_inputs(dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    encoder_out = torch.randn(3, 20, 32, generator=generator)
    weight = torch.randn(300, 32, generator=generator) / 32 ** 0.5
    bias = torch.randn(300, generator=generator) * 0.1
    targets = [[5, 9, 9, 120], [7, 250], [44]]
    return encoder_out.to(dtype), weight.to(dtype), bias.to(dtype), targets, [20, 15, 11]


def gradients(dtype, **options):
    encoder_out, weight, bias, targets, lengths = make_inputs(dtype)
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    loss = pruned_ctc_loss(*tensors, targets, lengths, **options)
    loss.backward()
    return loss.detach(), [t.grad for t in tensors]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_track_float32_with_matching_gradient_dtypes(dtype):
    loss_low, grads_low = gradients(dtype)
    # The float32 path fed the same (rounded) inputs is the right comparison.
    encoder_out, weight, bias, targets, lengths = make_inputs(dtype)
    reference = dense_reference(encoder_out.float(), weight.float(), bias.float(), targets,
                                lengths)
    for grad in grads_low:
        assert grad.dtype == dtype
    assert relative_error(loss_low, reference[0].sum()) < 1e-6
    tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-3
    for grad, expected in zip(grads_low, reference[1:]):
        assert relative_error(grad, expected) < tolerance


def test_inside_autocast_the_loss_keeps_its_own_precision():
    encoder_out, weight, bias, targets, lengths = make_inputs(torch.float32)
    plain = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        inside = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths)
        standard_inside = standard_ctc_loss(encoder_out, weight, bias, targets, lengths)
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, plain, rtol=0, atol=0)
    torch.testing.assert_close(standard_inside, plain, rtol=1e-6, atol=0)


def test_standard_baseline_matches_reference_and_pruned():
    encoder_out, weight, bias, targets, lengths = make_inputs(torch.float64, seed=3)
    reference = dense_reference(encoder_out, weight, bias, targets, lengths)
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    losses = standard_ctc_loss(*tensors, targets, lengths, reduction="none")
    losses.sum().backward()
    torch.testing.assert_close(losses, reference[0], rtol=1e-12, atol=0)
    for tensor, expected in zip(tensors, reference[1:]):
        torch.testing.assert_close(tensor.grad, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_backward_inside_autocast_gives_the_gradients_of_outside(reduction):
    encoder_out, weight, bias, targets, lengths = make_inputs(torch.float32, seed=4)

    def run():
        tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
        loss = pruned_ctc_loss(*tensors, targets, lengths, reduction=reduction, chunk_size=64)
        loss.sum().backward()
        return [loss.detach()] + [t.grad for t in tensors]

    outside = run()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        inside = run()
    for value, expected in zip(inside, outside):
        assert value.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
