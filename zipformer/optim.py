"""ScaledAdam optimizer and Eden learning-rate schedule (Zipformer paper, Yao et al.,
ICLR 2024; the rules of icefall's egs/librispeech/ASR/zipformer/optim.py).

ScaledAdam is Adam whose steps are relative to each parameter tensor's RMS, plus a
learned log-scale per tensor, global gradient clipping at ``clipping_scale`` times the
median of recent gradient norms, and momentum applied to the final update. Parameters
of the same shape and dtype are stacked and updated as one tensor. The step-by-step
rule is in :meth:`ScaledAdam.step` (the steps of icefall's ScaledAdam.step, in order).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor

# Extra per-group entries kept in ``param_groups`` (saved by state_dict).
_GROUP_STATE = ("step", "recent_norms", "clip_threshold", "num_clipped")
# Steps at which the clipping threshold is first set from the few norms seen so far,
# at twice the usual multiple (as icefall's optim.py does).
_EARLY_THRESHOLD_STEPS = (10, 20, 40)


class ScaledAdam(torch.optim.Optimizer):
    """Parameter-scale-relative Adam with a learned log-scale (Zipformer paper; icefall's optim.py).

    Args:
        params: parameters or parameter groups (each group may set its own ``lr``).
        lr: learning rate; the recipe's base_lr, 0.045 for Zipformer-M.
        clipping_scale: clip the (scale-normalised) gradient norm at this multiple of the
            median of the last ``clipping_update_period`` norms; None disables clipping.
        betas: (beta1 for the momentum on updates, beta2 for the second moments).
        scalar_lr_scale: learning-rate factor for scalars and for the log-scale steps.
        param_min_rms, param_max_rms: floor of the RMS used to scale steps; ceiling the
            log-scale steps may not push a tensor's RMS past.
        scalar_max: scalars are clamped to [-scalar_max, scalar_max].
        size_update_period: the log-scale is learned once per this many steps.
        clipping_update_period: the clipping threshold is refreshed this often.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.045,
                 clipping_scale: Optional[float] = 2.0, betas: Tuple[float, float] = (0.9, 0.98),
                 scalar_lr_scale: float = 0.1, eps: float = 1e-8, param_min_rms: float = 1e-5,
                 param_max_rms: float = 3.0, scalar_max: float = 10.0,
                 size_update_period: int = 4, clipping_update_period: int = 100) -> None:
        if lr <= 0.0:
            raise ValueError(f"lr must be positive, got {lr}")
        if clipping_scale is not None and clipping_scale <= 0.0:
            raise ValueError(f"clipping_scale must be positive or None, got {clipping_scale}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = dict(lr=lr, clipping_scale=clipping_scale, betas=betas,
                        scalar_lr_scale=scalar_lr_scale, eps=eps, param_min_rms=param_min_rms,
                        param_max_rms=param_max_rms, scalar_max=scalar_max,
                        size_update_period=size_update_period,
                        clipping_update_period=clipping_update_period)
        super().__init__(params, defaults)
        # (state key, parameters) -> (stacked tensor, its row views held as the states).
        self._stacks: Dict[Tuple[Any, ...], Tuple[Tensor, Tuple[Tensor, ...]]] = {}
        for group in self.param_groups:
            self._init_group_state(group)

    @staticmethod
    def _init_group_state(group: Dict[str, Any]) -> None:
        group.setdefault("step", 0)
        group.setdefault("recent_norms", [])
        group.setdefault("clip_threshold", None)
        group.setdefault("num_clipped", 0)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._init_group_state(self.param_groups[-1])

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state["param_groups"] = copy.deepcopy(state["param_groups"])
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(copy.deepcopy(state_dict))

    # ------------------------------------------------------------------------------
    def _init_param_state(self, p: Tensor, group: Dict[str, Any]) -> Dict[str, Tensor]:
        state = self.state[p]
        if not state:
            state["exp_avg_sq"] = torch.zeros_like(p)
            state["momentum"] = torch.zeros_like(p)
            if p.numel() > 1:
                state["param_rms"] = p.detach().pow(2).mean().sqrt()
                state["scale_grads"] = torch.zeros(group["size_update_period"],
                                                   dtype=p.dtype, device=p.device)
                state["scale_exp_avg_sq"] = torch.zeros((), dtype=p.dtype, device=p.device)
        return state

    def _clipping_factor(self, group: Dict[str, Any], params: List[Tensor]) -> float:
        """kappa = min(1, threshold / N), N the scale-normalised gradient norm (item 0)."""
        clipping_scale = group["clipping_scale"]
        if clipping_scale is None:
            return 1.0
        step, period = group["step"], group["clipping_update_period"]
        squares = []
        for p in params:
            if p.numel() == 1:
                squares.append((group["scalar_lr_scale"] * p.grad).pow(2).sum())
            else:
                squares.append(p.grad.pow(2).sum() * self.state[p]["param_rms"].pow(2))
        norm = float(torch.stack([s.float() for s in squares]).sum().sqrt()) if squares else 0.0
        if not math.isfinite(norm):
            return 0.0
        norms = group["recent_norms"]
        norms.append(norm)
        del norms[:-period]
        median = float(torch.tensor(norms).median())
        if step > 0 and step % period == 0:
            group["clip_threshold"] = clipping_scale * median
        elif step < period and step in _EARLY_THRESHOLD_STEPS:
            group["clip_threshold"] = 2.0 * clipping_scale * median
        threshold = group["clip_threshold"]
        if step == 0 or threshold is None or norm <= threshold:
            return 1.0
        group["num_clipped"] += 1
        return threshold / norm

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("ScaledAdam does not support sparse gradients")
                self._init_param_state(p, group)
            kappa = self._clipping_factor(group, params)
            batches: Dict[Tuple[Any, ...], List[Tensor]] = defaultdict(list)
            for p in params:
                batches[(p.dtype, p.device, tuple(p.shape))].append(p)
            for batch in batches.values():
                if batch[0].numel() == 1:
                    self._update_scalars(group, batch, kappa)
                else:
                    self._update_tensors(group, batch, kappa)
            group["step"] += 1
        return loss

    @staticmethod
    def _clipped_grads(batch: List[Tensor], kappa: float) -> Tensor:
        grads = torch.stack([p.grad for p in batch])
        if kappa == 0.0:  # nonfinite norm: this step's gradients are dropped (item 0)
            return torch.zeros_like(grads)
        return grads * kappa if kappa != 1.0 else grads

    def _stacked(self, batch: List[Tensor], key: str) -> Tensor:
        """The states ``key`` of ``batch`` as one (B, ...) tensor whose rows are the states
        themselves (views), so updating it in place updates them: stacked once, then reused
        while the states stay those views (a loaded checkpoint restacks once)."""
        states = [self.state[p] for p in batch]
        cache_key = (key, tuple(id(p) for p in batch))
        cached = self._stacks.get(cache_key)
        if cached is not None and all(s[key] is view for s, view in zip(states, cached[1])):
            return cached[0]
        stacked = torch.stack([s[key] for s in states])
        views = stacked.unbind(0)
        for s, view in zip(states, views):
            s[key] = view
        self._stacks[cache_key] = (stacked, views)
        return stacked

    def _second_moment(self, group: Dict[str, Any], batch: List[Tensor], grads: Tensor) -> Tensor:
        """Adam denominator sqrt(v_hat) + eps; v_hat bias-corrected early on (item 1)."""
        beta2, step = group["betas"][1], group["step"]
        exp_avg_sq = self._stacked(batch, "exp_avg_sq").mul_(beta2).add_(
            grads * grads, alpha=1.0 - beta2)
        correction = 1.0 - beta2 ** (step + 1)
        if correction < 0.99:
            exp_avg_sq = exp_avg_sq / correction
        return exp_avg_sq.sqrt().add_(group["eps"])

    def _apply_momentum(self, group: Dict[str, Any], batch: List[Tensor], stacked: Tensor,
                        delta: Tensor) -> Tensor:
        """m <- beta1 m + (1 - beta1) delta; p <- p + m (item 4)."""
        beta1 = group["betas"][0]
        momentum = self._stacked(batch, "momentum").mul_(beta1).add_(delta, alpha=1.0 - beta1)
        return stacked + momentum

    def _update_scalars(self, group: Dict[str, Any], batch: List[Tensor], kappa: float) -> None:
        stacked = torch.stack([p.detach() for p in batch])
        grads = self._clipped_grads(batch, kappa)
        lr = group["lr"] * group["scalar_lr_scale"]
        delta = -lr * grads / self._second_moment(group, batch, grads)
        stacked = self._apply_momentum(group, batch, stacked, delta)
        stacked.clamp_(-group["scalar_max"], group["scalar_max"])  # item 5
        for p, value in zip(batch, stacked.unbind(0)):
            p.copy_(value)

    def _update_tensors(self, group: Dict[str, Any], batch: List[Tensor], kappa: float) -> None:
        stacked = torch.stack([p.detach() for p in batch])  # (B, *shape)
        grads = self._clipped_grads(batch, kappa)
        batch_size = len(batch)
        view = (batch_size,) + (1,) * (stacked.ndim - 1)
        period, step = group["size_update_period"], group["step"]

        # Item 3: gradient with respect to the log-scale, s_t = sum(p * g).
        scale_grads = self._stacked(batch, "scale_grads")
        scale_grads[:, step % period] = (stacked * grads).reshape(batch_size, -1).sum(dim=1)
        param_rms = self._stacked(batch, "param_rms")
        size_delta = None
        if step % period == period - 1:
            param_rms.copy_(stacked.reshape(batch_size, -1).pow(2).mean(dim=1).sqrt())
            beta2_period = group["betas"][1] ** period
            scale_exp_avg_sq = self._stacked(batch, "scale_exp_avg_sq").mul_(beta2_period).add_(
                scale_grads.pow(2).mean(dim=1), alpha=1.0 - beta2_period)
            num_size_steps = (step + 1) // period
            bias_correction = math.sqrt(1.0 - beta2_period ** num_size_steps)
            scale_step = (-group["lr"] * group["scalar_lr_scale"] * bias_correction
                          * scale_grads.sum(dim=1) / (scale_exp_avg_sq.sqrt() + group["eps"]))
            scale_step = torch.where(param_rms < group["param_min_rms"],
                                     torch.zeros_like(scale_step), scale_step)
            scale_step = scale_step.clamp(-0.1, 0.1)
            scale_step = torch.minimum(
                scale_step, (group["param_max_rms"] - param_rms) / param_rms)
            size_delta = scale_step.view(view) * stacked

        # Items 1-2: Adam step, scaled by the tensor's RMS.
        delta = -group["lr"] * grads / self._second_moment(group, batch, grads)
        delta = delta * param_rms.clamp(min=group["param_min_rms"]).view(view)
        if size_delta is not None:
            delta = delta + size_delta
        stacked = self._apply_momentum(group, batch, stacked, delta)
        for p, value in zip(batch, stacked.unbind(0)):
            p.copy_(value)


