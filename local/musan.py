"""MUSAN noise for data augmentation: manifests of its music, noise and speech parts
and their features, cut into 10 s windows, keeping windows longer than 5 s.

    python -m local.musan data/manifests data/fbank --num-jobs 2
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

from lhotse import CutSet, RecordingSet, load_manifest

from local.compute_fbank import compute_fbank

MUSAN_PARTS = ("music", "noise", "speech")
WINDOW_SECONDS = 10.0
MIN_WINDOW_SECONDS = 5.0


def musan_windows(manifest_dir: Path, parts: Sequence[str] = MUSAN_PARTS) -> CutSet:
    """Cuts of every MUSAN recording, in windows of 10 s; windows of 5 s or less are dropped."""
    manifest_dir = Path(manifest_dir)
    recordings = []
    for part in parts:
        path = manifest_dir / f"musan_recordings_{part}.jsonl.gz"
        if not path.is_file():
            raise FileNotFoundError(f"MUSAN manifest {path} does not exist (run the MUSAN manifest stage first)")
        recordings.extend(load_manifest(path))
    cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings))
    windows = cuts.cut_into_windows(WINDOW_SECONDS)
    return CutSet.from_cuts(cut for cut in windows if cut.duration > MIN_WINDOW_SECONDS)


def compute_musan_fbank(manifest_dir: Path, fbank_dir: Path, num_jobs: int = 1) -> Path:
    """Writes ``musan_cuts.jsonl.gz`` and ``musan_feats`` into ``fbank_dir``."""
    output_cuts = Path(fbank_dir) / "musan_cuts.jsonl.gz"
    if output_cuts.is_file():
        logging.info(f"{output_cuts} exists: MUSAN features already computed, skipping")
        return output_cuts
    return compute_fbank(musan_windows(manifest_dir), output_cuts, Path(fbank_dir) / "musan_feats", num_jobs)


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest_dir", type=Path, help="holds musan_recordings_<part>.jsonl.gz")
    parser.add_argument("fbank_dir", type=Path)
    parser.add_argument("--num-jobs", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        compute_musan_fbank(args.manifest_dir, args.fbank_dir, args.num_jobs)
    except FileNotFoundError as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
