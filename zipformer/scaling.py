"""Building blocks of the Zipformer (paper Sections 3.2-3.5, facts 2.1-2.3).

Everything here is pure PyTorch. Tensors put channels on the last dimension unless a
``channel_dim`` argument says otherwise.

- :class:`ScheduledFloat`: a float that is piecewise linear in the training batch count.
- :class:`SwooshL` / :class:`SwooshR`: the activations, with backward passes that keep
  one byte per element instead of the input.
- :class:`BiasNorm`: the LayerNorm replacement.
- :class:`Balancer`, :class:`Whiten`: identity in the forward pass, gradient modifiers
  in the backward pass, active only in training.
- :func:`scaled_linear`, :func:`scaled_conv1d`, :func:`scaled_conv2d`: layers whose
  initial weights are scaled down by ``initial_scale``.
- :class:`ActivationDropoutAndLinear`: activation, dropout and a linear layer in one
  autograd node that saves only its input.
"""

from __future__ import annotations

import math
import random
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

FloatLike = Union[float, "ScheduledFloat"]


class ScheduledFloat(nn.Module):
    """A value that is piecewise linear in the batch count, constant outside the points.

    ``ScheduledFloat((0.0, 0.3), (20000.0, 0.1))`` is 0.3 at batch 0, 0.2 at batch
    10000 and 0.1 from batch 20000 on. ``float(x)`` gives ``default`` when the module
    is in eval mode or when no batch count has been set (facts 2.1); the training loop
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

    def extra_repr(self) -> str:
        return f"points={self.points}, default={self.default}, batch_count={self.batch_count}"


def set_batch_count(model: nn.Module, batch_count: float) -> None:
    """Set the batch count that drives every :class:`ScheduledFloat` inside ``model``.

    Training calls this every few batches with the duration-adjusted count
    ``batch_idx * max_duration * world_size / 600`` (facts 2.1).
    """
    for module in model.modules():
        if hasattr(module, "batch_count"):
            module.batch_count = float(batch_count)


def as_schedule(value: FloatLike) -> nn.Module:
    """Wrap a plain float into a constant :class:`ScheduledFloat` so modules store one kind."""
    if isinstance(value, ScheduledFloat):
        return value
    return ScheduledFloat((0.0, float(value)), default=float(value))


# ---------------------------------------------------------------------------------------
# Swoosh activations (paper eq. 5-6, facts 2.3).
SWOOSH_SLOPE = 0.08
SWOOSH_R_OFFSET = 0.313261687  # makes SwooshR(0) = 0
SWOOSH_L_OFFSET = 0.035
# The derivative sigmoid(x - shift) - 0.08 lies in (-0.08, 0.92): a range of width 1,
# so one byte stores it to within 1/510.
_DERIV_LEVELS = 255.0


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
        x32 = x.float()
        y = torch.nn.functional.softplus(x32 - shift) - SWOOSH_SLOPE * x32 - offset
        if x.requires_grad:
            deriv = torch.sigmoid(x32 - shift)  # derivative + 0.08, in (0, 1)
            ctx.save_for_backward((deriv * _DERIV_LEVELS).round_().to(torch.uint8))
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
class BiasNorm(nn.Module):
    """BiasNorm(x)_c = x_c exp(gamma) / sqrt(mean_j (x_j - b_j)^2)  (paper eq. 4, facts 2.3).

    ``b`` is a learned per-channel bias, ``gamma`` a learned scalar log-scale kept in
    [-1.5, 1.5] while training. Shapes: (..., C) -> (..., C) for ``channel_dim=-1``.
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
        log_scale = self.log_scale
        if self.training:
            log_scale = log_scale.clamp(-self.log_scale_limit, self.log_scale_limit)
        mean_square = ((x - bias) ** 2).mean(dim=channel_dim, keepdim=True)
        return x * (torch.rsqrt(mean_square) * log_scale.exp())


# ---------------------------------------------------------------------------------------
def _move_channels_last(x: Tensor, channel_dim: int) -> Tensor:
    return x.movedim(channel_dim, -1).reshape(-1, x.shape[channel_dim])


