"""Test sets as the decoders name them: ``decode.test_cuts`` items (``NAME=PATH`` or
``PATH``) and the cuts each holds."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import List, Tuple

from asr.cut_filters import cut_text
from asr.data import load_cuts_lazy


def parse_test_sets(text: str) -> List[Tuple[str, Path]]:
    """``NAME=PATH`` or ``PATH`` items, comma separated; a path's name is what follows
    ``_cuts_`` in its file name (``librispeech_cuts_test-clean.jsonl.gz`` -> ``test-clean``,
    ``dev_cuts.jsonl.gz`` -> ``dev``)."""
    test_sets = []
    for item in (piece.strip() for piece in text.split(",")):
        if not item:
            continue
        name, _, path = item.rpartition("=")
        path = Path(path)
        if not name:
            stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
            name = stem.rpartition("_cuts_")[2] if "_cuts_" in stem else stem.removesuffix("_cuts")
        if not path.is_file():
            raise FileNotFoundError(f"decode.test_cuts: cut manifest not found: {path}")
        test_sets.append((name, path))
    if not test_sets:
        raise ValueError(f"decode.test_cuts: no cut manifest given ({text!r})")
    names = [name for name, _ in test_sets]
    if len(set(names)) != len(names):
        raise ValueError(f"decode.test_cuts: test set names {names} repeat; name them as NAME=PATH")
    return test_sets


def count_cuts(manifest: Path) -> Tuple[int, float]:
    """Number of cuts with a transcript and their total duration in seconds (one lazy pass)."""
    opener = gzip.open if manifest.name.endswith(".gz") else open
    with opener(manifest, "rt", encoding="utf-8") as lines:
        if not any(line.strip() for line in lines):
            return 0, 0.0  # Lhotse cannot read an empty manifest back
    count, seconds = 0, 0.0
    for cut in load_cuts_lazy(manifest, "decode.test_cuts"):
        if cut_text(cut) is not None:
            count += 1
            seconds += cut.duration
    return count, seconds
