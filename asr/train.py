"""Train a CTC model of any family (Zipformer CTC, ...) with Pruned CTC, for every corpus.

    python -m asr.train --config egs/librispeech/conf/train.yaml train.exp_dir=exp/m
    torchrun --nproc-per-node 4 -m asr.train --config ... data.max_duration=1000

The preset (``family`` and the ``model``/``optim``/``data``/``train`` sections,
:mod:`asr.config`) is the one source of hyper-parameters; ``section.field=value``
arguments override it. A rerun continues exactly from the newest checkpoint of
``train.exp_dir`` (``train.auto_resume``) and says so when the last epoch is already
there; ``train.start_batch=<B>`` (``checkpoint-<B>.pt``) or ``train.start_epoch=<N+1>``
(``epoch-<N>.pt``) name a checkpoint explicitly.

The program reads top to bottom: data, model, optimizer and schedule, resume, the loop
(step, average, log, validate, checkpoint). Only rank 0 writes. ``train.accum_grad``
microbatches make one optimizer update (:mod:`asr.train_step`); the counts of the loop
are in updates. With ``train.virtual_ranks`` = N each process trains as N ranks (their
batches, random states and averaged gradients; :mod:`asr.rank_group`): one process makes
the updates of N.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from asr.averaging import make_averaged_model, update_averaged_model
from asr.checkpoint import (
    CheckpointConfigMismatch,
    check_config_matches,
    epoch_checkpoint_path,
    iteration_checkpoint_path,
    load_checkpoint,
    read_checkpoint_entry,
    remove_old_checkpoints,
    save_checkpoint,
)
from asr.cut_filters import FRAME_SHIFT_SECONDS, TrainingCutFilter
from asr.data import (
    DataOptions,
    build_train_dataloader,
    build_valid_dataloader,
    load_cuts_lazy,
    restore_sampler_state,
    resumable_sampler_state,
)
from asr.config import CHANGEABLE_ON_RESUME, RunConfig, TrainOptions, load_run_config
from asr.rank_group import RankGroup
from asr.family import load_family
from asr.tokenizer import Tokenizer
from asr.train_helpers import (
    Distributed,
    ProgressReport,
    all_reduce_sum,
    autocast_context,
    leave_distributed,
    setup_distributed,
)
from asr.logs import setup_logging
from asr.train_step import (
    Trainee,
    accumulate_gradients,
    apply_update,
    contributing_frames,
    with_last_flag,
)
from asr.train_zero1 import consolidate
from asr.threads import choose_threads, describe as describe_threads
from asr.trainee import build_trainee, seed_everything, start_digest
from asr.weights import newest_checkpoint


@dataclass
class TrainingState:
    """Where the run is: what a checkpoint must restore besides the tensors."""

    epoch: int = 1
    batch_idx_train: int = 0  # optimizer updates so far (global batch count)
    batch_in_epoch: int = 0  # microbatches of ``epoch`` already trained on
    batches_per_epoch: Optional[int] = None  # microbatches, known after the first full epoch (for ETA)
    best_valid_loss: float = float("inf")
    # (update, training loss per frame over the log interval ending there), one entry per
    # log line: what a recipe reads to tell a run that learned from one that stalled.
    train_losses: List[Tuple[int, float]] = field(default_factory=list)


@dataclass
class Run:
    """The parts of a training run, built once in :func:`main`."""

    config: RunConfig
    dist: Distributed
    tokenizer: Tokenizer
    train_data: RankGroup  # the batches of the rank(s) this process trains as
    valid_loader: torch.utils.data.DataLoader
    trainee: Trainee
    model_avg: Optional[torch.nn.Module]  # float64 running average, rank 0 only
    report: ProgressReport
    after_step: Optional["StepHook"] = None
    start: str = ""  # the digest of train.init_from's weights (trainee.start_digest), "" without

    @property
    def model(self) -> torch.nn.Module:
        return self.trainee.model


# Called as hook(run, batch, state) after every optimizer update: lets a caller (the DDP
# tests) observe each rank's batches and weights without changing the loop. ``batch``
# holds the update's ``cut_ids`` and ``texts`` (of all its microbatches, in order),
# ``num_microbatches`` and the loader's ``microbatches`` themselves.
StepHook = Callable[[Run, dict, TrainingState], None]


def main(argv: Optional[Sequence[str]] = None, after_step: Optional[StepHook] = None) -> None:
    args = parse_args(argv)
    try:
        config = load_run_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    options = config.train
    exp_dir = Path(options.exp_dir)
    # The lexicon (train.lang_dir's, or the family's own) decides the model's output classes;
    # a missing one is refused before anything is written.
    try:
        tokenizer = load_family(config.family).tokenizer(config.model, options.lang_dir)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    start = start_digest(options.init_from)
    finished = finished_already(config)
    if finished is not None:
        check_finished_config(finished, config, tokenizer)
        check_same_start(finished, options.init_from, start)
        print(f"training: {finished} exists: already finished")
        return
    dist = setup_distributed(options.device)
    new_exp_dir = not exp_dir.exists()
    setup_logging(exp_dir, "train", dist.rank)
    choose_threads()
    logging.info("threads: %s", describe_threads())
    seed_everything(options.seed)

    # Data.
    config.model = with_lexicon_size(config.model, tokenizer)
    try:
        trainee = build_trainee(config, dist.device, tokenizer.vocab_size, tokenizer.blank_id, dist.world_size,
                                dist.local_rank)
    except (FileNotFoundError, ValueError) as error:  # a path or value of the model section
        root = logging.getLogger()
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            handler.close()
            root.removeHandler(handler)
        if new_exp_dir:
            shutil.rmtree(exp_dir, ignore_errors=True)
        raise SystemExit(f"ERROR: {error}") from None
    model, scheduler = trainee.model, trainee.scheduler
    train_data = build_train_data(config.data, tokenizer, model.output_lengths, dist, config.train)
    valid_loader = build_valid_dataloader(config.data, world_size=dist.world_size, rank=dist.rank)

    # The running average (float64, on the CPU) of the model; the optimizer and schedule are the family's.
    model_avg = make_averaged_model(model) if dist.is_main else None
    logging.info("config: %s", config.to_dict())
    logging.info("number of model parameters: %d", sum(p.numel() for p in model.parameters()))

    writer = None
    if dist.is_main and options.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(exp_dir / "tensorboard"))
    run = Run(config, dist, tokenizer, train_data, valid_loader, trainee, model_avg,
              ProgressReport(options.log_interval, writer, options.accum_grad), after_step, start)
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
            raise NoTrainingBatches(no_batches_message(config.data, train_data.cut_filter.summary(),
                                                       train_data.world_size))
        if stopped_early:
            save(run, state, iteration_checkpoint_path(exp_dir, state.batch_idx_train))
            break
        validate(run, state)
        state.batches_per_epoch = state.batch_in_epoch
        state.batch_in_epoch = 0
        save(run, state, epoch_checkpoint_path(exp_dir, epoch))
    if writer is not None:
        writer.close()
    if state.best_valid_loss < float("inf"):
        logging.info("done: %d batches, best validation loss %.4f per frame", state.batch_idx_train,
                     state.best_valid_loss)
    else:
        logging.info("done: %d batches; no validation ran (it runs at the end of an epoch and every "
                     "train.valid_interval = %d batches)", state.batch_idx_train, options.valid_interval)
    if dist.world_size > 1:
        del run, trainee, scheduler, model, model_avg
        leave_distributed()


def finished_already(config: RunConfig) -> Optional[Path]:
    """The checkpoint that ends a resumable run (its last epoch's, or that of batch
    ``train.max_batches``) when it exists (nothing left to train), else None."""
    options = config.train
    if not options.auto_resume or options.start_epoch != 1 or options.start_batch != 0:
        return None
    last = [epoch_checkpoint_path(options.exp_dir, options.num_epochs)]
    if options.max_batches:
        last.append(iteration_checkpoint_path(options.exp_dir, options.max_batches))
    return next((path for path in last if path.is_file()), None)


def check_finished_config(path: Path, config: RunConfig, tokenizer: Tokenizer) -> None:
    """Refuse to call a run finished whose checkpoint ``path`` another configuration
    trained (a preset changed since): the model there is not the one asked for."""
    expected = dataclasses.replace(config, model=with_lexicon_size(config.model, tokenizer))
    saved = read_checkpoint_entry(path, "config")
    try:
        # A field the run's code did not have yet takes its default, the behaviour it had then.
        saved = RunConfig.from_dict(saved).to_dict()
    except ValueError:
        pass  # compared as saved: the first differing field is named below
    try:
        check_config_matches(saved, expected.to_dict(), source=path, ignore=CHANGEABLE_ON_RESUME)
    except CheckpointConfigMismatch as error:
        raise SystemExit(
            f"ERROR: {error}: that run finished under its own configuration; train into another "
            f"train.exp_dir, or move {Path(config.train.exp_dir)} aside to train it again") from None


def check_same_start(path: Path, init_from: str, start: str) -> None:
    """Refuse to resume, or to call finished, a run whose checkpoint ``path`` started from
    other weights than ``train.init_from``'s now (``start``, their digest): its stage before
    trained again since, and the run holds what came of the old start. Checkpoints written
    before runs recorded their start, and runs given no ``train.init_from`` now, pass."""
    try:
        saved = read_checkpoint_entry(path, "init_from_digest")
    except KeyError:
        return
    if init_from and saved != start:
        raise SystemExit(
            f"ERROR: train.init_from: the weights of {init_from} are not those {path} was trained from "
            f"(they changed since: their run trained again); train into another train.exp_dir, or move "
            f"{path.parent} aside to train from the new ones")


def with_lexicon_size(model_config: Any, tokenizer: Tokenizer) -> Any:
    """The model section with the lexicon's size and blank id, for a truthful saved config."""
    names = {f.name for f in dataclasses.fields(model_config)}
    values = {k: v for k, v in (("vocab_size", tokenizer.vocab_size), ("blank_id", tokenizer.blank_id)) if k in names}
    return dataclasses.replace(model_config, **values)