class _BalancerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, channel_dim: int, bounds: Tuple[float, float, float, float],
                grad_scale: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.channel_dim, ctx.bounds, ctx.grad_scale = channel_dim, bounds, grad_scale
        return x

    @staticmethod
    def backward(ctx, x_grad: Tensor):
        (x,) = ctx.saved_tensors
        min_mean_ratio, max_mean_ratio, min_rms, max_rms = ctx.bounds
        with torch.enable_grad():
            x_detached = x.detach().float().requires_grad_(True)
            flat = _move_channels_last(x_detached, ctx.channel_dim)
            mean = flat.mean(dim=0)
            rms = (flat ** 2).mean(dim=0).clamp(min=1e-20).sqrt()
            std = (rms ** 2 - mean ** 2).clamp(min=1e-20).sqrt()
            mean_ratio = mean / std
            # Hinge penalties on the per-channel statistics; only their gradient matters.
            penalty = ((min_mean_ratio - mean_ratio).relu() + (mean_ratio - max_mean_ratio).relu()
                       + (math.log(min_rms) - rms.log()).relu()
                       + (rms.log() - math.log(max_rms)).relu()).sum()
            if penalty.item() == 0.0:
                return x_grad, None, None, None
            (penalty_grad,) = torch.autograd.grad(penalty, x_detached)
        penalty_grad = penalty_grad / (penalty_grad.pow(2).mean().sqrt() + 1e-20)
        extra = penalty_grad * (ctx.grad_scale * x_grad.float().abs())
        return (x_grad.float() + extra).to(x_grad.dtype), None, None, None


class Balancer(nn.Module):
    """Identity forward; backward nudges per-channel statistics into ranges (paper 3.5).

    Constraints: fraction of positive values in [min_positive, max_positive] (turned into
    bounds on mean/stddev via the normal quantile) and RMS in [min_abs, max_abs] x 1.2533
    (mean |x| to RMS for a normal variable). The extra gradient has, element by element,
    about ``grad_scale`` times the magnitude of the incoming gradient. Applied in training
    with probability ``prob`` (default 0.5 -> 0.125 over 8000 batches, facts 2.1).
    """

    def __init__(self, num_channels: int, channel_dim: int = -1,
                 min_positive: FloatLike = 0.05, max_positive: FloatLike = 0.95,
                 min_abs: FloatLike = 0.2, max_abs: FloatLike = 100.0,
                 grad_scale: FloatLike = 0.04, prob: Optional[FloatLike] = None) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.channel_dim = channel_dim
        self.min_positive = as_schedule(min_positive)
        self.max_positive = as_schedule(max_positive)
        self.min_abs = as_schedule(min_abs)
        self.max_abs = as_schedule(max_abs)
        self.grad_scale = as_schedule(grad_scale)
        self.prob = as_schedule(prob) if prob is not None else ScheduledFloat(
            (0.0, 0.5), (8000.0, 0.125), default=0.4)

    def _bounds(self) -> Tuple[float, float, float, float]:
        def quantile(p: float) -> float:
            p = min(max(p, 1e-6), 1.0 - 1e-6)
            return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))
        rms_per_abs = math.sqrt(math.pi / 2.0)  # 1.2533
        return (quantile(float(self.min_positive)), quantile(float(self.max_positive)),
                max(float(self.min_abs), 1e-10) * rms_per_abs,
                float(self.max_abs) * rms_per_abs)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not x.requires_grad or torch.jit.is_scripting():
            return x
        if random.random() >= float(self.prob):
            return x
        return _BalancerFunction.apply(x, self.channel_dim, self._bounds(),
                                       float(self.grad_scale))


def whitening_metric(x: Tensor, num_groups: int) -> Tensor:
    """Mean squared eigenvalue over squared mean eigenvalue of the centred covariance.

    x: (frames, C). The channels split into ``num_groups`` groups; the metric is averaged
    over groups. It is 1 when the covariance is a multiple of the identity (facts 2.1).
    """
    frames, channels = x.shape
    group = channels // num_groups
    x = x.reshape(frames, num_groups, group).transpose(0, 1)  # (G, frames, C/G)
    x = x - x.mean(dim=1, keepdim=True)
    covariance = torch.matmul(x.transpose(1, 2), x) / frames  # (G, C/G, C/G)
    trace = covariance.diagonal(dim1=1, dim2=2).sum(dim=1)
    trace_of_square = (covariance ** 2).sum(dim=(1, 2))
    return (group * trace_of_square / (trace ** 2 + 1e-20)).mean()


