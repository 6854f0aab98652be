"""The token table ``tokens.txt`` (icefall format: ``symbol id`` per line) and the
training transcripts that token inventories are learned from."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, List

from asr.atomic_io import atomic_output
from asr.tokenizer import read_tokens, write_tokens  # noqa: F401  (the recipes' token tables)

BLANK = "<blk>"
SOS_EOS = "<sos/eos>"
UNK = "<unk>"
# Ids 0, 1, 2 in every table of the project: the CTC blank must be 0.
SPECIAL_SYMBOLS = (BLANK, SOS_EOS, UNK)


def manifest_texts(manifests: Iterable[Path]) -> Iterator[str]:
    """Texts of every supervision in supervision or cut manifests, in order."""
    from lhotse import CutSet, load_manifest_lazy

    for path in manifests:
        if not Path(path).is_file():
            raise FileNotFoundError(f"manifest {path} does not exist (run the earlier stages first)")
        manifest = load_manifest_lazy(path)
        supervisions = (
            (s for cut in manifest for s in cut.supervisions) if isinstance(manifest, CutSet) else manifest
        )
        for supervision in supervisions:
            if supervision.text and supervision.text.strip():
                yield supervision.text.strip()


def write_transcript(manifests: Iterable[Path], path: Path) -> Path:
    """One transcript per line (``transcript_words.txt``), from the given manifests."""
    manifests = list(manifests)
    lines: List[str] = list(manifest_texts(manifests))
    if not lines:
        raise ValueError(f"the manifests {manifests} hold no transcript text")
    with atomic_output(path) as partial:
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return Path(path)