class NoTrainingBatches(RuntimeError):
    """The training cuts give no batch: the filters dropped them, or too few remain to fill one."""


def build_train_data(options: DataOptions, tokenizer: Tokenizer, output_frames: Callable[[int], int],
                     dist: Distributed, train: TrainOptions) -> RankGroup:
    """The training loaders of the ranks this process trains as (``train.virtual_ranks``
    of a world of processes x virtual_ranks); NoTrainingBatches if the filters leave fewer
    cuts than the sampler's buckets (Lhotse's bucket estimate asserts on that)."""
    count, seed = train.virtual_ranks, train.seed
    world_size, first_rank = dist.world_size * count, dist.rank * count
    try:
        parts = [build_train_dataloader(options, tokenizer, output_frames, seed=seed, world_size=world_size,
                                        rank=first_rank + index) for index in range(count)]
    except AssertionError as error:
        if "number of buckets" not in str(error):
            raise
        cut_filter = TrainingCutFilter(tokenizer, output_frames, options.min_cut_duration, options.max_cut_duration)
        for _ in load_cuts_lazy(options.train_cuts, "train_cuts", seed=seed).filter(cut_filter):
            pass
        raise NoTrainingBatches(no_batches_message(options, cut_filter.summary(), world_size)) from error
    if count > 1:
        logging.info("training as ranks %d-%d of %d (train.virtual_ranks=%d)", first_rank,
                     first_rank + count - 1, world_size, count)
    return RankGroup(parts, first_rank, world_size)


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




