"""Gradient modifiers of the Zipformer (Zipformer paper; icefall's
egs/librispeech/ASR/zipformer/scaling.py).

Identity in the forward pass; in the backward pass they add a small term to the
gradient, and only in training:

- :class:`Balancer` keeps per-channel statistics (fraction positive, RMS) in ranges;
- :class:`Whiten` keeps the channel covariance from becoming too far from white;
- :class:`ScaleGrad` multiplies the gradient by a constant.
"""

from __future__ import annotations

import math
import random
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from zipformer.scaling import FloatLike, ScheduledFloat, as_schedule

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
            mean_square = (flat ** 2).mean(dim=0)
            rms = mean_square.clamp(min=1e-20).sqrt()
            std = (mean_square - mean * mean).clamp(min=1e-20).sqrt()
            mean_ratio = mean / std
            # Hinge penalties on the per-channel statistics; only their gradient matters.
            penalty = ((min_mean_ratio - mean_ratio).relu() + (mean_ratio - max_mean_ratio).relu()
                       + (math.log(min_rms) - rms.log()).relu()
                       + (rms.log() - math.log(max_rms)).relu()).sum()
            (penalty_grad,) = torch.autograd.grad(penalty, x_detached)
        # Normalized to unit RMS per channel (as icefall's BalancerFunction); zero for the
        # channels in range (no host sync needed to find out).
        channel_rms = _move_channels_last(penalty_grad, ctx.channel_dim).pow(2).mean(dim=0)
        channel_rms = channel_rms.sqrt().clamp(min=1e-20)
        shape = [1] * x.ndim
        shape[ctx.channel_dim] = -1
        penalty_grad = penalty_grad / channel_rms.view(shape)
        extra = penalty_grad * (ctx.grad_scale * x_grad.float().abs())
        return (x_grad.float() + extra).to(x_grad.dtype), None, None, None


class Balancer(nn.Module):
    """Identity forward; backward nudges per-channel statistics into ranges (icefall's scaling.py).

    Constraints: fraction of positive values in [min_positive, max_positive] (turned into
    bounds on mean/stddev via the normal quantile) and RMS in [min_abs, max_abs] x 1.2533
    (mean |x| to RMS for a normal variable). The extra gradient has, element by element,
    about ``grad_scale`` times the magnitude of the incoming gradient. Applied in training
    with probability ``prob`` (default 0.5 -> 0.125 over 8000 batches, icefall's scaling.py).
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
            # icefall's approximation of the normal quantile (BalancerFunction in
            # egs/librispeech/ASR/zipformer/scaling.py): 0.8139535143 atanh(2p - 1),
            # close to the exact value for p in [0.05, 0.95]; eps keeps p = 0 or 1 finite.
            y, eps = 2.0 * p - 1.0, 1e-10
            return 0.8139535143 * (math.log(1 + y + eps) - math.log(1 - y + eps)) / 2.0
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

    x: (frames, C). The channels split into ``num_groups`` groups with one covariance
    each; the squared entries and the diagonals are pooled over groups (icefall's
    ``_whitening_metric``), so the metric is 1 only when every group's covariance is the
    same multiple of the identity: it also penalizes groups of unequal energy.
    """
    frames, channels = x.shape
    group = channels // num_groups
    x = x.reshape(frames, num_groups, group).transpose(0, 1)  # (G, frames, C/G)
    x = x - x.mean(dim=1, keepdim=True)
    covariance = torch.matmul(x.transpose(1, 2), x)  # (G, C/G, C/G)
    mean_diagonal = covariance.diagonal(dim1=1, dim2=2).mean()
    mean_square = (covariance ** 2).sum() / channels
    return mean_square / (mean_diagonal ** 2 + 1e-20)


class _WhitenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, module: "Whiten") -> Tensor:
        ctx.save_for_backward(x)
        ctx.module = module
        return x

    @staticmethod
    def backward(ctx, x_grad: Tensor):
        (x,) = ctx.saved_tensors
        module = ctx.module
        with torch.enable_grad():
            x_detached = x.detach().float().requires_grad_(True)
            metric = whitening_metric(x_detached.reshape(-1, x.shape[-1]), module.num_groups)
            excess = (metric - float(module.whitening_limit)).relu()
            (metric_grad,) = torch.autograd.grad(excess, x_detached)
        # metric_grad is zero when the metric is within its limit.
        scale = float(module.grad_scale) * x_grad.float().norm() / (metric_grad.norm() + 1e-20)
        return (x_grad.float() + metric_grad * scale).to(x_grad.dtype), None


class Whiten(nn.Module):
    """Identity forward; backward pushes the channel covariance towards white (icefall's scaling.py).

    When :func:`whitening_metric` exceeds ``whitening_limit``, adds the metric's gradient
    rescaled to ``grad_scale`` times the norm of the incoming gradient. Runs with
    probability ``prob = (min, max)``: max at batch 0, falling linearly to min at batch
    4000. (icefall instead switches to max after the metric exceeded its limit; that
    hidden state is not in any checkpoint and would break bit-exact resumption.)
    x: (..., C).
    """

    def __init__(self, num_groups: int, whitening_limit: FloatLike,
                 prob: Tuple[float, float] = (0.025, 0.25), grad_scale: FloatLike = 0.01) -> None:
        super().__init__()
        self.num_groups = num_groups
        self.whitening_limit = as_schedule(whitening_limit)
        min_prob, max_prob = prob
        self.prob = ScheduledFloat((0.0, max_prob), (4000.0, min_prob), default=min_prob)
        self.grad_scale = as_schedule(grad_scale)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not x.requires_grad or torch.jit.is_scripting():
            return x
        if random.random() >= float(self.prob):
            return x
        return _WhitenFunction.apply(x, self)


class _PenalizeAbsValuesFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, limit: float, penalty: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.limit, ctx.penalty = limit, penalty
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        over = (x.abs() > ctx.limit).to(grad.dtype)
        return grad + ctx.penalty * x.sign().to(grad.dtype) * over, None, None


def penalize_abs_values_gt(x: Tensor, limit: float, penalty: float) -> Tensor:
    """Identity forward; the backward pass adds the gradient of
    ``penalty * sum(|x| - limit)`` over the elements with ``|x| > limit`` (icefall's
    ``penalize_abs_values_gt``, used on attention scores: limit 25, penalty 1e-4)."""
    if not x.requires_grad:
        return x
    return _PenalizeAbsValuesFunction.apply(x, float(limit), float(penalty))


class _ScaleGradFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad * ctx.scale, None


class ScaleGrad(nn.Module):
    """Identity forward; multiplies the gradient by ``scale`` (icefall's subsampling.py)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not x.requires_grad:
            return x
        return _ScaleGradFunction.apply(x, self.scale)
