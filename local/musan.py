"""MUSAN noise for data augmentation: manifests of its music, noise and speech parts
and their features, cut into 10 s windows, keeping windows longer than 5 s.

    python -m local.musan data/manifests data/fbank --num-jobs 2
    python -m local.musan data/manifests data/fbank128 --num-mel-bins 128   # SPEAR, Qwen3-ASR

The noise is mixed in the feature domain (Lhotse ``CutMix``), so its features must have
the bin count of the training features they are mixed into: 80 for the Zipformer, 128
for the SPEAR and Qwen3-ASR encoders of the LLM recipes (paper App. D.3-D.4; App. D.2
trains the LLM systems with MUSAN).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

from lhotse import CutSet, RecordingSet, load_manifest

from local.compute_fbank import NUM_MEL_BINS, compute_fbank

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


def compute_musan_fbank(manifest_dir: Path, fbank_dir: Path, num_jobs: int = 1,
                        num_mel_bins: int = NUM_MEL_BINS) -> Path:
    """Writes ``musan_cuts.jsonl.gz`` and ``musan_feats`` (``num_mel_bins``-bin fbank)
    into ``fbank_dir``; an existing ``musan_cuts.jsonl.gz`` of another bin count is an
    error naming both."""
    if num_mel_bins < 1:
        raise ValueError(f"--num-mel-bins must be >= 1, got {num_mel_bins}")
    output_cuts = Path(fbank_dir) / "musan_cuts.jsonl.gz"
    if output_cuts.is_file():
        found = next(iter(load_manifest(output_cuts))).num_features
        if found != num_mel_bins:
            raise ValueError(f"{output_cuts} holds {found}-bin features, not the {num_mel_bins} asked for: "
                             "give another fbank_dir (or delete it to recompute)")
        logging.info(f"{output_cuts} exists: MUSAN features already computed, skipping")
        return output_cuts
    return compute_fbank(musan_windows(manifest_dir), output_cuts, Path(fbank_dir) / "musan_feats", num_jobs,
                         num_mel_bins=num_mel_bins)


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("manifest_dir", type=Path, help="holds musan_recordings_<part>.jsonl.gz")
    parser.add_argument("fbank_dir", type=Path)
    parser.add_argument("--num-jobs", type=int, default=1)
    parser.add_argument("--num-mel-bins", type=int, default=NUM_MEL_BINS,
                        help="bins of the training features the noise is mixed into (128: SPEAR, Qwen3-ASR)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        compute_musan_fbank(args.manifest_dir, args.fbank_dir, args.num_jobs, args.num_mel_bins)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