def train_one_epoch(run: Run, state: TrainingState) -> bool:
    """Train on the rest of the current epoch; True if ``train.max_batches`` stopped it."""
    options = run.config.train
    run.trainee.trained_model.train()
    update_batch = new_update_batch()
    # A round: one microbatch of each rank this process trains as (one, without virtual ranks).
    for batches, last_of_epoch in with_last_flag(run.train_data.rounds()):
        state.batch_in_epoch += 1
        update = state.batch_idx_train + 1
        update_batch["num_microbatches"] += 1
        ends_update = update_batch["num_microbatches"] == options.accum_grad or last_of_epoch
        for index, batch in enumerate(batches):
            targets = run.tokenizer.encode(batch["texts"])
            with run.train_data.random_state_of(index):
                loss_sum, frames, excluded = accumulate_gradients(
                    run.trainee, batch, targets, update, sync=ends_update and index == len(batches) - 1)
            audio_seconds = batch["feature_lens"].sum().item() * FRAME_SHIFT_SECONDS
            run.report.add(loss_sum, frames, audio_seconds, len(batch["texts"]), excluded)
            update_batch["cut_ids"].extend(batch["cut_ids"])
            update_batch["texts"].extend(batch["texts"])
            update_batch["microbatches"].append(batch)
        if not ends_update:
            continue
        apply_update(run.trainee, update)
        state.batch_idx_train = update
        if run.model_avg is not None:
            update_averaged_model(run.model_avg, run.model, state.batch_idx_train, options.average_period)
        if run.after_step is not None:
            run.after_step(run, update_batch, state)
        update_batch = new_update_batch()
        reported = run.report.maybe_report(
            epoch=state.epoch, batch_in_epoch=state.batch_in_epoch, batch_idx_train=state.batch_idx_train,
            lr=run.trainee.scheduler.get_last_lr()[0],
            grad_scale=run.trainee.scaler.get_scale() if run.trainee.scaler.is_enabled() else 1.0,
            batches_per_epoch=state.batches_per_epoch, max_batches=options.max_batches,
        )
        if reported is not None:
            state.train_losses.append((state.batch_idx_train, reported))
        if state.batch_idx_train % options.valid_interval == 0:
            validate(run, state)
        if options.max_batches and state.batch_idx_train >= options.max_batches:
            return True
        if options.save_every_n and state.batch_idx_train % options.save_every_n == 0:
            save(run, state, iteration_checkpoint_path(options.exp_dir, state.batch_idx_train))
    return False


