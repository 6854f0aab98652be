"""One optimizer update of :mod:`asr.train`: forward and backward of its microbatches,
then the update.

Gradient accumulation (``train.accum_grad`` = G, ESPnet's ``accum_grad``, the paper's GA,
App. D.3 Table 8): G microbatches (forward and backward each, DDP's gradient all-reduce
only on the last, under ``no_sync`` before) make one optimizer update, with one
clipping over the summed gradient, one schedule step, one fp16 loss-scale update and
one running-average update. Every family's loss is a sum over utterances (reduction
"sum"), so the summed gradients are those of the concatenated batch and no loss is
rescaled. The last update of an epoch takes the microbatches that are left (fewer
than G when the epoch's count is not a multiple). The global count
(``batch_idx_train``) counts updates, as do ``max_batches``, ``save_every_n``,
``valid_interval``, ``log_interval``, ``average_period`` and the schedules (the
Transformers/DeepSpeed "optimizer steps"); the duration-adjusted count of the model's
schedules advances by G microbatches' audio per update. ``batch_in_epoch`` counts
microbatches (the sampler's position). Checkpoints are written between updates only,
so a resume never starts inside an accumulation cycle.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import torch

from asr.train_helpers import autocast_context, nurse_grad_scale


@dataclass
class Trainee:
    """What one optimizer step needs (:func:`training_step`): the model (and its DDP
    wrapper), optimizer, schedule, fp16 loss scaler, precision and device."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    precision: str
    device: torch.device
    # Schedule units per update: icefall's duration-adjusted batch count advances by
    # max_duration * world_size * accum_grad / schedule_ref_duration each update.
    schedule_units_per_batch: float = 1.0
    trained_model: Optional[torch.nn.Module] = None  # ``model``, or its DDP wrapper
    # The accumulated gradients times this before the update: 1/N when a process trains as
    # N ranks (``train.virtual_ranks``, asr/rank_group.py), the average DDP takes over ranks
    # after their backward passes (so each backward is the one a DDP rank runs: the
    # Zipformer's gradient modifiers are not exactly linear in a scaled loss's gradient).
    gradient_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.trained_model is None:
            self.trained_model = self.model


def with_last_flag(batches: Iterable[dict]) -> Iterator[Tuple[dict, bool]]:
    """(batch, whether it is the epoch's last): the last microbatch must close its update
    (and all-reduce under DDP) even when fewer than ``accum_grad`` came before it. Looking
    one batch ahead changes no random state: the data pipeline seeds its augmentation
    per batch (asr/data.py) and the sampler's checkpoint state counts the batches used."""
    iterator = iter(batches)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def training_step(trainee: Trainee, batch: dict, targets: List[List[int]], batch_idx_train: int) -> tuple:
    """Forward, backward and optimizer update on one batch (``features``, ``feature_lens``):
    :func:`accumulate_gradients` then :func:`apply_update` (the benchmarks' step).

    Returns:
        (summed loss, model frames of the utterances that contributed, excluded utterances).
    """
    result = accumulate_gradients(trainee, batch, targets, batch_idx_train, sync=True)
    apply_update(trainee, batch_idx_train)
    return result


def accumulate_gradients(trainee: Trainee, batch: dict, targets: List[List[int]], update: int,
                         sync: bool = True) -> tuple:
    """Forward and backward of one microbatch of optimizer update ``update`` (from 1), its
    gradients added to those already held; ``sync=False`` keeps DDP from all-reducing
    them (``no_sync``; the update's last microbatch all-reduces the sum).

    Returns:
        (summed loss, model frames of the utterances that contributed, excluded utterances).
    """
    device, model = trainee.device, trainee.model
    features = batch["features"].to(device)
    feature_lens = batch["feature_lens"].to(device)
    # Schedules driven by the duration-adjusted batch count, and randomness keyed by the
    # update (one draw per update, as for the concatenated batch).
    model.start_update(update, update * trainee.schedule_units_per_batch)
    trained_model = trainee.trained_model
    distributed = trained_model is not model  # the DDP wrapper
    no_sync = trained_model.no_sync() if not sync and distributed else contextlib.nullcontext()
    with no_sync:
        with autocast_context(trainee.precision, device):
            loss, stats = trained_model(features, feature_lens, targets, return_stats=True)
        trainee.scaler.scale(loss).backward()
    return loss.item(), contributing_frames(model, feature_lens, stats.excluded), stats.num_excluded


def apply_update(trainee: Trainee, update: int) -> None:
    """The optimizer update ``update`` (from 1) from the accumulated gradients: schedule,
    step (clipping, if the optimizer clips, once over the sum), loss-scale update, reset."""
    if trainee.gradient_weight != 1.0:
        with torch.no_grad():
            for parameter in trainee.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(trainee.gradient_weight)
    trainee.scheduler.step_batch(update)
    trainee.scaler.step(trainee.optimizer)
    trainee.scaler.update()
    trainee.optimizer.zero_grad(set_to_none=True)
    nurse_grad_scale(trainee.scaler, update)


def contributing_frames(model: torch.nn.Module, feature_lens: torch.Tensor, excluded: torch.Tensor) -> int:
    """Model frames summed over the utterances the loss did not exclude."""
    frames = model.output_lengths(feature_lens)
    return int(frames[~excluded.to(frames.device)].sum().item())
