"""Checkpoints of LLM-CTC / LLM-CE models: trainable parameters plus the config.

The frozen parts (LLM, head, speech encoder, tokenizer) are named in the config by
path or hub name and rebuilt from there, so an 8B backbone is never copied into a
checkpoint; only LoRA, projector, query vector and blank offset are stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import torch

from llm_ctc.build import build_model
from llm_ctc.config import LLMASRConfig

PathLike = Union[str, Path]


def checkpoint_contents(model, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    contents = {"config": {"model": model.config.to_dict()}, "trainable": model.checkpoint_state_dict()}
    if extra:
        clashing = set(extra) & set(contents)
        if clashing:
            raise ValueError(f"extra entries {sorted(clashing)} clash with the checkpoint's own")
        contents.update(extra)
    return contents


def save_model_checkpoint(path: PathLike, model, extra: Optional[Mapping[str, Any]] = None) -> Path:
    """Write config + trainable parameters atomically (temporary name, then rename)."""
    from asr.atomic_io import torch_save_atomically

    path = Path(path)
    torch_save_atomically(checkpoint_contents(model, extra), path)
    return path


def load_model_checkpoint(path: PathLike, tokenizer=None, map_location: str = "cpu"):
    """Rebuild the model from the checkpoint's config and load its trainable parameters."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LLM checkpoint not found: {path}")
    checkpoint = torch.load(path, map_location=map_location, weights_only=False)
    if not isinstance(checkpoint, dict) or "trainable" not in checkpoint or "model" not in checkpoint.get(
            "config", {}):
        raise ValueError(f"{path} is not an LLM-CTC/LLM-CE checkpoint (expected 'config'/'model' and "
                         "'trainable' entries)")
    model = build_model(LLMASRConfig.from_dict(checkpoint["config"]["model"]), tokenizer=tokenizer)
    model.load_checkpoint_state_dict(checkpoint["trainable"])
    return model