def new_update_batch() -> dict:
    return {"cut_ids": [], "texts": [], "num_microbatches": 0, "microbatches": []}


@torch.no_grad()
def validate(run: Run, state: TrainingState) -> float:
    """Loss per encoder frame on the validation cuts, summed over all ranks."""
    run.model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=run.dist.device)
    for batch in run.valid_loader:
        feature_lens = batch["feature_lens"].to(run.dist.device)
        with autocast_context(run.trainee.precision, run.dist.device):
            loss, stats = run.model(batch["features"].to(run.dist.device), feature_lens,
                                    run.tokenizer.encode(batch["texts"]), return_stats=True)
        totals[0] += loss.item()
        totals[1] += contributing_frames(run.model, feature_lens, stats.excluded)
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
    rng_per_rank = gather_rng_states(run.dist, run.train_data)
    consolidate(run.trainee.optimizer)
    if not run.dist.is_main:
        return
    options = run.config.train
    save_checkpoint(
        path, model=run.model, config=run.config.to_dict(), batch_idx_train=state.batch_idx_train,
        epoch=state.epoch, model_avg=run.model_avg, average_period=options.average_period,
        optimizer=run.trainee.optimizer, scheduler=run.trainee.scheduler, grad_scaler=run.trainee.scaler,
        sampler_state=resumable_sampler_state(run.train_data.sampler, state.batch_in_epoch),
        extra={"rng_per_rank": rng_per_rank, "batch_in_epoch": state.batch_in_epoch,
               "batches_per_epoch": state.batches_per_epoch, "best_valid_loss": state.best_valid_loss,
               "train_losses": [list(entry) for entry in state.train_losses], "init_from_digest": run.start},
    )
    logging.info("saved %s", path)
    remove_old_checkpoints(options.exp_dir, options.keep_last_k)


