"""Building blocks of the Zipformer (Zipformer paper, Yao et al. 2024;
icefall's egs/librispeech/ASR/zipformer/scaling.py).

Everything here is pure PyTorch. Tensors put channels on the last dimension unless a
``channel_dim`` argument says otherwise.

- :class:`ScheduledFloat`: a float that is piecewise linear in the training batch count.
- :class:`SwooshL` / :class:`SwooshR`: the activations, with backward passes that keep
  one byte per element instead of the input.
- :class:`BiasNorm`: the LayerNorm replacement.
- Balancer, Whiten and ScaleGrad live in :mod:`zipformer.gradient_modifiers`.
- :func:`scaled_linear`, :func:`scaled_conv1d`, :func:`scaled_conv2d`: layers whose
  initial weights are scaled down by ``initial_scale``.
- :class:`ActivationDropoutAndLinear`: activation, dropout and a linear layer in one
  autograd node that saves only its input.
"""

from __future__ import annotations

import random
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

FloatLike = Union[float, "ScheduledFloat"]


class ScheduledFloat(nn.Module):
    """A value that is piecewise linear in the batch count, constant outside the points.

    ``ScheduledFloat((0.0, 0.3), (20000.0, 0.1))`` is 0.3 at batch 0, 0.2 at batch
    10000 and 0.1 from batch 20000 on. ``float(x)`` gives ``default`` when the module
    is in eval mode or when no batch count has been set (icefall's zipformer.py/scaling.py); the training loop
    sets counts with :func:`set_batch_count`. It is a parameter-free ``nn.Module`` so
    that ``model.train()``, ``model.eval()`` and ``model.modules()`` reach it.
    """

    def __init__(self, *points: Tuple[float, float], default: float = 0.0) -> None:
        super().__init__()
        if not points:
            raise ValueError("ScheduledFloat needs at least one (batch_count, value) point")
        xs = [float(p[0]) for p in points]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError(f"ScheduledFloat batch counts must increase, got {xs}")
        self.points = [(float(x), float(y)) for x, y in points]
        self.default = float(default)
        self.batch_count: Optional[float] = None

    def value_at(self, batch_count: float) -> float:
        """The schedule's value at ``batch_count``, whatever the mode."""
        points = self.points
        if batch_count <= points[0][0]:
            return points[0][1]
        if batch_count >= points[-1][0]:
            return points[-1][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if x0 <= batch_count <= x1:
                return y0 + (y1 - y0) * (batch_count - x0) / (x1 - x0)
        raise AssertionError("unreachable")

    def __float__(self) -> float:
        if self.batch_count is None or not self.training:
            return self.default
        return self.value_at(self.batch_count)

    def scaled(self, factor: float) -> "ScheduledFloat":
        """A new schedule with every value (and the default) multiplied by ``factor``."""
        return ScheduledFloat(*[(x, y * factor) for x, y in self.points],
                              default=self.default * factor)

    def extra_repr(self) -> str:
        return f"points={self.points}, default={self.default}, batch_count={self.batch_count}"


def set_batch_count(model: nn.Module, batch_count: float) -> None:
    """Set the batch count that drives every :class:`ScheduledFloat` inside ``model``.

    Training calls this every few batches with the duration-adjusted count
    ``batch_idx * max_duration * world_size / 600`` (icefall's zipformer.py/scaling.py).
    """
    for module in model.modules():
        if hasattr(module, "batch_count"):
            module.batch_count = float(batch_count)


def whitening_schedule(limit: float, ratio: float = 2.0) -> ScheduledFloat:
    """A whitening limit that grows from ``limit`` to ``ratio * limit`` over 20k batches
    (icefall's ``_whitening_schedule`` in egs/librispeech/ASR/zipformer/zipformer.py)."""
    return ScheduledFloat((0.0, limit), (20000.0, ratio * limit), default=limit)


def as_schedule(value: FloatLike) -> nn.Module:
    """Wrap a plain float into a constant :class:`ScheduledFloat` so modules store one kind."""
    if isinstance(value, ScheduledFloat):
        return value
    return ScheduledFloat((0.0, float(value)), default=float(value))


# ---------------------------------------------------------------------------------------
# Swoosh activations (Zipformer paper; icefall's egs/librispeech/ASR/zipformer/scaling.py).
SWOOSH_SLOPE = 0.08
SWOOSH_R_OFFSET = 0.313261687  # makes SwooshR(0) = 0
SWOOSH_L_OFFSET = 0.035
# The derivative sigmoid(x - shift) - 0.08 lies in (-0.08, 0.92): a range of width 1,
# so one byte stores it to within 1/510.
_DERIV_LEVELS = 255.0


_SWOOSH_SHIFTS = {"SwooshL": (4.0, SWOOSH_L_OFFSET), "SwooshR": (1.0, SWOOSH_R_OFFSET)}


def swoosh_value(x: Tensor, shift: float, offset: float) -> Tensor:
    """log(1 + e^(x - shift)) - 0.08 x - offset in three passes over x, one new tensor:
    the softplus of x - shift is logaddexp(x, shift) - shift (finite for any x, where
    e^(x - shift) overflows above 88 in float32), the rest in place. The plain formula
    (:func:`swoosh_l_reference`) takes five passes and five new tensors, and torch's CPU
    softplus is slow: this is half the time of a Zipformer's activations on a CPU.
    Differentiable (logaddexp's backward reads its inputs, not its output). A graph being
    exported (ONNX has no logaddexp) gets the plain formula, which ONNX's Softplus runs."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or getattr(
            torch.compiler, "is_exporting", torch.compiler.is_compiling)():
        return torch.nn.functional.softplus(x - shift) - SWOOSH_SLOPE * x - offset
    y = torch.logaddexp(x, torch.tensor(shift, dtype=x.dtype, device=x.device))
    return y.add_(x, alpha=-SWOOSH_SLOPE).sub_(shift + offset)


def swoosh_derivative(x: Tensor, shift: float) -> Tensor:
    """d/dx of :func:`swoosh_value`: sigmoid(x - shift) - 0.08, in (-0.08, 0.92)."""
    return torch.sub(x, shift).sigmoid_().sub_(SWOOSH_SLOPE)


def swoosh_l_reference(x: Tensor) -> Tensor:
    """SwooshL(x) = log(1 + e^(x-4)) - 0.08 x - 0.035, with plain autograd."""
    return torch.nn.functional.softplus(x - 4.0) - SWOOSH_SLOPE * x - SWOOSH_L_OFFSET


def swoosh_r_reference(x: Tensor) -> Tensor:
    """SwooshR(x) = log(1 + e^(x-1)) - 0.08 x - 0.313261687, with plain autograd."""
    return torch.nn.functional.softplus(x - 1.0) - SWOOSH_SLOPE * x - SWOOSH_R_OFFSET


class _SwooshFunction(torch.autograd.Function):
    """Swoosh with a one-byte derivative saved for backward instead of the input."""

    @staticmethod
    def forward(ctx, x: Tensor, shift: float, offset: float) -> Tensor:
        # Half precision is computed in float32; float64 stays float64 (so that float64
        # runs reproduce icefall's float64 outputs to rounding).
        x32 = x if x.dtype == torch.float64 else x.float()
        y = swoosh_value(x32, shift, offset)
        if x.requires_grad:
            deriv = torch.sub(x32, shift).sigmoid_()  # derivative + 0.08, in (0, 1)
            ctx.save_for_backward(deriv.mul_(_DERIV_LEVELS).round_().to(torch.uint8))
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (deriv_bytes,) = ctx.saved_tensors
        deriv = deriv_bytes.to(grad_out.dtype) * (1.0 / _DERIV_LEVELS) - SWOOSH_SLOPE
        return grad_out * deriv, None, None


def swoosh_l(x: Tensor) -> Tensor:
    return _SwooshFunction.apply(x, 4.0, SWOOSH_L_OFFSET)


def swoosh_r(x: Tensor) -> Tensor:
    return _SwooshFunction.apply(x, 1.0, SWOOSH_R_OFFSET)


class SwooshL(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return swoosh_l(x)


class SwooshR(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return swoosh_r(x)


# ---------------------------------------------------------------------------------------
class _LimitParamValueFunction(torch.autograd.Function):
    """Identity forward; backward turns gradients that would push an out-of-range element
    further out into gradients that pull it back (same magnitude, opposite sign)."""

    @staticmethod
    def forward(ctx, x: Tensor, low: float, high: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        # Gradient descent moves x against the gradient: below the range a positive
        # gradient would lower x further, above it a negative one would raise it.
        push_out = ((grad > 0) & (x < ctx.low)) | ((grad < 0) & (x > ctx.high))
        return torch.where(push_out, -grad, grad), None, None


def limit_param_value(x: Tensor, low: float, high: float, prob: float = 0.6,
                      training: bool = True) -> Tensor:
    """Keep a parameter in [low, high] through its gradient only (icefall's
    ``limit_param_value`` in egs/librispeech/ASR/zipformer/scaling.py).

    The forward pass uses ``x`` as it is, even out of range; in training, with
    probability ``prob`` per call, the backward pass flips the sign of each gradient
    element that would move an out-of-range element further out.
    """
    if low > high:
        raise ValueError(f"limit_param_value: low {low} > high {high}")
    if training and random.random() < prob:
        return _LimitParamValueFunction.apply(x, float(low), float(high))
    return x


class BiasNorm(nn.Module):
    """BiasNorm(x)_c = x_c exp(gamma) / sqrt(mean_j (x_j - b_j)^2) (icefall's zipformer.py/scaling.py).

    ``b`` is a learned per-channel bias, ``gamma`` a learned scalar log-scale. In
    training, :func:`limit_param_value` pulls gamma back into [-1.5, 1.5] through its
    gradient; the forward pass always uses gamma as it is (as icefall's BiasNorm).
    Shapes: (..., C) -> (..., C) for ``channel_dim=-1``.
    """

    def __init__(self, num_channels: int, channel_dim: int = -1,
                 log_scale_limit: float = 1.5) -> None:
        super().__init__()
        self.channel_dim = channel_dim
        self.log_scale_limit = log_scale_limit
        self.bias = nn.Parameter(torch.empty(num_channels).normal_(mean=0.0, std=1e-4))
        self.log_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: Tensor) -> Tensor:
        channel_dim = self.channel_dim % x.ndim
        bias = self.bias.view([-1] + [1] * (x.ndim - channel_dim - 1))
        log_scale = limit_param_value(self.log_scale, -self.log_scale_limit,
                                      self.log_scale_limit, training=self.training)
        mean_square = ((x - bias) ** 2).mean(dim=channel_dim, keepdim=True)
        return x * (torch.rsqrt(mean_square) * log_scale.exp())


# ---------------------------------------------------------------------------------------
def _scale_init(layer: nn.Module, initial_scale: float) -> nn.Module:
    with torch.no_grad():
        layer.weight.mul_(initial_scale)
        if getattr(layer, "bias", None) is not None:
            nn.init.uniform_(layer.bias, -0.1 * initial_scale, 0.1 * initial_scale)
    return layer


def scaled_linear(in_features: int, out_features: int, bias: bool = True,
                  initial_scale: float = 1.0) -> nn.Linear:
    """``nn.Linear`` with its default init multiplied by ``initial_scale``; bias uniform
    in +-0.1 x initial_scale (icefall's scaling.py: output projections start small, 0.01-0.1)."""
    return _scale_init(nn.Linear(in_features, out_features, bias=bias), initial_scale)


def scaled_conv1d(*args, initial_scale: float = 1.0, **kwargs) -> nn.Conv1d:
    return _scale_init(nn.Conv1d(*args, **kwargs), initial_scale)


def scaled_conv2d(*args, initial_scale: float = 1.0, **kwargs) -> nn.Conv2d:
    return _scale_init(nn.Conv2d(*args, **kwargs), initial_scale)


# ---------------------------------------------------------------------------------------
class _ActivationDropoutLinearFunction(torch.autograd.Function):
    """y = (act(x) * mask) W^T + b, saving x (not act(x)) and recomputing in backward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor],
                activation: str, mask: Optional[Tensor]) -> Tensor:
        hidden = swoosh_value(x, *_SWOOSH_SHIFTS[activation])
        if mask is not None:
            hidden = hidden.mul_(mask)
        ctx.save_for_backward(x, weight, mask)
        ctx.activation, ctx.has_bias = activation, bias is not None
        return torch.nn.functional.linear(hidden, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, mask = ctx.saved_tensors
        shift, offset = _SWOOSH_SHIFTS[ctx.activation]
        hidden = swoosh_value(x, shift, offset)
        if mask is not None:
            hidden = hidden.mul_(mask)
        grad_out_2d = grad_out.reshape(-1, grad_out.shape[-1])
        grad_weight = grad_out_2d.t().matmul(hidden.reshape(-1, hidden.shape[-1]).to(grad_out.dtype))
        del hidden
        grad_bias = grad_out_2d.sum(dim=0) if ctx.has_bias else None
        grad_hidden = grad_out.matmul(weight.to(grad_out.dtype)).to(x.dtype)
        if mask is not None:
            grad_hidden = grad_hidden.mul_(mask)
        grad_x = grad_hidden.mul_(swoosh_derivative(x, shift))
        return grad_x, grad_weight.to(weight.dtype), (
            grad_bias.to(weight.dtype) if grad_bias is not None else None), None, None




class ActivationDropoutAndLinear(nn.Module):
    """Activation (SwooshL or SwooshR), dropout, then a linear layer, in one autograd node.

    The dropout mask is shared along ``shared_dim`` (time, as icefall's Dropout3). Only the input is
    saved for backward, so a (frames, hidden) activation is never kept.
    x: (N, T, in_features) -> (N, T, out_features).
    """

    def __init__(self, in_features: int, out_features: int, activation: str = "SwooshL",
                 dropout_p: FloatLike = 0.0, shared_dim: Optional[int] = 1,
                 initial_scale: float = 1.0, bias: bool = True) -> None:
        super().__init__()
        if activation not in _SWOOSH_SHIFTS:
            raise ValueError(f"unknown activation {activation!r}; valid: {sorted(_SWOOSH_SHIFTS)}")
        linear = scaled_linear(in_features, out_features, bias=bias, initial_scale=initial_scale)
        self.weight, self.bias = linear.weight, linear.bias
        self.activation = activation
        self.dropout_p = as_schedule(dropout_p)
        self.shared_dim = shared_dim

    def forward(self, x: Tensor) -> Tensor:
        mask = None
        p = float(self.dropout_p)
        if self.training and p > 0.0:
            mask_shape = list(x.shape)
            if self.shared_dim is not None:
                mask_shape[self.shared_dim] = 1
            mask = (torch.rand(mask_shape, device=x.device) >= p).to(x.dtype) / (1.0 - p)
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
            mask = mask.to(dtype) if mask is not None else None
        with torch.autocast(x.device.type, enabled=False):
            return _ActivationDropoutLinearFunction.apply(x, weight, bias, self.activation, mask)


class Dropout3(nn.Module):
    """Dropout whose mask is shared along ``shared_dim`` (time): whole channels drop."""

    def __init__(self, p: FloatLike, shared_dim: int = 1) -> None:
        super().__init__()
        self.p = as_schedule(p)
        self.shared_dim = shared_dim

    def forward(self, x: Tensor) -> Tensor:
        p = float(self.p)
        if not self.training or p == 0.0:
            return x
        mask_shape = list(x.shape)
        mask_shape[self.shared_dim] = 1
        mask = (torch.rand(mask_shape, device=x.device) >= p).to(x.dtype)
        return x * mask / (1.0 - p)


def sequence_keep_mask(batch_size: int, drop_rate: float, device: torch.device,
                       dtype: torch.dtype) -> Tensor:
    """(N, 1, 1) mask: 0 for whole utterances dropped with probability ``drop_rate``."""
    return (torch.rand(batch_size, 1, 1, device=device) >= drop_rate).to(dtype)
