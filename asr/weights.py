"""Which trained weights a program uses, and the trained model built from them: one rule
for the decoder (:mod:`asr.decode`), the exports, streaming and single-file transcription.

* :func:`newest_checkpoint`: the checkpoint furthest into training (the most optimizer
  updates; an epoch checkpoint after a batch checkpoint of the same count), the one a
  resumed run continues from and whose configuration a decoder reads when given none.
* :func:`choose_weights`: icefall's choice (``decode.epoch`` or ``decode.iter``, each a
  number or ``last``; ``decode.avg``; ``decode.use_averaged_model``): the checkpoint
  files, their configuration (which must agree) and the suffix of result file names.
* :func:`load_trained_model`: choose -> lexicon -> build the family's model -> load the
  (averaged) weights -> prepare for decoding.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import torch

from asr.averaging import decoding_checkpoint_paths, weights_for_decoding
from asr.checkpoint import (CheckpointConfigMismatch, check_config_matches, list_epoch_checkpoints,
                            list_iteration_checkpoints, load_model_weights, read_checkpoint_entry)
from asr.config import CHANGEABLE_ON_RESUME, DecodeOptions, PathLike, RunConfig
from asr.family import Recognizer, load_family
from asr.tokenizer import Tokenizer


def checkpoint_position(path: Path) -> Optional[Tuple[int, int]]:
    """Where a checkpoint stands in training, comparable between epoch and batch
    checkpoints (the global batch count it holds; an epoch checkpoint after a batch one of
    the same count), or None for another file."""
    match = re.fullmatch(r"(epoch|checkpoint)-(\d+)\.pt", path.name)
    if match is None:
        return None
    batch_count = read_checkpoint_entry(path, "batch_idx_train")
    return (int(batch_count), 1 if match.group(1) == "epoch" else 0)


def newest_checkpoint(exp_dir: PathLike) -> Optional[Path]:
    """The ``epoch-<N>.pt`` or ``checkpoint-<B>.pt`` of ``exp_dir`` furthest into
    training, or None when there is none."""
    candidates = [(position, path) for path in Path(exp_dir).glob("*.pt")
                  if (position := checkpoint_position(path)) is not None]
    return max(candidates)[1] if candidates else None


def saved_run_config(exp_dir: PathLike, overrides: Sequence[str] = ()) -> RunConfig:
    """The configuration saved with the newest checkpoint of ``exp_dir``, with overrides."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise FileNotFoundError(f"train.exp_dir: experiment folder not found: {exp_dir}")
    newest = newest_checkpoint(exp_dir)
    if newest is None:
        raise FileNotFoundError(f"no epoch-*.pt or checkpoint-*.pt in {exp_dir}")
    return RunConfig.from_dict(read_checkpoint_entry(newest, "config"), overrides)


def explicit_choice(overrides: Sequence[str]) -> List[str]:
    """``overrides`` plus ``decode.iter=0`` where they name ``decode.epoch`` but not
    ``decode.iter``: an epoch asked for on the command line wins over an ``iter`` that a
    preset or the saved run holds."""
    keys = {override.partition("=")[0].strip() for override in overrides}
    if "decode.epoch" in keys and "decode.iter" not in keys:
        return list(overrides) + ["decode.iter=0"]
    return list(overrides)


@dataclass
class Weights:
    """The chosen checkpoint(s) and the configuration they were trained with."""

    epoch: int  # the chosen epoch-<epoch>.pt, or 0
    iteration: int  # the chosen checkpoint-<iteration>.pt, or 0
    avg: int
    use_averaged_model: bool
    paths: List[Path]  # oldest first; the last one is the chosen checkpoint
    suffix: str  # icefall's part of the result file names, e.g. epoch-30_avg-15_use-averaged-model
    saved: RunConfig  # relative paths resolved where the run was trained (resolve_run_paths)

    def resolve(self, path: Optional[str]) -> Optional[str]:
        """A path as the run named it, found from here (:func:`resolve_path`)."""
        exp_dir = self.paths[-1].parent
        return resolve_path(path, run_directory(exp_dir, self.saved.train.exp_dir), exp_dir.resolve())

    def state_dict(self) -> dict:
        """The (averaged) weights: what :func:`asr.checkpoint.load_model_weights` loads."""
        return weights_for_decoding(self.paths[-1].parent, epoch=self.epoch, iteration=self.iteration,
                                    avg=self.avg, use_averaged_model=self.use_averaged_model)