class _WhitenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, module: "Whiten") -> Tensor:
        ctx.save_for_backward(x)
        ctx.module = module
        return x

    @staticmethod
    def backward(ctx, x_grad: Tensor):
        (x,) = ctx.saved_tensors
        module: Whiten = ctx.module
        with torch.enable_grad():
            x_detached = x.detach().float().requires_grad_(True)
            metric = whitening_metric(x_detached.reshape(-1, x.shape[-1]), module.num_groups)
            excess = (metric - float(module.whitening_limit)).relu()
            module.metric_exceeded = bool(excess.item() > 0.0)
            if not module.metric_exceeded:
                return x_grad, None
            (metric_grad,) = torch.autograd.grad(excess, x_detached)
        scale = float(module.grad_scale) * x_grad.float().norm() / (metric_grad.norm() + 1e-20)
        return (x_grad.float() + metric_grad * scale).to(x_grad.dtype), None


class Whiten(nn.Module):
    """Identity forward; backward pushes the channel covariance towards white (paper 3.5).

    When :func:`whitening_metric` exceeds ``whitening_limit``, adds the metric's gradient
    rescaled to ``grad_scale`` times the norm of the incoming gradient. Runs with
    probability ``prob[1]`` after the metric last exceeded the limit, else ``prob[0]``.
    x: (..., C).
    """

    def __init__(self, num_groups: int, whitening_limit: FloatLike,
                 prob: Tuple[float, float] = (0.025, 0.25), grad_scale: FloatLike = 0.01) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.whitening_limit = as_schedule(whitening_limit)
        self.min_prob, self.max_prob = prob
        self.grad_scale = as_schedule(grad_scale)
        self.metric_exceeded = True

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not x.requires_grad or torch.jit.is_scripting():
            return x
        prob = self.max_prob if self.metric_exceeded else self.min_prob
        if random.random() >= prob:
            return x
        return _WhitenFunction.apply(x, self)


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
    in +-0.1 x initial_scale (facts 2.1: output projections start small, 0.01-0.1)."""
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
        hidden = _ACTIVATIONS[activation](x)
        if mask is not None:
            hidden = hidden * mask
        ctx.save_for_backward(x, weight, mask)
        ctx.activation, ctx.has_bias = activation, bias is not None
        return torch.nn.functional.linear(hidden, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, mask = ctx.saved_tensors
        with torch.enable_grad():
            x_detached = x.detach().requires_grad_(True)
            activated = _ACTIVATIONS[ctx.activation](x_detached)
        hidden = activated.detach() if mask is None else activated.detach() * mask
        grad_out_2d = grad_out.reshape(-1, grad_out.shape[-1])
        grad_weight = grad_out_2d.t().matmul(hidden.reshape(-1, hidden.shape[-1]).to(grad_out.dtype))
        grad_bias = grad_out_2d.sum(dim=0) if ctx.has_bias else None
        grad_hidden = grad_out.matmul(weight.to(grad_out.dtype))
        if mask is not None:
            grad_hidden = grad_hidden * mask
        (grad_x,) = torch.autograd.grad(activated, x_detached, grad_hidden.to(activated.dtype))
        return grad_x, grad_weight.to(weight.dtype), (
            grad_bias.to(weight.dtype) if grad_bias is not None else None), None, None


_ACTIVATIONS = {"SwooshL": swoosh_l_reference, "SwooshR": swoosh_r_reference}


class ActivationDropoutAndLinear(nn.Module):
    """Activation (SwooshL or SwooshR), dropout, then a linear layer, in one autograd node.

    The dropout mask is shared along ``shared_dim`` (time, facts 2.1). Only the input is
    saved for backward, so a (frames, hidden) activation is never kept.
    x: (N, T, in_features) -> (N, T, out_features).
    """

    def __init__(self, in_features: int, out_features: int, activation: str = "SwooshL",
                 dropout_p: FloatLike = 0.0, shared_dim: Optional[int] = 1,
                 initial_scale: float = 1.0, bias: bool = True) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {sorted(_ACTIVATIONS)}")
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


class _ScaleGradFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad * ctx.scale, None


class ScaleGrad(nn.Module):
    """Identity forward; multiplies the gradient by ``scale`` (Conv2dSubsampling, facts 1.2)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not x.requires_grad:
            return x
        return _ScaleGradFunction.apply(x, self.scale)


def sequence_keep_mask(batch_size: int, drop_rate: float, device: torch.device,
                       dtype: torch.dtype) -> Tensor:
    """(N, 1, 1) mask: 0 for whole utterances dropped with probability ``drop_rate``."""
    return (torch.rand(batch_size, 1, 1, device=device) >= drop_rate).to(dtype)
