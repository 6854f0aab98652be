"""Lhotse manifests (RecordingSet, SupervisionSet) of a corpus, with Lhotse's own
recipe functions, checked input and all-or-nothing output.

The corpus is checked first (``local.corpus_checks``); Lhotse then writes into a
temporary folder inside ``output_dir`` and the finished files are renamed into place,
so ``output_dir`` never holds a half-written manifest.

    python -m local.prepare_manifests librispeech download/LibriSpeech data/manifests \\
        --parts dev-clean test-clean train-clean-100 --num-jobs 2
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from local import corpus_checks

CORPORA = ("librispeech", "aishell", "gigaspeech", "musan")
DEFAULT_PARTS = {
    "librispeech": (
        "dev-clean", "dev-other", "test-clean", "test-other",
        "train-clean-100", "train-clean-360", "train-other-500",
    ),
    "aishell": ("train", "dev", "test"),
    "gigaspeech": ("XL", "DEV", "TEST"),
    "musan": ("music", "noise", "speech"),
}


def manifest_paths(corpus: str, output_dir: Path, parts: Sequence[str]) -> List[Path]:
    """The files that make a complete preparation of ``parts``."""
    output_dir = Path(output_dir)
    names = []
    for part in parts:
        names.append(f"{corpus}_recordings_{part}.jsonl.gz")
        if corpus != "musan" or part == "music":
            names.append(f"{corpus}_supervisions_{part}.jsonl.gz")
    return [output_dir / name for name in names]


def _run_lhotse_recipe(
    corpus: str, corpus_dir: Path, output_dir: Path, parts: Sequence[str], num_jobs: int
) -> None:
    from lhotse.recipes import prepare_aishell, prepare_gigaspeech, prepare_librispeech, prepare_musan

    recipes: Dict[str, Callable[[], object]] = {
        "librispeech": lambda: prepare_librispeech(
            corpus_dir, dataset_parts=list(parts), output_dir=output_dir, num_jobs=num_jobs
        ),
        # prepare_aishell always makes train, dev and test.
        "aishell": lambda: prepare_aishell(corpus_dir, output_dir=output_dir),
        "gigaspeech": lambda: prepare_gigaspeech(
            corpus_dir, output_dir, dataset_parts=list(parts), num_jobs=num_jobs
        ),
        "musan": lambda: prepare_musan(corpus_dir, output_dir=output_dir, parts=list(parts)),
    }
    recipes[corpus]()


def _check_corpus(corpus: str, corpus_dir: Path, parts: Sequence[str]) -> None:
    if corpus == "librispeech":
        corpus_checks.check_librispeech(corpus_dir, parts)
    elif corpus == "aishell":
        corpus_checks.check_aishell(corpus_dir, parts)
    elif corpus == "gigaspeech":
        corpus_checks.check_gigaspeech(corpus_dir, parts)
    else:
        corpus_checks.check_musan(corpus_dir)


def prepare_manifests(
    corpus: str,
    corpus_dir: Path,
    output_dir: Path,
    parts: Sequence[str] = (),
    num_jobs: int = 1,
) -> List[Path]:
    """Writes ``<corpus>_{recordings,supervisions}_<part>.jsonl.gz`` into ``output_dir``
    and returns their paths. Does nothing when they all exist already."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; expected one of {CORPORA}")
    parts = list(parts) or list(DEFAULT_PARTS[corpus])
    if corpus == "aishell" and sorted(parts) != sorted(DEFAULT_PARTS["aishell"]):
        raise ValueError(f"AISHELL-1 is prepared as a whole: parts must be {DEFAULT_PARTS['aishell']}")
    corpus_dir, output_dir = Path(corpus_dir), Path(output_dir)
    expected = manifest_paths(corpus, output_dir, parts)
    if all(path.is_file() for path in expected):
        logging.info(f"{corpus} manifests of {parts} exist in {output_dir}: nothing to do")
        return expected
    _check_corpus(corpus, corpus_dir, parts)
    output_dir.mkdir(parents=True, exist_ok=True)
    scratch_prefix = f".{corpus}-preparing-"
    for stale in output_dir.glob(f"{scratch_prefix}*"):
        # Left by a run that was killed before it could clean up.
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=scratch_prefix) as scratch:
        scratch = Path(scratch)
        _run_lhotse_recipe(corpus, corpus_dir, scratch, parts, num_jobs)
        missing = [path.name for path in expected if not (scratch / path.name).is_file()]
        if missing:
            raise RuntimeError(f"Lhotse's prepare function for {corpus} did not write {missing}")
        for path in expected:
            os.replace(scratch / path.name, path)
    logging.info(f"wrote {len(expected)} {corpus} manifests to {output_dir}")
    return expected


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", choices=CORPORA)
    parser.add_argument("corpus_dir", type=Path)
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--parts", nargs="*", default=[], help="default: every part of the corpus")
    parser.add_argument("--num-jobs", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        prepare_manifests(args.corpus, args.corpus_dir, args.output_dir, args.parts, args.num_jobs)
    except corpus_checks.CorpusError as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
