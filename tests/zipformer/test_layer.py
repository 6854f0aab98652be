"""The convolution module's depthwise convolution over time (zipformer/layer.py)."""

import pytest
import torch

from zipformer.layer import depthwise_conv_time_major


@pytest.mark.parametrize("kernel_size", [3, 15, 31])
def test_depthwise_conv_time_major_equals_conv1d_and_its_gradients(kernel_size):
    torch.manual_seed(kernel_size)
    channels = 12
    conv = torch.nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2,
                           groups=channels).double()
    x = torch.randn(3, 40, channels, dtype=torch.float64, requires_grad=True)
    reference = conv(x.transpose(1, 2)).transpose(1, 2)
    upstream = torch.randn_like(reference)
    expected = torch.autograd.grad(reference, (x, conv.weight, conv.bias), upstream)

    out = depthwise_conv_time_major(conv, x)
    got = torch.autograd.grad(out, (x, conv.weight, conv.bias), upstream)

    assert out.shape == reference.shape and out.is_contiguous()
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_depthwise_conv_time_major_takes_a_non_contiguous_input():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(8, 8, 5, padding=2, groups=8).double()
    x = torch.randn(20, 2, 8, dtype=torch.float64).transpose(0, 1)  # (2, 20, 8), strided
    reference = conv(x.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(depthwise_conv_time_major(conv, x), reference, rtol=1e-12, atol=1e-12)


def test_depthwise_conv_time_major_weight_gradient_has_the_parameters_strides():
    # DDP's gradient layout contract: a gradient whose strides differ from the parameter's
    # (even on its size-1 dimension) is copied into the bucket, with a warning.
    conv = torch.nn.Conv1d(8, 8, 5, padding=2, groups=8)
    depthwise_conv_time_major(conv, torch.randn(2, 20, 8)).sum().backward()
    assert conv.weight.grad.stride() == conv.weight.stride()
    assert conv.bias.grad.stride() == conv.bias.stride()
