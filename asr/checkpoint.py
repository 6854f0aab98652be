"""Checkpoints of a training run: atomic save, exact resume, configuration check.

Files in ``exp_dir`` (icefall's names, so existing tools find them):

* ``epoch-<N>.pt`` at the end of epoch N (1-based);
* ``checkpoint-<B>.pt`` every ``save_every_n`` batches, B = global batch count;
  only the newest ``keep_last_k`` of these are kept.

A model is saved and loaded through its ``checkpoint_state_dict()`` /
``load_checkpoint_state_dict()`` (:class:`asr.family.Recognizer`; an LLM family's hold the
trainable parameters only, the frozen parts named in the configuration) (:func:`model_weights`, :func:`load_model_weights`).

A checkpoint holds everything a resumed run needs to continue as if it had not
stopped: model, averaged model (:mod:`asr.averaging`), optimizer,
scheduler, grad scaler, sampler state, RNG states, ``batch_idx_train``, epoch and
the configuration the run was started with.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from asr.atomic_io import torch_save_atomically
from asr.config import PathLike
from asr.family import Recognizer
from asr.renamed_keys import translate_saved_config


_ITERATION_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")


class CheckpointConfigMismatch(ValueError):
    """A checkpoint was written by a run with a different configuration."""


# Version 2 (2026-11-23): relative positional encoding in icefall's sign convention. Files
# without a "format_version" entry are version 1 (mirrored convention); convert them with
# ``python -m zipformer.checkpoint_upgrade OLD.pt NEW.pt``.
CHECKPOINT_FORMAT_VERSION = 2


class CheckpointFormatError(ValueError):
    """A checkpoint was written in another format version than this code reads."""


def check_format_version(checkpoint: Any, path: PathLike) -> None:
    """Raise :class:`CheckpointFormatError` unless ``checkpoint`` is of the current version."""
    version = checkpoint.get("format_version", 1) if isinstance(checkpoint, dict) else None
    if version != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{path} is a checkpoint of format version {version}; this code reads version "
            f"{CHECKPOINT_FORMAT_VERSION} (icefall's positional-encoding sign). Convert it with: "
            f"python -m zipformer.checkpoint_upgrade {path} NEW.pt")


def model_weights(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """What a checkpoint holds of ``model``: a recognizer's ``checkpoint_state_dict()``
    (:class:`asr.family.Recognizer`), any other module's ``state_dict()``."""
    return model.checkpoint_state_dict() if isinstance(model, Recognizer) else model.state_dict()


def load_model_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Inverse of :func:`model_weights`."""
    if isinstance(model, Recognizer):
        model.load_checkpoint_state_dict(weights)
    else:
        model.load_state_dict(weights)


def epoch_checkpoint_path(exp_dir: PathLike, epoch: int) -> Path:
    """``<exp_dir>/epoch-<epoch>.pt``."""
    return Path(exp_dir) / f"epoch-{epoch}.pt"


def iteration_checkpoint_path(exp_dir: PathLike, batch_idx_train: int) -> Path:
    """``<exp_dir>/checkpoint-<batch_idx_train>.pt``."""
    return Path(exp_dir) / f"checkpoint-{batch_idx_train}.pt"


def capture_rng_state() -> Dict[str, Any]:
    """States of the python, numpy, torch CPU (and CUDA, if present) generators."""
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: PathLike,
    *,
    model: torch.nn.Module,
    config: Mapping[str, Any],
    batch_idx_train: int,
    epoch: int,
    model_avg: Optional[torch.nn.Module] = None,
    average_period: Optional[int] = None,
    optimizer: Optional[Any] = None,
    scheduler: Optional[Any] = None,
    grad_scaler: Optional[Any] = None,
    sampler_state: Optional[Mapping[str, Any]] = None,
    extra: Optional[Mapping[str, Any]] = None,
) -> Path:
    """Write a checkpoint atomically: a temporary file in the same folder, then a rename.

    A crash while writing never leaves a truncated ``path``, and an older file of
    the same name stays intact until the new one is complete. Only rank 0 should
    call this.

    Args:
        path: the destination, e.g. :func:`epoch_checkpoint_path`.
        model: the trained model (unwrap DDP first).
        config: the run's configuration as a plain (nested) dict of builtins;
            :func:`load_checkpoint` compares it with the resuming run's.
        batch_idx_train: number of optimizer steps taken so far (global batch count).
        epoch: current epoch, 1-based.
        model_avg: the running float64 average (:class:`asr.averaging.RunningAverage`
            module) or None.
        average_period: the period, in batches, of ``model_avg`` updates; needed
            for exact averaging between two checkpoints.
        optimizer, scheduler, grad_scaler: anything with ``state_dict()``.
        sampler_state: the state of the training sampler
            (:func:`asr.data.resumable_sampler_state`).
        extra: more picklable entries (e.g. best validation loss).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    if model_avg is not None and average_period is None:
        raise ValueError("save_checkpoint: model_avg given without average_period")
    contents: Dict[str, Any] = {
        "model": model_weights(model),
        "model_avg": None if model_avg is None else model_avg.state_dict(),
        "average_period": average_period,
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "grad_scaler": None if grad_scaler is None else grad_scaler.state_dict(),
        "sampler": None if sampler_state is None else dict(sampler_state),
        "rng": capture_rng_state(),
        "batch_idx_train": int(batch_idx_train),
        "epoch": int(epoch),
        "config": dict(config),
        "format_version": CHECKPOINT_FORMAT_VERSION,
    }
    if extra:
        clashing = set(extra) & set(contents)
        if clashing:
            raise ValueError(f"save_checkpoint: extra entries {sorted(clashing)} clash with built-in ones")
        contents.update(extra)
    torch_save_atomically(contents, path)
    return path