def checkpoint_to_resume(options: TrainOptions) -> Optional[Path]:
    """The checkpoint named by ``train.start_batch`` / ``train.start_epoch``, else (with
    ``train.auto_resume``) the newest ``epoch-N.pt`` or ``checkpoint-B.pt`` of exp_dir."""
    if options.start_batch > 0:
        return iteration_checkpoint_path(options.exp_dir, options.start_batch)
    if options.start_epoch > 1:
        return epoch_checkpoint_path(options.exp_dir, options.start_epoch - 1)
    if not options.auto_resume:
        return None
    return newest_checkpoint(options.exp_dir)


def resume(run: Run) -> TrainingState:
    """Load the checkpoint of :func:`checkpoint_to_resume`, if any."""
    options = run.config.train
    path = checkpoint_to_resume(options)
    if path is None:
        run.train_data.share_random_state()
        return TrainingState()
    check_same_start(path, options.init_from, run.start)
    checkpoint = load_checkpoint(
        path, expected_config=run.config.to_dict(), ignore_config_fields=CHANGEABLE_ON_RESUME,
        model=run.model, model_avg=run.model_avg, optimizer=run.trainee.optimizer,
        scheduler=run.trainee.scheduler, grad_scaler=run.trainee.scaler,
    )
    group = run.train_data
    rng_states: List[Any] = checkpoint.get("rng_per_rank") or []
    if len(rng_states) == group.world_size:
        group.restore_random_states(rng_states[group.first_rank:group.first_rank + len(group)])
    else:
        group.share_random_state()
        logging.warning("%s was written by %d rank(s), this run has %d: RNG states not restored",
                        path, len(rng_states), group.world_size)
    state = TrainingState(
        epoch=checkpoint["epoch"], batch_idx_train=checkpoint["batch_idx_train"],
        batches_per_epoch=checkpoint.get("batches_per_epoch"),
        best_valid_loss=checkpoint.get("best_valid_loss", float("inf")),
        train_losses=[(int(update), float(loss)) for update, loss in checkpoint.get("train_losses", [])],
    )
    if not path.name.startswith("epoch-"):
        # Mid-epoch: continue the same epoch from the first batch not yet trained on (one
        # sampler state for every rank: Lhotse's holds the world's size, not the rank).
        sampler_world = checkpoint["sampler"].get("world_size", group.world_size)
        if sampler_world != group.world_size:
            raise SystemExit(
                f"ERROR: {path} continues a run of {sampler_world} rank(s) (processes x train.virtual_ranks) "
                f"mid-epoch; this run has {group.world_size}: resume with the same product, or from an epoch-N.pt")
        for part in group.parts:
            restore_sampler_state(part.sampler, checkpoint["sampler"])
        state.batch_in_epoch = checkpoint["batch_in_epoch"]
    else:
        state.epoch += 1
    logging.info("resumed from %s: epoch %d, global batch %d", path, state.epoch, state.batch_idx_train)
    return state


def gather_rng_states(dist: Distributed, group: RankGroup) -> List[Any]:
    """Every rank's RNG states (of the processes' virtual ranks too), in rank order
    (collective: all processes must call)."""
    states = group.random_states()
    if dist.world_size == 1:
        return states
    gathered: List[Any] = [None] * dist.world_size
    torch.distributed.all_gather_object(gathered, states)
    return [state for process_states in gathered for state in process_states]




def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a CTC model (Zipformer CTC, ...) with Pruned CTC.",
        epilog="Overrides: section.field=value, e.g. train.num_epochs=30 data.max_duration=600 model.preset=S",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="preset YAML with family and model/optim/data/train/decode sections")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides of the preset")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
