"""Features of a very large cut set (GigaSpeech XL) in pieces: split the cuts
manifest into pieces of ``chunk_size`` cuts, then compute the features of a range of
pieces. Finished pieces are skipped, so the work resumes after an interruption, and
several processes can share it by taking disjoint ranges (``--start``/``--stop``).
Before training, ``check`` says whether every piece has its features (here, or the
features of another stage in another folder, under the same names).

    python -m local.feature_pieces split data/fbank/gigaspeech_cuts_XL_raw.jsonl.gz \\
        data/fbank/gigaspeech_XL_split --chunk-size 50
    python -m local.feature_pieces compute data/fbank/gigaspeech_XL_split --start 0 --stop 100
    python -m local.feature_pieces check data/fbank/gigaspeech_XL_split --finish "stages 5 and 6"
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

from lhotse import load_manifest, load_manifest_lazy

from local.compute_fbank import compute_fbank

RAW_SUFFIX = "_raw"
_PIECE_PATTERN = re.compile(r"^(?P<prefix>.+)_raw\.(?P<index>\d+)\.jsonl\.gz$")
DONE_MARK = ".split.done"


def split_into_pieces(raw_cuts: Path, split_dir: Path, chunk_size: int) -> List[Path]:
    """``<name>_raw.jsonl.gz`` -> ``split_dir/<name>_raw.<index>.jsonl.gz``, ``chunk_size``
    cuts each. The pieces appear together (written in a scratch folder, then moved)."""
    raw_cuts, split_dir = Path(raw_cuts), Path(split_dir)
    if (split_dir / DONE_MARK).is_file():
        logging.info(f"{split_dir} is split already: skipping")
        return raw_pieces(split_dir)
    if not raw_cuts.is_file():
        raise FileNotFoundError(f"cuts manifest {raw_cuts} does not exist (run the preprocessing stage first)")
    if chunk_size < 1:
        raise ValueError(f"chunk size must be positive, found {chunk_size}")
    prefix = raw_cuts.name[: -len(".jsonl.gz")]
    if not prefix.endswith(RAW_SUFFIX):
        raise ValueError(f"expected a manifest named <name>{RAW_SUFFIX}.jsonl.gz, found {raw_cuts.name}")
    split_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=split_dir, prefix=".splitting-") as scratch:
        load_manifest_lazy(raw_cuts).split_lazy(scratch, chunk_size=chunk_size, prefix=prefix)
        for piece in sorted(Path(scratch).glob("*.jsonl.gz")):
            os.replace(piece, split_dir / piece.name)
    (split_dir / DONE_MARK).touch()
    pieces = raw_pieces(split_dir)
    logging.info(f"split {raw_cuts} into {len(pieces)} pieces of up to {chunk_size} cuts in {split_dir}")
    return pieces


def raw_pieces(split_dir: Path) -> List[Path]:
    return sorted(p for p in Path(split_dir).glob("*.jsonl.gz") if _PIECE_PATTERN.match(p.name))


def piece_outputs(raw_piece: Path):
    """(cuts with features, feature storage) of one raw piece."""
    match = _PIECE_PATTERN.match(raw_piece.name)
    prefix, index = match.group("prefix"), match.group("index")
    feats_prefix = prefix.replace("_cuts_", "_feats_")
    return (
        raw_piece.with_name(f"{prefix}.{index}.jsonl.gz"),
        raw_piece.with_name(f"{feats_prefix}_{index}"),
    )


def pieces_without_features(split_dir: Path, features_dir: Optional[Path] = None) -> List[Path]:
    """The raw pieces of a finished split whose cuts with features are missing: beside
    them, or in ``features_dir`` under the same names (e.g. 128-bin features)."""
    split_dir = Path(split_dir)
    if not (split_dir / DONE_MARK).is_file():
        raise FileNotFoundError(f"{split_dir}: not split (no {DONE_MARK})")
    folder = None if features_dir is None else Path(features_dir)
    return [piece for piece in raw_pieces(split_dir)
            if not (piece_outputs(piece)[0] if folder is None else folder / piece_outputs(piece)[0].name).is_file()]


def compute_pieces(split_dir: Path, start: int = 0, stop: int = None, num_jobs: int = 1) -> List[Path]:
    """Computes features of pieces ``start <= index < stop`` (all when stop is None),
    trimmed to supervisions, skipping finished pieces unread; returns the cut manifests
    of that range."""
    pieces = raw_pieces(split_dir)
    if not (Path(split_dir) / DONE_MARK).is_file() or not pieces:
        raise FileNotFoundError(f"{split_dir} holds no finished split (run the split stage first)")
    stop = len(pieces) if stop is None or stop < 0 else min(stop, len(pieces))
    if not 0 <= start < stop:
        raise ValueError(f"--start {start} --stop {stop}: expected 0 <= start < stop <= {len(pieces)}")
    todo = [index for index in range(start, stop) if not piece_outputs(pieces[index])[0].is_file()]
    if not todo:
        logging.info(f"fbank of pieces [{start}, {stop}): all done, skipping")
    began = time.time()
    for done, index in enumerate(todo, 1):
        output_cuts, storage = piece_outputs(pieces[index])
        compute_fbank(load_manifest(pieces[index]), output_cuts, storage, num_jobs, trim_to_supervisions=True)
        elapsed = time.time() - began
        remaining = (len(todo) - done) * elapsed / done
        logging.info(
            f"piece {index + 1}/{stop} ({done} of the {len(todo)} unfinished in this range) done; "
            f"{elapsed:.0f} s elapsed, about {remaining:.0f} s to go"
        )
    return [piece_outputs(piece)[0] for piece in pieces[start:stop]]


def check_pieces(split_dir: Path, features_dir: Optional[Path] = None, finish: str = "the feature stages") -> str:
    """A line saying that every piece has its features; ValueError naming how many lack
    them (or that the split is missing) and ``finish``, the stages that make them."""
    where = "" if features_dir is None else f" in {features_dir}"
    try:
        missing = pieces_without_features(split_dir, features_dir)
    except FileNotFoundError as error:
        raise ValueError(f"{error}: finish {finish} first") from None
    total = len(raw_pieces(split_dir))
    if missing or not total:
        raise ValueError(f"{len(missing)} of {total} piece(s) of {split_dir} without features{where}: "
                         f"finish {finish} first")
    return f"all {total} pieces of {split_dir} have features{where}"


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    split = commands.add_parser("split")
    split.add_argument("raw_cuts", type=Path)
    split.add_argument("split_dir", type=Path)
    split.add_argument("--chunk-size", type=int, default=50, help="cuts (whole recordings) per piece")
    compute = commands.add_parser("compute")
    compute.add_argument("split_dir", type=Path)
    compute.add_argument("--start", type=int, default=0, help="first piece index")
    compute.add_argument("--stop", type=int, default=-1, help="one past the last piece index (-1: all)")
    compute.add_argument("--num-jobs", type=int, default=1)
    check = commands.add_parser("check")
    check.add_argument("split_dir", type=Path)
    check.add_argument("--features-dir", type=Path, default=None,
                       help="where the pieces' features are (default: beside the raw pieces)")
    check.add_argument("--finish", default="the feature stages", help="what makes them, for the error message")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "split":
            split_into_pieces(args.raw_cuts, args.split_dir, args.chunk_size)
        elif args.command == "compute":
            compute_pieces(args.split_dir, args.start, args.stop, args.num_jobs)
        else:
            logging.info(check_pieces(args.split_dir, args.features_dir, args.finish))
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
