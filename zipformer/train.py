"""Train a Zipformer CTC model with Pruned CTC, for every corpus.

    python -m zipformer.train --config egs/librispeech/conf/train.yaml train.exp_dir=exp/m
    torchrun --nproc-per-node 4 -m zipformer.train --config ... data.max_duration=1000

The preset (``model``/``data``/``train`` sections, :mod:`zipformer.run_config`) is the one
source of hyper-parameters; ``section.field=value`` arguments override it. Resume exactly
with ``train.start_batch=<B>`` (from ``checkpoint-<B>.pt``) or from the end of an epoch with
``train.start_epoch=<N+1>`` (from ``epoch-<N>.pt``).

The program reads top to bottom: data, model, optimizer and schedule, resume, the loop
(step, average, log, validate, checkpoint). Only rank 0 writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from zipformer.averaging import make_averaged_model, update_averaged_model
from zipformer.checkpoint import (
    capture_rng_state,
    epoch_checkpoint_path,
    iteration_checkpoint_path,
    load_checkpoint,
    remove_old_checkpoints,
    restore_rng_state,
    save_checkpoint,
)
from zipformer.cut_filters import TrainingCutFilter, num_encoder_frames
from zipformer.data import (
    DataOptions,
    TrainData,
    build_train_dataloader,
    build_valid_dataloader,
    load_cuts_lazy,
    restore_sampler_state,
    resumable_sampler_state,
)
from zipformer.model import CTCModel, parameter_groups
from zipformer.optim import Eden, ScaledAdam
from zipformer.run_config import CHANGEABLE_ON_RESUME, RunConfig, load_run_config
from zipformer.tokenizer import Tokenizer, load_tokenizer
from zipformer.train_helpers import (
    Distributed,
    ProgressReport,
    all_reduce_sum,
    autocast_context,
    make_grad_scaler,
    nurse_grad_scale,
    setup_distributed,
    setup_logging,
)


@dataclass
class TrainingState:
    """Where the run is: what a checkpoint must restore besides the tensors."""

    epoch: int = 1
    batch_idx_train: int = 0  # optimizer steps so far (global batch count)
    batch_in_epoch: int = 0  # batches of ``epoch`` already trained on
    batches_per_epoch: Optional[int] = None  # known after the first full epoch (for ETA)
    best_valid_loss: float = float("inf")


@dataclass
class Run:
    """The parts of a training run, built once in :func:`main`."""

    config: RunConfig
    dist: Distributed
    tokenizer: Tokenizer
    train_data: TrainData
    valid_loader: torch.utils.data.DataLoader
    model: CTCModel
    trained_model: torch.nn.Module  # ``model``, or its DDP wrapper
    model_avg: Optional[torch.nn.Module]  # float64 running average, rank 0 only
    optimizer: ScaledAdam
    scheduler: Eden
    scaler: torch.amp.GradScaler
    report: ProgressReport
    after_step: Optional["StepHook"] = None


# Called as hook(run, batch, state) after every optimizer step: lets a caller (the DDP
# tests) observe each rank's batches and weights without changing the loop.
StepHook = Callable[[Run, dict, TrainingState], None]


def main(argv: Optional[Sequence[str]] = None, after_step: Optional[StepHook] = None) -> None:
    args = parse_args(argv)
    config = load_run_config(args.config, args.overrides)
    options = config.train
    exp_dir = Path(options.exp_dir)
    dist = setup_distributed(options.device)
    setup_logging(exp_dir, dist.rank)
    seed_everything(options.seed)

    # Data. The lexicon decides the model's output classes.
    tokenizer = load_tokenizer(options.lang_dir)
    config.model = dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size, blank_id=tokenizer.blank_id)
    train_data = build_train_data(config.data, tokenizer, dist)
    valid_loader = build_valid_dataloader(config.data, world_size=dist.world_size, rank=dist.rank)

    # Model and its running average (float64, on the CPU), optimizer, learning-rate schedule.
    model, optimizer, scheduler = build_model_and_optimizer(config, dist.device)
    model_avg = make_averaged_model(model) if dist.is_main else None
    logging.info("config: %s", config.to_dict())
    logging.info("number of model parameters: %d", model.num_parameters())

    # fp16 loss scaling.
    scaler = make_grad_scaler(options.precision, dist.device)

    writer = None
    if dist.is_main and options.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(exp_dir / "tensorboard"))
    trained_model: torch.nn.Module = model
    if dist.world_size > 1:
        device_ids = [dist.local_rank] if dist.device.type == "cuda" else None
        trained_model = DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=True)
    run = Run(config, dist, tokenizer, train_data, valid_loader, model, trained_model, model_avg,
              optimizer, scheduler, scaler, ProgressReport(options.log_interval, writer), after_step)
    state = resume(run)

    # The loop.
    for epoch in range(state.epoch, options.num_epochs + 1):
        state.epoch = epoch
        scheduler.step_epoch(epoch - 1)
        train_data.set_epoch(epoch)
        stopped_early = train_one_epoch(run, state)
        if dist.is_main:
            train_data.cut_filter.log_summary()
        if state.batch_in_epoch == 0:
            raise NoTrainingBatches(no_batches_message(config.data, train_data.cut_filter.summary(), dist.world_size))
        if stopped_early:
            save(run, state, iteration_checkpoint_path(exp_dir, state.batch_idx_train))
            break
        validate(run, state)
        state.batches_per_epoch = state.batch_in_epoch
        state.batch_in_epoch = 0
        save(run, state, epoch_checkpoint_path(exp_dir, epoch))
    if writer is not None:
        writer.close()
    logging.info("done: %d batches, best validation loss %.4f per frame", state.batch_idx_train,
                 state.best_valid_loss)
    if dist.world_size > 1:
        torch.distributed.destroy_process_group()


class NoTrainingBatches(RuntimeError):
    """The training cuts give no batch: the filters dropped them, or too few remain to fill one."""


def build_train_data(options: DataOptions, tokenizer: Tokenizer, dist: Distributed) -> TrainData:
    """The training loader of this rank; NoTrainingBatches if the filters leave fewer cuts
    than the sampler's buckets (Lhotse's bucket estimate asserts on that)."""
    try:
        return build_train_dataloader(options, tokenizer, world_size=dist.world_size, rank=dist.rank)
    except AssertionError as error:
        if "number of buckets" not in str(error):
            raise
        cut_filter = TrainingCutFilter(tokenizer, options.min_cut_duration, options.max_cut_duration)
        for _ in load_cuts_lazy(options.train_cuts, "train_cuts", seed=options.seed).filter(cut_filter):
            pass
        raise NoTrainingBatches(no_batches_message(options, cut_filter.summary(), dist.world_size)) from error


def no_batches_message(options: DataOptions, filter_summary: str, world_size: int) -> str:
    ranks = f" shared by {world_size} ranks" if world_size > 1 else ""
    dropped = " (each bucket's last, incomplete batch is dropped)" if options.drop_last else ""
    return (
        f"no training batches from data.train_cuts={options.train_cuts}: {filter_summary}; "
        f"batches of data.max_duration={options.max_duration:g} s{ranks} in data.num_buckets="
        f"{options.num_buckets} buckets, data.drop_last={options.drop_last}{dropped}. Lower "
        f"data.max_duration or data.num_buckets{', set data.drop_last=false' if options.drop_last else ''}, "
        f"or widen data.min_cut_duration/data.max_cut_duration"
    )


def build_model_and_optimizer(config: RunConfig, device: torch.device) -> tuple:
    """The CTC model on ``device``, its ScaledAdam optimizer and Eden schedule, as training uses them.

    Returns:
        (model, optimizer, scheduler).
    """
    options = config.train
    model = CTCModel(config.model).to(device)
    optimizer = ScaledAdam(parameter_groups(model, options.base_lr), lr=options.base_lr,
                           clipping_scale=options.clipping_scale)
    scheduler = Eden(optimizer, lr_batches=options.lr_batches, lr_epochs=options.lr_epochs,
                     warmup_batches=options.warmup_batches, warmup_start=options.warmup_start)
    return model, optimizer, scheduler


def train_one_epoch(run: Run, state: TrainingState) -> bool:
    """Train on the rest of the current epoch; True if ``train.max_batches`` stopped it."""
    options = run.config.train
    run.trained_model.train()
    for batch in run.train_data.loader:
        state.batch_idx_train += 1
        state.batch_in_epoch += 1
        loss_sum, frames, excluded = training_step(run, batch, state.batch_idx_train)
        audio_seconds = batch["feature_lens"].sum().item() * 0.01
        run.report.add(loss_sum, frames, audio_seconds, len(batch["texts"]), excluded)
        if run.model_avg is not None:
            update_averaged_model(run.model_avg, run.model, state.batch_idx_train, options.average_period)
        if run.after_step is not None:
            run.after_step(run, batch, state)
        run.report.maybe_report(
            epoch=state.epoch, batch_in_epoch=state.batch_in_epoch, batch_idx_train=state.batch_idx_train,
            lr=run.scheduler.get_last_lr()[0], grad_scale=run.scaler.get_scale() if run.scaler.is_enabled() else 1.0,
            batches_per_epoch=state.batches_per_epoch, max_batches=options.max_batches,
        )
        if state.batch_idx_train % options.valid_interval == 0:
            validate(run, state)
        if options.max_batches and state.batch_idx_train >= options.max_batches:
            return True
        if options.save_every_n and state.batch_idx_train % options.save_every_n == 0:
            save(run, state, iteration_checkpoint_path(options.exp_dir, state.batch_idx_train))
    return False


def adjusted_batch_count(run: Run, batch_idx_train: int) -> float:
    """icefall's duration-adjusted batch count that drives the model's schedules."""
    seconds_per_step = run.config.data.max_duration * run.dist.world_size
    return batch_idx_train * seconds_per_step / run.config.train.schedule_ref_duration


def training_step(run: Run, batch: dict, batch_idx_train: int) -> tuple:
    """Forward, backward and optimizer step on one batch.

    Returns:
        (summed loss, encoder frames of the utterances that contributed, excluded utterances).
    """
    device = run.dist.device
    features = batch["features"].to(device)
    feature_lens = batch["feature_lens"].to(device)
    targets = run.tokenizer.encode(batch["texts"])
    run.model.set_batch_count(adjusted_batch_count(run, batch_idx_train))
    with autocast_context(run.config.train.precision, device):
        loss, stats = run.trained_model(features, feature_lens, targets, return_stats=True)
    run.scaler.scale(loss).backward()
    run.scheduler.step_batch(batch_idx_train)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    nurse_grad_scale(run.scaler, batch_idx_train)
    return loss.item(), contributing_frames(feature_lens, stats.excluded), stats.num_excluded


def contributing_frames(feature_lens: torch.Tensor, excluded: torch.Tensor) -> int:
    """Encoder frames summed over the utterances the loss did not exclude."""
    frames = num_encoder_frames(feature_lens)
    return int(frames[~excluded.to(frames.device)].sum().item())


@torch.no_grad()
def validate(run: Run, state: TrainingState) -> float:
    """Loss per encoder frame on the validation cuts, summed over all ranks."""
    run.model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=run.dist.device)
    for batch in run.valid_loader:
        feature_lens = batch["feature_lens"].to(run.dist.device)
        with autocast_context(run.config.train.precision, run.dist.device):
            loss, stats = run.model(batch["features"].to(run.dist.device), feature_lens,
                                    run.tokenizer.encode(batch["texts"]), return_stats=True)
        totals[0] += loss.item()
        totals[1] += contributing_frames(feature_lens, stats.excluded)
    all_reduce_sum(totals, run.dist.world_size)
    run.model.train()
    valid_loss = (totals[0] / totals[1].clamp(min=1)).item()
    state.best_valid_loss = min(state.best_valid_loss, valid_loss)
    logging.info("epoch %d, global batch %d: validation loss %.4f per frame (best %.4f)",
                 state.epoch, state.batch_idx_train, valid_loss, state.best_valid_loss)
    run.report.scalars({"valid/loss": valid_loss}, state.batch_idx_train)
    return valid_loss


def save(run: Run, state: TrainingState, path: Path) -> None:
    """Checkpoint for exact resume (every rank's RNG state; files written by rank 0)."""
    rng_per_rank = gather_rng_states(run.dist)
    if not run.dist.is_main:
        return
    options = run.config.train
    save_checkpoint(
        path, model=run.model, config=run.config.to_dict(), batch_idx_train=state.batch_idx_train,
        epoch=state.epoch, model_avg=run.model_avg, average_period=options.average_period,
        optimizer=run.optimizer, scheduler=run.scheduler, grad_scaler=run.scaler,
        sampler_state=resumable_sampler_state(run.train_data.sampler, state.batch_in_epoch),
        extra={"rng_per_rank": rng_per_rank, "batch_in_epoch": state.batch_in_epoch,
               "batches_per_epoch": state.batches_per_epoch, "best_valid_loss": state.best_valid_loss},
    )
    logging.info("saved %s", path)
    remove_old_checkpoints(options.exp_dir, options.keep_last_k)


def resume(run: Run) -> TrainingState:
    """Load the checkpoint named by ``train.start_batch`` / ``train.start_epoch``, if any."""
    options = run.config.train
    if options.start_batch > 0:
        path = iteration_checkpoint_path(options.exp_dir, options.start_batch)
    elif options.start_epoch > 1:
        path = epoch_checkpoint_path(options.exp_dir, options.start_epoch - 1)
    else:
        return TrainingState()
    checkpoint = load_checkpoint(
        path, expected_config=run.config.to_dict(), ignore_config_fields=CHANGEABLE_ON_RESUME,
        model=run.model, model_avg=run.model_avg, optimizer=run.optimizer,
        scheduler=run.scheduler, grad_scaler=run.scaler,
    )
    rng_states: List[Any] = checkpoint.get("rng_per_rank") or []
    if len(rng_states) == run.dist.world_size:
        restore_rng_state(rng_states[run.dist.rank])
    else:
        logging.warning("%s was written by %d rank(s), this run has %d: RNG states not restored",
                        path, len(rng_states), run.dist.world_size)
    state = TrainingState(
        epoch=checkpoint["epoch"], batch_idx_train=checkpoint["batch_idx_train"],
        batches_per_epoch=checkpoint.get("batches_per_epoch"),
        best_valid_loss=checkpoint.get("best_valid_loss", float("inf")),
    )
    if options.start_batch > 0:
        # Mid-epoch: continue the same epoch from the first batch not yet trained on.
        restore_sampler_state(run.train_data.sampler, checkpoint["sampler"])
        state.batch_in_epoch = checkpoint["batch_in_epoch"]
    else:
        state.epoch += 1
    logging.info("resumed from %s: epoch %d, global batch %d", path, state.epoch, state.batch_idx_train)
    return state


def gather_rng_states(dist: Distributed) -> List[Any]:
    """Every rank's RNG states, in rank order (collective: all ranks must call)."""
    state = capture_rng_state()
    if dist.world_size == 1:
        return [state]
    gathered: List[Any] = [None] * dist.world_size
    torch.distributed.all_gather_object(gathered, state)
    return gathered


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a Zipformer CTC model with Pruned CTC.",
        epilog="Overrides: section.field=value, e.g. train.num_epochs=30 data.max_duration=600 model.preset=S",
    )
    parser.add_argument("--config", type=Path, default=None, help="preset YAML with model/data/train sections")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides of the preset")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
