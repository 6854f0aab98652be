"""Model averaging as icefall does it: a running average while training, and the
weights a decoder uses (``--epoch/--iter``, ``--avg``, ``--use-averaged-model``).

Running average. Every ``average_period`` (P) batches, at ``batch_idx_train`` = kP,

    model_avg <- model_avg * (1 - P / (kP)) + model * P / (kP),

so after k updates ``model_avg`` is the plain mean of the k snapshots of the
weights taken at batches P, 2P, ..., kP. It is kept in float64 on rank 0 and saved
in every checkpoint next to ``batch_idx_train``.

Exact average between two checkpoints. With n = floor(batch_idx_train / P) * P
(the batches a running average covers), the mean of the snapshots taken after the
start checkpoint and up to the end one is

    (model_avg_end * n_end - model_avg_start * n_start) / (n_end - n_start).

icefall rounds only n_start; rounding n_end as well keeps the result exact when
an epoch does not end on a multiple of P (both agree when it does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import torch

from asr.config import PathLike

from asr.checkpoint import (
    check_format_version,
    epoch_checkpoint_path,
    iteration_checkpoint_path,
    list_iteration_checkpoints,
    model_weights,
)

StateDict = Dict[str, torch.Tensor]


class AveragedWeights:
    """The running average of what a checkpoint holds of a model: float64 copies of those
    tensors only (never of the frozen weights next to them)."""

    def __init__(self, weights: StateDict) -> None:
        self._weights = {name: tensor.detach().to(torch.float64 if tensor.is_floating_point() else tensor.dtype,
                                                  copy=True) for name, tensor in weights.items()}

    def state_dict(self) -> StateDict:
        """The live tensors (updated in place by :func:`update_averaged_model`)."""
        return self._weights

    def load_state_dict(self, state: StateDict) -> None:
        missing, unexpected = sorted(set(self._weights) - set(state)), sorted(set(state) - set(self._weights))
        if missing or unexpected:
            raise KeyError(f"averaged weights do not fit this model: missing {missing[:5]}, unexpected "
                           f"{unexpected[:5]}")
        for name, tensor in state.items():
            self._weights[name].copy_(tensor)


def make_averaged_model(model: torch.nn.Module) -> AveragedWeights:
    """Float64 copies of what a checkpoint holds of ``model`` (:func:`asr.checkpoint.model_weights`:
    e.g. only LoRA, projector, query and blank offset next to a frozen LLM) that hold the
    running average."""
    return AveragedWeights(model_weights(model))


@torch.no_grad()
def update_averaged_model(
    model_avg: "AveragedWeights",
    model: torch.nn.Module,
    batch_idx_train: int,
    average_period: int,
) -> bool:
    """Fold the current weights into ``model_avg`` when ``batch_idx_train`` is a multiple of P.

    Args:
        model_avg: from :func:`make_averaged_model`, updated in place.
        model: the model being trained (DDP unwrapped).
        batch_idx_train: number of optimizer steps taken so far (after this batch's step).
        average_period: P, in batches (icefall: 200).

    Returns:
        True if an update happened.
    """
    if average_period <= 0:
        raise ValueError(f"average_period must be positive, got {average_period}")
    if batch_idx_train <= 0 or batch_idx_train % average_period != 0:
        return False
    weight = average_period / batch_idx_train
    current = model_weights(model)
    seen_storage = set()
    for name, average in model_avg.state_dict().items():
        if name not in current:
            raise KeyError(f"update_averaged_model: '{name}' is in model_avg but not in the model")
        if average.is_floating_point():
            # Tied parameters share one storage: update it once.
            if average.data_ptr() in seen_storage:
                continue
            seen_storage.add(average.data_ptr())
            # model_avg may live on the CPU while the model trains on a GPU.
            source = current[name].to(device=average.device, dtype=average.dtype)
            average.mul_(1.0 - weight).add_(source, alpha=weight)
        else:
            average.copy_(current[name].to(average.device))
    return True


def average_checkpoints(paths: Sequence[PathLike], entry: str = "model") -> StateDict:
    """Element-wise mean of the ``entry`` weights of several checkpoints (``--avg`` without
    ``--use-averaged-model``).

    Floating tensors are summed in float64 and returned in their saved dtype;
    integer buffers (counters) are taken from the last path.
    """
    if not paths:
        raise ValueError("average_checkpoints: no checkpoint paths given")
    total: StateDict = {}
    dtypes: Dict[str, torch.dtype] = {}
    for path in paths:
        weights = _load_entry(path, entry)
        for name, tensor in weights.items():
            if tensor.is_floating_point():
                dtypes[name] = tensor.dtype
                total[name] = total.get(name, 0) + tensor.to(torch.float64)
            else:
                total[name] = tensor
    return {
        name: (tensor / len(paths)).to(dtypes[name]) if name in dtypes else tensor
        for name, tensor in total.items()
    }


def average_between_checkpoints(start_path: PathLike, end_path: PathLike) -> StateDict:
    """Exact mean of the weights snapshotted after ``start_path`` and up to ``end_path``,
    from their ``model_avg`` entries (``--use-averaged-model``).

    Returns tensors in the dtype of the end checkpoint's ``model`` entry.
    """
    start = _load(start_path)
    end = _load(end_path)
    for path, checkpoint in ((start_path, start), (end_path, end)):
        if checkpoint.get("model_avg") is None or checkpoint.get("average_period") is None:
            raise KeyError(f"{path} has no model_avg/average_period: it cannot be used with --use-averaged-model")
    period = int(end["average_period"])
    if int(start["average_period"]) != period:
        raise ValueError(
            f"average_period differs: {start['average_period']} in {start_path}, {period} in {end_path}"
        )
    n_start = (int(start["batch_idx_train"]) // period) * period
    n_end = (int(end["batch_idx_train"]) // period) * period
    if n_end <= n_start:
        raise ValueError(
            f"no averaging update between {start_path} (batch {start['batch_idx_train']}) and "
            f"{end_path} (batch {end['batch_idx_train']}) with average_period {period}"
        )
    result: StateDict = {}
    for name, average_end in end["model_avg"].items():
        target_dtype = end["model"][name].dtype if name in end["model"] else average_end.dtype
        if not average_end.is_floating_point():
            # Counters are not averaged: take the end checkpoint's current value.
            result[name] = end["model"].get(name, average_end)
            continue
        summed_end = average_end.to(torch.float64) * n_end
        summed_start = start["model_avg"][name].to(torch.float64) * n_start
        result[name] = ((summed_end - summed_start) / (n_end - n_start)).to(target_dtype)
    return result


def weights_for_decoding(
    exp_dir: PathLike,
    *,
    epoch: int = 0,
    iteration: int = 0,
    avg: int = 1,
    use_averaged_model: bool = True,
) -> StateDict:
    """The model weights selected by a decoder's ``--epoch/--iter --avg --use-averaged-model``.

    * ``iteration > 0``: ``checkpoint-<iteration>.pt`` and the older ``checkpoint-*.pt``;
      otherwise ``epoch-<epoch>.pt`` and earlier epochs.
    * ``use_averaged_model``: the exact average between the checkpoint ``avg`` steps
      back (epoch E-A, or the A-th older iteration checkpoint) and the chosen one.
    * otherwise: the plain mean of the ``avg`` newest checkpoints up to the chosen one.

    Raises:
        FileNotFoundError: naming the missing checkpoint file.
        ValueError: ``avg`` < 1, or epoch E - A < 1 with ``use_averaged_model``.
    """
    paths = decoding_checkpoint_paths(exp_dir, epoch=epoch, iteration=iteration, avg=avg,
                                      use_averaged_model=use_averaged_model)
    if use_averaged_model:
        return average_between_checkpoints(paths[0], paths[-1])
    return average_checkpoints(paths)


def decoding_checkpoint_paths(exp_dir: PathLike, *, epoch: int = 0, iteration: int = 0, avg: int = 1,
                              use_averaged_model: bool = True) -> List[Path]:
    """The checkpoint files :func:`weights_for_decoding` reads, oldest first (the last one is
    the chosen checkpoint)."""
    if avg < 1:
        raise ValueError(f"decode.avg must be >= 1, got {avg}")
    if iteration > 0:
        return _iteration_paths(exp_dir, iteration, avg + 1 if use_averaged_model else avg)
    return _epoch_paths(exp_dir, epoch, avg, use_averaged_model)


def _epoch_paths(exp_dir: PathLike, epoch: int, avg: int, use_averaged_model: bool) -> List[Path]:
    if epoch < 1:
        raise ValueError(f"--epoch must be >= 1 (or give --iter), got {epoch}")
    if use_averaged_model:
        if epoch - avg < 1:
            raise ValueError(
                f"--use-averaged-model needs epoch-{epoch - avg}.pt as start: --epoch {epoch} "
                f"minus --avg {avg} must be >= 1"
            )
        paths = [epoch_checkpoint_path(exp_dir, epoch - avg), epoch_checkpoint_path(exp_dir, epoch)]
    else:
        if epoch - avg + 1 < 1:
            raise ValueError(f"--avg {avg} reaches before epoch 1 from --epoch {epoch}")
        paths = [epoch_checkpoint_path(exp_dir, e) for e in range(epoch - avg + 1, epoch + 1)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint needed for averaging not found: {path}")
    return paths


def _iteration_paths(exp_dir: PathLike, iteration: int, count: int) -> List[Path]:
    """``count`` iteration checkpoints ending at ``checkpoint-<iteration>.pt``, oldest first."""
    chosen = iteration_checkpoint_path(exp_dir, iteration)
    if not chosen.is_file():
        raise FileNotFoundError(f"checkpoint needed for averaging not found: {chosen}")
    older = [path for batch, path in list_iteration_checkpoints(exp_dir) if batch <= iteration]
    if len(older) < count:
        raise FileNotFoundError(
            f"averaging needs {count} checkpoint-*.pt files up to {chosen.name} in {exp_dir}, "
            f"found {len(older)}: {[p.name for p in older]}"
        )
    return list(reversed(older[:count]))


def _load(path: PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint needed for averaging not found: {path}")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    check_format_version(checkpoint, path)
    return checkpoint


def _load_entry(path: PathLike, entry: str) -> StateDict:
    checkpoint = _load(path)
    if checkpoint.get(entry) is None:
        raise KeyError(f"{path} has no '{entry}' entry")
    return checkpoint[entry]
