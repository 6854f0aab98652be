"""Convert a checkpoint of format version 1 to version 2 (the current one).

Version 1 checkpoints were written while the relative positional encoding used the
mirrored sign convention: row m of the table embedded the offset (query - key) where
icefall (and version 2) embed (key - query). The sine columns of the table are odd in
the offset and the cosine columns and the constant last column even, so negating the
sine columns of every ``linear_pos`` weight makes a version-1 model compute exactly what
it computed before. The other changes of version 2 (gradient-only limits, balancer and
whitening placement) touch no weights. Version 2 also holds the configuration of
:mod:`asr.config` (a ``family`` and an ``optim`` section for the ScaledAdam/Eden settings
that version 1 kept in ``train``; pruned_ctc's default chunk size and beam as None).

``model`` and ``model_avg`` are converted; optimizer, scheduler and gradient-scaler
states are dropped (the optimizer's moments of the converted columns would have the
wrong sign), so the result decodes, averages and initializes fine-tuning, but a
training run cannot resume from it with its optimizer state.

Usage: python -m zipformer.checkpoint_upgrade OLD.pt NEW.pt
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from asr.atomic_io import torch_save_atomically
from asr.checkpoint import CHECKPOINT_FORMAT_VERSION

LINEAR_POS_SUFFIX = "attention_weights.linear_pos.weight"
OPTIM_FIELDS_OF_VERSION_1 = ("base_lr", "lr_batches", "lr_epochs", "warmup_batches", "warmup_start", "clipping_scale")
# Version 1 restated pruned_ctc's defaults; version 2 leaves them to the library.
LIBRARY_DEFAULTS_OF_VERSION_1 = {"chunk_size": 4096, "beam": 100.0}
DROPPED_ON_UPGRADE = ("optimizer", "scheduler", "grad_scaler")


def mirror_positional_weights(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A copy with the sine columns (1, 3, ..., pos_dim - 3) of every linear_pos weight
    negated; the last column multiplies the constant 1 and stays."""
    converted = dict(state_dict)
    for name, weight in state_dict.items():
        if name.endswith(LINEAR_POS_SUFFIX):
            weight = weight.clone()
            weight[:, 1:-1:2] = -weight[:, 1:-1:2]
            converted[name] = weight
    return converted


def upgrade_config(config: dict) -> dict:
    """A version-1 run configuration in the sections of version 2."""
    config = {name: dict(section) for name, section in config.items() if isinstance(section, dict)}
    train, model = config.setdefault("train", {}), config.setdefault("model", {})
    config["optim"] = {name: train.pop(name) for name in OPTIM_FIELDS_OF_VERSION_1 if name in train}
    for name, default in LIBRARY_DEFAULTS_OF_VERSION_1.items():
        if model.get(name) == default:
            model[name] = None
    return {"family": "zipformer", **config}


def upgrade(checkpoint: dict, source: Path) -> dict:
    version = checkpoint.get("format_version", 1)
    if version == CHECKPOINT_FORMAT_VERSION:
        raise ValueError(f"{source} is already of format version {version}: nothing to convert")
    if version != 1:
        raise ValueError(f"{source} has format version {version}; this program converts version 1")
    if not any(name.endswith(LINEAR_POS_SUFFIX) for name in checkpoint.get("model") or {}):
        raise ValueError(f"{source}: its 'model' entry has no '*.{LINEAR_POS_SUFFIX}' weight: "
                         "not a checkpoint of this project's Zipformer")
    upgraded = dict(checkpoint)
    for entry in ("model", "model_avg"):
        if upgraded.get(entry) is not None:
            upgraded[entry] = mirror_positional_weights(upgraded[entry])
    for entry in DROPPED_ON_UPGRADE:
        upgraded[entry] = None
    if isinstance(upgraded.get("config"), dict):
        upgraded["config"] = upgrade_config(upgraded["config"])
    upgraded["format_version"] = CHECKPOINT_FORMAT_VERSION
    return upgraded


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Convert a version-1 checkpoint to version 2.")
    parser.add_argument("old", type=Path, help="checkpoint of format version 1")
    parser.add_argument("new", type=Path, help="where to write the version-2 checkpoint")
    args = parser.parse_args(argv)
    if not args.old.is_file():
        raise SystemExit(f"ERROR: checkpoint not found: {args.old}")
    if args.new.resolve() == args.old.resolve():
        raise SystemExit("ERROR: NEW must differ from OLD (the original is kept)")
    checkpoint = torch.load(args.old, map_location="cpu", weights_only=False)
    try:
        upgraded = upgrade(checkpoint, args.old)
    except ValueError as error:
        raise SystemExit(f"ERROR: {error}") from None
    torch_save_atomically(upgraded, args.new)
    print(f"wrote {args.new} (format version {CHECKPOINT_FORMAT_VERSION}); optimizer, scheduler "
          "and grad-scaler states dropped: decode or fine-tune from it, do not resume")


if __name__ == "__main__":
    main()
