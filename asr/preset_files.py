"""Reading preset files: YAML with up to five sections, and the base preset each may extend.

A preset may name a base preset as its first key, a path relative to its own folder::

    base: llm_ctc_base.yaml
    model:
      encoder_type: spear

The base is read first (and its own base before it, and so on), then each preset's
sections are merged over its base's key by key: a key the preset sets replaces the
base's, every other key is inherited; ``family`` likewise. A preset thus holds only what
differs from its base (or, without a base, from the schema's defaults). Command-line
overrides apply after the whole chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

PathLike = Union[str, Path]
SECTIONS = ("model", "optim", "data", "train", "decode")  # the sections of a run configuration

TOP_LEVEL_KEYS = ("base", "family") + SECTIONS


@dataclass
class PresetFile:
    """One file of a preset chain: its path and its own top-level keys (``base`` removed)."""

    path: Path
    document: Dict[str, Any]


def read_preset_chain(path: PathLike) -> List[PresetFile]:
    """The preset and its bases, the outermost base first and ``path`` last."""
    chain: List[PresetFile] = []
    current, named_by = Path(path), None
    while True:
        if current.resolve() in [preset.path.resolve() for preset in chain]:
            cycle = " -> ".join(str(preset.path) for preset in chain)
            raise ValueError(f"presets extend each other in a cycle: {cycle} -> {current}")
        if not current.is_file():
            if named_by is None:
                raise FileNotFoundError(f"--config: preset file not found: {current}")
            raise FileNotFoundError(f"{named_by}: base preset not found: {current}")
        document = _read_document(current)
        base = document.pop("base", None)
        chain.append(PresetFile(current, document))
        if base is None:
            return chain[::-1]
        if not isinstance(base, str) or not base.endswith((".yaml", ".yml")):
            raise ValueError(f"{current}: base must name a .yaml file (relative to {current.parent}), got {base!r}")
        current, named_by = current.parent / base, current


def merge_presets(chain: Sequence[PresetFile]) -> Dict[str, Any]:
    """The sections of a chain merged key by key, later files over earlier ones."""
    merged: Dict[str, Any] = {}
    for preset in chain:
        for name, value in preset.document.items():
            if name in SECTIONS:
                merged.setdefault(name, {}).update(value or {})
            else:
                merged[name] = value
    return merged


def _read_document(path: Path) -> Dict[str, Any]:
    import yaml

    document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a mapping with sections {list(SECTIONS)} at the top level")
    unknown = sorted(set(document) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; valid: 'base', 'family' and {list(SECTIONS)}")
    for name in SECTIONS:
        if not isinstance(document.get(name) or {}, dict):
            raise ValueError(f"{path}: section {name!r} must be a mapping, got {document[name]!r}")
    return document


__all__ = ["PresetFile", "read_preset_chain", "merge_presets", "TOP_LEVEL_KEYS"]
