"""AdamW with gradient clipping, and its warm-up + cosine schedule (App. D.2, Table 8).

:class:`ClippedAdamW` clips the total gradient norm inside ``step()``. The trainer calls
``GradScaler.step(optimizer)``, which unscales the gradients before it calls ``step()``
(and skips it on overflow), so with fp16 the clipping sees the true gradients; the
trainer's loop needs no clipping of its own (ScaledAdam clips internally as well).

:class:`WarmupCosine` has the interface of the Zipformer's Eden schedule
(``step_batch``, ``step_epoch``, ``get_last_lr``, ``state_dict``/``load_state_dict``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch


class ClippedAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``step()`` first scales the gradients of all groups
    so that their total 2-norm is at most ``clip_norm`` (0: no clipping)."""

    def __init__(self, params, clip_norm: float = 5.0, **options: Any) -> None:
        if clip_norm < 0:
            raise ValueError(f"clip_norm must be >= 0, got {clip_norm}")
        super().__init__(params, **options)
        self.clip_norm = float(clip_norm)
        self.last_grad_norm: Optional[float] = None

    @torch.no_grad()
    def step(self, closure=None):
        if self.clip_norm > 0:
            grads = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
            if grads:
                self.last_grad_norm = float(torch.nn.utils.clip_grad_norm_(grads, self.clip_norm))
        return super().step(closure)


class WarmupCosine:
    """lr(b) = peak * b / W for b < W (linear warm-up over W updates), then
    floor + (peak - floor) * (1 + cos(pi * (b - W) / (D - W))) / 2 up to b = D, and the
    floor (``final_fraction * peak``) after. b: optimizer updates so far."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_batches: int, decay_batches: int,
                 final_fraction: float = 0.05) -> None:
        if decay_batches <= warmup_batches:
            raise ValueError(f"decay_batches ({decay_batches}) must exceed warmup_batches ({warmup_batches})")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.warmup_batches, self.decay_batches = int(warmup_batches), int(decay_batches)
        self.final_fraction = float(final_fraction)
        self.batch, self.epoch = 0, 0
        self._apply()

    def factor(self, batch: float) -> float:
        """lr(b) / peak."""
        if batch < self.warmup_batches:
            return batch / self.warmup_batches
        progress = min(1.0, (batch - self.warmup_batches) / (self.decay_batches - self.warmup_batches))
        return self.final_fraction + (1.0 - self.final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def get_last_lr(self) -> List[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def _apply(self) -> None:
        factor = self.factor(self.batch)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * factor

    def step_batch(self, batch: Optional[int] = None) -> None:
        """Before each optimizer step, with the global step count (1 for the first) or
        nothing (+1): the first update then runs at peak / W, not at zero."""
        self.batch = self.batch + 1 if batch is None else batch
        self._apply()

    def step_epoch(self, epoch: Optional[int] = None) -> None:
        """The schedule counts updates only; the epoch is kept for the checkpoint."""
        self.epoch = self.epoch + 1 if epoch is None else epoch

    def state_dict(self) -> Dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.__dict__.update(dict(state_dict))
        self._apply()
