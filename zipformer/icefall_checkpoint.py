"""Reading icefall checkpoint files: ``pretrained.pt`` (``{"model": state_dict}``), training
checkpoints ``epoch-N.pt`` / ``checkpoint-N.pt`` (``model``, ``model_avg`` and the training
arguments as top-level entries) or a bare state dict. Used by the Zipformer import
(:mod:`zipformer.icefall_import`) and by SPEAR (:mod:`zipformer.spear`)."""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any, Dict, Mapping

import torch

from zipformer.icefall_state_dict import IcefallCheckpointError

WEIGHT_ENTRIES = ("model", "model_avg")


class _Placeholder:
    """Stands for a class of icefall's (e.g. AttributeDict) that is not installed here."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __setstate__(self, state) -> None:
        self.__dict__["state"] = state


class _LenientUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (_Placeholder,), {})


_LENIENT_PICKLE = types.SimpleNamespace(Unpickler=_LenientUnpickler, load=pickle.load,
                                        __name__="lenient_pickle")


def load_icefall_checkpoint(path: Path, allow_pickle: bool = False) -> Mapping[str, Any]:
    """The checkpoint as a dict; tensors only unless ``allow_pickle``."""
    if not path.is_file():
        raise FileNotFoundError(f"--checkpoint: file not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if not allow_pickle:
            raise IcefallCheckpointError(
                f"{path} holds Python objects besides tensors (icefall training checkpoints "
                "store their arguments); if you trust the file, rerun with --allow-pickle "
                f"({str(error).splitlines()[0]})") from None
        checkpoint = torch.load(path, map_location="cpu", weights_only=False,
                                pickle_module=_LENIENT_PICKLE)
    if not isinstance(checkpoint, Mapping):
        raise IcefallCheckpointError(f"{path} holds a {type(checkpoint).__name__}, expected a dict")
    return checkpoint


def select_weights(checkpoint: Mapping[str, Any], entry: str, path: Path) -> Dict[str, torch.Tensor]:
    if all(isinstance(v, torch.Tensor) for v in checkpoint.values()) and entry not in checkpoint:
        if entry != "model":
            raise IcefallCheckpointError(f"{path} is a bare state dict: it has no '{entry}' entry")
        return dict(checkpoint)  # a bare state dict
    weights = checkpoint.get(entry)
    if not isinstance(weights, Mapping) or not weights:
        present = [k for k in WEIGHT_ENTRIES if isinstance(checkpoint.get(k), Mapping)]
        raise IcefallCheckpointError(f"{path} has no '{entry}' weights (it has: {present or 'none'})")
    return {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}


def saved_training_args(checkpoint: Mapping[str, Any]) -> Dict[str, Any]:
    """icefall's epoch-N.pt stores its training arguments as top-level entries."""
    return {k: v for k, v in checkpoint.items()
            if k not in WEIGHT_ENTRIES and isinstance(v, (str, int, list, tuple))}