def choose_weights(exp_dir: PathLike, options: DecodeOptions) -> Weights:
    """Resolve ``last`` and find the files to average; their configurations must agree."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise FileNotFoundError(f"train.exp_dir: experiment folder not found: {exp_dir}")
    if options.iter != "0":
        iteration = _resolve_last(options.iter, list_iteration_checkpoints(exp_dir), exp_dir, "checkpoint-*.pt")
        epoch, suffix = 0, f"iter-{iteration}_avg-{options.avg}"
    else:
        epoch = _resolve_last(options.epoch, list_epoch_checkpoints(exp_dir), exp_dir, "epoch-*.pt")
        iteration, suffix = 0, f"epoch-{epoch}_avg-{options.avg}"
    suffix += "_use-averaged-model" if options.use_averaged_model else ""
    paths = decoding_checkpoint_paths(exp_dir, epoch=epoch, iteration=iteration, avg=options.avg,
                                      use_averaged_model=options.use_averaged_model)
    chosen = read_checkpoint_entry(paths[-1], "config")
    for path in paths[:-1]:
        try:
            check_config_matches(read_checkpoint_entry(path, "config"), chosen, source=path, ignore=CHANGEABLE_ON_RESUME)
        except CheckpointConfigMismatch as error:
            raise ValueError(f"{error} {paths[-1]} (cannot average checkpoints of different models)") from None
    return Weights(epoch, iteration, options.avg, options.use_averaged_model, paths, suffix,
                   resolve_run_paths(RunConfig.from_dict(chosen), exp_dir))


def run_directory(exp_dir: PathLike, saved_exp_dir: PathLike) -> Optional[Path]:
    """The folder the run was trained from: ``exp_dir`` without the relative
    ``train.exp_dir`` the run saved (``egs/mini`` for ``egs/mini/exp/m`` saved as ``exp/m``),
    wherever the checkout now lies; None when the saved folder is absolute or does not match."""
    saved = [part for part in Path(saved_exp_dir).parts if part != "."]
    if Path(saved_exp_dir).is_absolute() or not saved:
        return None
    actual = Path(exp_dir).resolve().parts
    if list(actual[-len(saved):]) != saved:
        return None
    return Path(*actual[:-len(saved)])


def resolve_path(value: Optional[str], *bases: Optional[Path]) -> Optional[str]:
    """``value`` as it is when absolute or found from here; else the first of ``bases``
    under which it exists (absolute then); else unchanged (e.g. a hub name)."""
    if not value or Path(value).is_absolute() or Path(value).exists():
        return value
    for base in bases:
        if base is not None and (base / value).exists():
            return str((base / value).resolve())
    return value


def resolve_run_paths(saved: RunConfig, exp_dir: PathLike) -> RunConfig:
    """``saved`` with its relative paths (the family's ``path_fields``, ``train.lang_dir``)
    resolved from where the run was trained, so that a trained model loads from any
    working directory."""
    bases = (run_directory(exp_dir, saved.train.exp_dir), Path(exp_dir).resolve())
    fields = {name: resolve_path(vars(saved.model)[name], *bases)
              for name in load_family(saved.family).path_fields}
    saved.model = dataclasses.replace(saved.model, **fields) if fields else saved.model
    saved.train = dataclasses.replace(saved.train, lang_dir=resolve_path(saved.train.lang_dir, *bases))
    return saved


def _resolve_last(value: str, found: List[Tuple[int, Path]], exp_dir: Path, pattern: str) -> int:
    if value != "last":
        return int(value)
    if not found:
        raise FileNotFoundError(f"'last' asks for the newest {pattern} of {exp_dir}, but there is none")
    return found[0][0]


def load_lexicon(lang_dir: PathLike, saved: RunConfig) -> Tokenizer:
    """The tokenizer of ``lang_dir`` (or the family's own); ValueError unless its size is
    the trained model's output size."""
    try:
        tokenizer = load_family(saved.family).tokenizer(saved.model, lang_dir)
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(f"train.lang_dir: {error}") from None
    trained_size = vars(saved.model).get("vocab_size", tokenizer.vocab_size)
    if tokenizer.vocab_size != trained_size:
        raise ValueError(f"train.lang_dir {lang_dir} has {tokenizer.vocab_size} tokens but the model was trained "
                         f"with field 'model.vocab_size' = {trained_size}: give the lang dir used for training")
    return tokenizer


@dataclass
class TrainedModel:
    """A trained model ready to decode (eval mode, :meth:`Recognizer.prepare_for_decoding`
    done), its lexicon and the weights it was loaded from."""

    model: Recognizer
    tokenizer: Tokenizer
    weights: Weights


def load_trained_model(exp_dir: PathLike, options: DecodeOptions, lang_dir: Optional[PathLike] = None,
                       device: Any = "cpu") -> TrainedModel:
    """The model of ``exp_dir`` with the weights ``options`` choose (:func:`choose_weights`),
    its lexicon from ``lang_dir`` (default: the run's ``train.lang_dir``, or the family's own)."""
    weights = choose_weights(exp_dir, options)
    lang_dir = weights.saved.train.lang_dir if lang_dir is None else weights.resolve(str(lang_dir))
    tokenizer = load_lexicon(lang_dir, weights.saved)
    return TrainedModel(build_trained_model(weights, tokenizer, device), tokenizer, weights)


def build_trained_model(weights: Weights, tokenizer: Tokenizer, device: Any = "cpu") -> Recognizer:
    """The family's model with the chosen (averaged) weights, prepared for decoding, in eval mode."""
    model = load_family(weights.saved.family).build(weights.saved.model, tokenizer.vocab_size, tokenizer.blank_id)
    load_model_weights(model, weights.state_dict())
    model.prepare_for_decoding()
    return model.to(torch.device(device)).eval()