class Eden:
    """Eden learning-rate schedule (Zipformer paper; icefall's optim.py):

    lr(b, e) = base_lr * ((b^2 + B^2) / B^2)^(-1/4) * ((e^2 + E^2) / E^2)^(-1/4) * w(b),
    w(b) = warmup_start + (1 - warmup_start) * b / warmup_batches while b < warmup_batches,
    else 1. b: optimizer steps so far; e: completed epochs (0-based). Defaults are the
    recipe values (B = 7500, E = 3.5; LibriSpeech passes warmup_start 0.1).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_batches: float = 7500.0,
                 lr_epochs: float = 3.5, warmup_batches: float = 500.0,
                 warmup_start: float = 0.5) -> None:
        if lr_batches <= 0 or lr_epochs <= 0:
            raise ValueError(f"lr_batches and lr_epochs must be positive, got "
                             f"{lr_batches}, {lr_epochs}")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.lr_batches, self.lr_epochs = float(lr_batches), float(lr_epochs)
        self.warmup_batches, self.warmup_start = float(warmup_batches), float(warmup_start)
        self.batch, self.epoch = 0, 0
        self._apply()

    def factor(self, batch: float, epoch: float) -> float:
        """lr(b, e) / base_lr."""
        batch_term = ((batch ** 2 + self.lr_batches ** 2) / self.lr_batches ** 2) ** -0.25
        epoch_term = ((epoch ** 2 + self.lr_epochs ** 2) / self.lr_epochs ** 2) ** -0.25
        warmup = 1.0
        if batch < self.warmup_batches:
            warmup = self.warmup_start + (1.0 - self.warmup_start) * batch / self.warmup_batches
        return batch_term * epoch_term * warmup

    def get_last_lr(self) -> List[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def _apply(self) -> None:
        factor = self.factor(self.batch, self.epoch)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * factor

    def step_batch(self, batch: Optional[int] = None) -> None:
        """Call after every optimizer step, with the global step count or nothing (+1)."""
        self.batch = self.batch + 1 if batch is None else batch
        self._apply()

    def step_epoch(self, epoch: Optional[int] = None) -> None:
        """Call at the start of each epoch with the number of completed epochs."""
        self.epoch = self.epoch + 1 if epoch is None else epoch
        self._apply()

    def state_dict(self) -> Dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(state_dict))
        self._apply()
