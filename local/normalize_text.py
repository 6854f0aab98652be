"""Transcript normalization, for training text and for scoring.

Only GigaSpeech needs it: LibriSpeech's upper-case text is used as it is, and
``prepare_aishell`` already removes the word spaces of AISHELL-1. GigaSpeech's ``text_tn`` carries tags. For training, segments whose text has a
garbage tag (``<SIL>``, ``<MUSIC>``, ``<NOISE>``, ``<OTHER>``) are dropped and the
punctuation tags are deleted. For scoring, the official GigaSpeech normalization
(:func:`asr.scoring.normalize_gigaspeech_text`) also removes conversational fillers and
``<UNK>`` and splits hyphenated words; the decoder applies it to reference and
hypothesis alike.

    python -m local.normalize_text gigaspeech data/manifests data/fbank --subsets XL DEV TEST
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

from asr.scoring import GIGASPEECH_GARBAGE_UTTERANCE_TAGS, GIGASPEECH_PUNCTUATION_TAGS


def gigaspeech_training_text(text: str) -> Optional[str]:
    """The training transcript of one GigaSpeech segment, or None when the segment
    is garbage (a garbage tag anywhere in it)."""
    words = text.split()
    if any(word in GIGASPEECH_GARBAGE_UTTERANCE_TAGS for word in words):
        return None
    return " ".join(word for word in words if word not in GIGASPEECH_PUNCTUATION_TAGS)


def preprocess_gigaspeech(recordings: Path, supervisions: Path, output_cuts: Path) -> Path:
    """Writes whole-recording cuts whose supervisions carry training text; garbage
    supervisions are dropped. Skips when ``output_cuts`` exists."""
    from lhotse import CutSet, SupervisionSet, load_manifest

    from asr.atomic_io import atomic_output

    output_cuts = Path(output_cuts)
    if output_cuts.is_file():
        logging.info(f"{output_cuts} exists: skipping")
        return output_cuts
    supervision_set = load_manifest(supervisions)
    kept, dropped = [], 0
    for segment in supervision_set:
        text = gigaspeech_training_text(segment.text or "")
        if text is None or not text:
            dropped += 1
            continue
        kept.append(replace(segment, text=text))
    logging.info(f"{supervisions}: kept {len(kept)} supervisions, dropped {dropped} garbage ones")
    if not kept:
        raise ValueError(f"every supervision of {supervisions} is garbage: nothing to train on")
    cuts = CutSet.from_manifests(
        recordings=load_manifest(recordings), supervisions=SupervisionSet.from_segments(kept)
    ).filter(lambda cut: len(cut.supervisions) > 0)
    with atomic_output(output_cuts) as partial:
        cuts.to_file(partial)
    return output_cuts


def preprocess_gigaspeech_subsets(manifest_dir: Path, fbank_dir: Path, subsets: Sequence[str]) -> None:
    """``gigaspeech_{recordings,supervisions}_<subset>`` -> ``gigaspeech_cuts_<subset>_raw``."""
    for subset in subsets:
        recordings = Path(manifest_dir) / f"gigaspeech_recordings_{subset}.jsonl.gz"
        supervisions = Path(manifest_dir) / f"gigaspeech_supervisions_{subset}.jsonl.gz"
        for path in (recordings, supervisions):
            if not path.is_file():
                raise FileNotFoundError(f"manifest {path} does not exist (run the manifest stage first)")
        preprocess_gigaspeech(recordings, supervisions, Path(fbank_dir) / f"gigaspeech_cuts_{subset}_raw.jsonl.gz")


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", choices=("gigaspeech",))
    parser.add_argument("manifest_dir", type=Path)
    parser.add_argument("fbank_dir", type=Path)
    parser.add_argument("--subsets", nargs="+", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        preprocess_gigaspeech_subsets(args.manifest_dir, args.fbank_dir, args.subsets)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
