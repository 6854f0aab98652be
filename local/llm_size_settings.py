"""The settings a Qwen3 size adds to a recipe's LLM preset (paper App. D.3: activation
checkpointing, learning rate, microbatch and accumulation by size).

They live in overlay presets beside it, ``llm_<objective>_<size>.yaml`` (e.g.
``egs/gigaspeech/conf/llm_ctc_32b.yaml``), each extending a base that the preset extends
too. Given the preset and the LLM's hub name or folder, this prints the overlay's own
settings for the size in the name as ``section.field=value`` overrides on one line, or
nothing when the size has no overlay (0.6B-8B in the paper's configurations)::

    python -m local.llm_size_settings egs/gigaspeech/conf/llm_ctc_spear.yaml Qwen/Qwen3-32B
    model.activation_checkpointing=true optim.lr=5e-05
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import List, Optional, Sequence

from asr.config import SECTIONS, format_value, load_run_config, section_to_dict
from asr.preset_files import read_preset_chain

# "Qwen/Qwen3-14B", "qwen3-0.6b-base", a folder named "Qwen3-32B": the parameter count.
_SIZE = re.compile(r"-(\d+(?:\.\d+)?b)(?![0-9a-z])")


def qwen3_size(llm: str) -> Optional[str]:
    """The size in an LLM's hub name or folder name, lowercased (``'32b'``), or None."""
    match = _SIZE.search(Path(llm.rstrip("/")).name.lower())
    return match.group(1) if match else None


def size_overlay(preset: Path, llm: str) -> Optional[Path]:
    """The overlay of ``llm``'s size for ``preset`` (checked to extend one of its bases), or None."""
    size = qwen3_size(llm)
    if size is None:
        return None
    objective = load_run_config(preset).model.objective
    overlay = preset.parent / f"llm_{objective}_{size}.yaml"
    if not overlay.is_file():
        return None
    bases = [p.path.resolve() for p in read_preset_chain(preset)]
    chain = read_preset_chain(overlay)
    if len(chain) < 2 or chain[-2].path.resolve() not in bases:
        extends = chain[-2].path if len(chain) > 1 else "no base"
        raise ValueError(f"{overlay}: extends {extends}, which {preset} does not extend: its settings are not "
                         "an overlay of this preset")
    return overlay


def overlay_settings(overlay: Path) -> List[str]:
    """The ``section.field=value`` settings a preset file sets itself (not its bases')."""
    own = read_preset_chain(overlay)[-1].document
    if "family" in own:
        raise ValueError(f"{overlay}: an overlay keeps its base's family; remove 'family'")
    config = load_run_config(overlay)
    settings = []
    for section in SECTIONS:
        values = section_to_dict(getattr(config, section))
        for key in own.get(section) or {}:
            value = format_value(values[key])
            if not value or any(c.isspace() for c in value):
                raise ValueError(f"{overlay}: {section}.{key}={value!r} cannot be a shell word")
            settings.append(f"{section}.{key}={value}")
    return settings


def size_settings(preset: Path, llm: str) -> List[str]:
    """The settings of ``llm``'s size for ``preset`` (empty without an overlay), checked to apply."""
    overlay = size_overlay(Path(preset), llm)
    if overlay is None:
        return []
    settings = overlay_settings(overlay)
    load_run_config(preset, settings)
    return settings


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", type=Path, help="the LLM preset, e.g. conf/llm_ctc_spear.yaml")
    parser.add_argument("llm", help="the LLM's hub name or folder (run.sh --llm)")
    args = parser.parse_args(argv)
    try:
        print(" ".join(size_settings(args.preset, args.llm)))
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"ERROR: {error}") from None


if __name__ == "__main__":
    main()