def load_checkpoint(
    path: PathLike,
    *,
    expected_config: Optional[Mapping[str, Any]] = None,
    ignore_config_fields: Tuple[str, ...] = (),
    model: Optional[torch.nn.Module] = None,
    model_avg: Optional[torch.nn.Module] = None,
    optimizer: Optional[Any] = None,
    scheduler: Optional[Any] = None,
    grad_scaler: Optional[Any] = None,
    restore_rng: bool = False,
    map_location: Union[str, torch.device] = "cpu",
) -> Dict[str, Any]:
    """Read a checkpoint and load it into the given objects.

    Args:
        path: the checkpoint file.
        expected_config: the resuming run's configuration; any field whose value
            differs from the checkpoint's (dotted names for nested dicts) raises
            :class:`CheckpointConfigMismatch` naming it, before anything is loaded.
        ignore_config_fields: dotted field names allowed to differ (e.g. ``"num_epochs"``).
        model, model_avg, optimizer, scheduler, grad_scaler: loaded in place if given.
        restore_rng: also restore the python/numpy/torch RNG states.
        map_location: passed to ``torch.load``.

    Returns:
        The whole checkpoint dict (``batch_idx_train``, ``epoch``, ``sampler``, ...).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    check_format_version(checkpoint, path)
    if expected_config is not None:
        check_config_matches(
            checkpoint.get("config", {}), expected_config, source=path, ignore=ignore_config_fields
        )
    if model is not None:
        load_model_weights(model, checkpoint["model"])
    if model_avg is not None:
        if checkpoint.get("model_avg") is None:
            raise KeyError(f"{path} has no model_avg entry to load")
        model_avg.load_state_dict(checkpoint["model_avg"])
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler), ("grad_scaler", grad_scaler)):
        if target is None:
            continue
        if checkpoint.get(name) is None:
            raise KeyError(f"{path} has no {name} state to load")
        target.load_state_dict(checkpoint[name])
    if restore_rng:
        restore_rng_state(checkpoint["rng"])
    return checkpoint


def check_config_matches(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    source: PathLike,
    ignore: Tuple[str, ...] = (),
) -> None:
    """Raise :class:`CheckpointConfigMismatch` naming the first differing field."""
    saved_fields = dict(_flatten(translate_saved_config(saved)))
    current_fields = dict(_flatten(translate_saved_config(current)))
    missing = object()
    for name in sorted(set(saved_fields) | set(current_fields)):
        if name in ignore or any(name.startswith(prefix + ".") for prefix in ignore):
            continue
        before = saved_fields.get(name, missing)
        now = current_fields.get(name, missing)
        if before is missing or now is missing or before != now:
            raise CheckpointConfigMismatch(
                f"checkpoint {source} comes from another configuration: field '{name}' is "
                f"{_describe(before, missing)} in the checkpoint but {_describe(now, missing)} "
                f"in this run"
            )


def read_checkpoint_entry(path: PathLike, name: str) -> Any:
    """One entry of a checkpoint (``config``, ``batch_idx_train``, ...), read through a
    memory map so that its tensors are not loaded."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    if not isinstance(checkpoint, dict) or name not in checkpoint:
        raise KeyError(f"{path} has no '{name}' entry: was it written by asr.train?")
    return checkpoint[name]


def list_epoch_checkpoints(exp_dir: PathLike) -> List[Tuple[int, Path]]:
    """``(epoch, path)`` of every ``epoch-<N>.pt``, newest (largest N) first."""
    exp_dir = Path(exp_dir)
    found = [(int(m.group(1)), entry) for entry in (exp_dir.iterdir() if exp_dir.is_dir() else [])
             if (m := re.fullmatch(r"epoch-(\d+)\.pt", entry.name))]
    return sorted(found, reverse=True)


def list_iteration_checkpoints(exp_dir: PathLike) -> List[Tuple[int, Path]]:
    """``(batch_idx_train, path)`` of every ``checkpoint-<B>.pt``, newest (largest B) first."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        return []
    found = []
    for entry in exp_dir.iterdir():
        match = _ITERATION_CHECKPOINT.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def remove_old_checkpoints(exp_dir: PathLike, keep_last_k: int) -> List[Path]:
    """Delete all but the ``keep_last_k`` newest ``checkpoint-<B>.pt`` files.

    ``epoch-<N>.pt`` files are never touched. ``keep_last_k <= 0`` keeps everything.

    Returns:
        The deleted paths.
    """
    if keep_last_k <= 0:
        return []
    removed = []
    for _, path in list_iteration_checkpoints(exp_dir)[keep_last_k:]:
        path.unlink(missing_ok=True)
        removed.append(path)
    if removed:
        logging.info("removed %d old checkpoint(s), kept the last %d", len(removed), keep_last_k)
    return removed


def _flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[Tuple[str, Any]]:
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, prefix=name + ".")
        else:
            yield name, list(value) if isinstance(value, tuple) else value


def _describe(value: Any, missing: object) -> str:
    return "absent" if value is missing else repr(value)
