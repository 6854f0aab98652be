"""ZeRO stage 1 for the trainer (``train.zero1``): each rank keeps the optimizer state
of its share of the trainable parameters only (torch's ``ZeroRedundancyOptimizer``),
updates that share, and broadcasts it; DDP still all-reduces the full gradients. Issue
14 asks for it for the big LLM-CTC/LLM-CE runs (App. D.3 trains 8B-32B backbones on
eight GPUs), where AdamW's two moments of every LoRA and projector weight are repeated
on every rank without it.

The family's optimizer is rebuilt as the local optimizer of the shards: the same class,
parameter groups and options. The update stays exactly that of plain DDP only for
optimizers whose step is a function of each parameter's own gradient and state (torch's
Adam, AdamW, SGD...). Gradient clipping over all parameters (the LLM family's
``ClippedAdamW``) is such a global step: here it is done once over the full gradients,
which every rank holds after DDP's all-reduce, and the shards' optimizers do not clip.
ScaledAdam (the Zipformer family) scales and clips by statistics of all its
parameters, so a shard would see only its own: refused.

Checkpoints hold the consolidated state (``consolidate_state_dict`` on every rank,
then rank 0 writes), in the format of the unsharded optimizer, so that a run may resume
with or without ZeRO; on resume every rank loads the whole state and keeps its shard.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable, List

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

# Optimizers whose per-parameter update makes a sharded step equal the unsharded one.
PER_PARAMETER_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


class ClippingZeroRedundancyOptimizer(ZeroRedundancyOptimizer):
    """ZeRO-1 that first clips the total 2-norm of all ranks' (identical, all-reduced)
    gradients to ``global_clip_norm`` (0: no clipping), as the wrapped optimizer would have
    done in its own ``step`` over every parameter."""

    def __init__(self, params: Iterable, optimizer_class: type, global_clip_norm: float = 0.0,
                 **defaults: Any) -> None:
        super().__init__(params, optimizer_class=optimizer_class, **defaults)
        self.clip_norm = float(global_clip_norm)
        self.last_grad_norm = None

    @torch.no_grad()
    def step(self, closure=None, **kwargs: Any):
        if self.clip_norm > 0:
            # The order of the unsharded optimizer's groups, so that the norm is summed alike.
            grads = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
            if grads:
                self.last_grad_norm = float(torch.nn.utils.clip_grad_norm_(grads, self.clip_norm))
        return super().step(closure, **kwargs)


def check_shardable(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, PER_PARAMETER_OPTIMIZERS):
        raise ValueError(
            f"train.zero1: the family's optimizer {type(optimizer).__name__} cannot be sharded exactly "
            f"(ZeRO-1 needs a per-parameter update, one of "
            f"{', '.join(c.__name__ for c in PER_PARAMETER_OPTIMIZERS)} or a subclass; ScaledAdam "
            "clips by statistics of all parameters): set train.zero1=false")


def constructor_options(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's defaults that its torch base class takes as arguments (AdamW's
    defaults also hold ``decoupled_weight_decay``, which its constructor does not take)."""
    base = next(c for c in type(optimizer).__mro__ if c in PER_PARAMETER_OPTIMIZERS)
    accepted = inspect.signature(base.__init__).parameters
    return {key: value for key, value in optimizer.defaults.items() if key in accepted}


def zero1_optimizer(optimizer: torch.optim.Optimizer, scheduler: Any) -> ClippingZeroRedundancyOptimizer:
    """The family's ``optimizer`` as ZeRO-1 (needs an initialized process group), with
    ``scheduler`` pointed at it so that its learning rates reach the shards."""
    check_shardable(optimizer)
    constructor = constructor_options(optimizer)
    clip_norm = float(getattr(optimizer, "clip_norm", 0.0))
    if hasattr(optimizer, "clip_norm"):
        constructor["clip_norm"] = 0.0  # the shards must not clip by their own norm
    if optimizer.state:
        raise ValueError("train.zero1: the optimizer has already taken steps; wrap it before training")
    # Every key of the groups (lr, initial_lr set by the schedule, weight_decay...) is kept.
    groups: List[dict] = [dict(group) for group in optimizer.param_groups]
    sharded = ClippingZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                              global_clip_norm=clip_norm, **constructor)
    if getattr(scheduler, "optimizer", None) is optimizer:
        scheduler.optimizer = sharded
    else:
        raise ValueError(f"train.zero1: the schedule {type(scheduler).__name__} does not hold the "
                         "optimizer as .optimizer; cannot point it at the sharded one")
    return sharded


def consolidate(optimizer: torch.optim.Optimizer) -> None:
    """Before a checkpoint: gather the shards' states on rank 0 (collective: every rank calls)."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
