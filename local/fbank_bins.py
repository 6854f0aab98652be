"""Fbank with another number of mel bins for cuts whose 80-bin features a recipe already
prepares: the 128-bin features that SPEAR-XLarge v2 and Qwen3-ASR take (paper App. D.3:
128-dim FBank; App. D.4: 128-dim log-mel FBank, 25 ms window, 10 ms hop).

Each input is a manifest of whole recordings named ``<prefix>_cuts_<part>_raw.jsonl.gz``
or a training piece ``<prefix>_cuts_<part>_raw.<index>.jsonl.gz``; the output is
``<out-dir>/<prefix>_cuts_<part>[.<index>].jsonl.gz``, one cut per supervision, with the
features in ``<out-dir>/<prefix>_feats_<part>[_<index>]``. A finished output is skipped,
so the command resumes where it stopped, and ranges of pieces can run in parallel:

    python -m local.fbank_bins --num-mel-bins 128 --out-dir data/fbank128 \\
        data/fbank/gigaspeech_cuts_DEV_raw.jsonl.gz data/fbank/gigaspeech_cuts_TEST_raw.jsonl.gz
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path
from typing import List, Sequence, Tuple

_RAW = re.compile(r"^(?P<prefix>.+)_cuts_(?P<part>.+)_raw(?:\.(?P<index>\d+))?\.jsonl\.gz$")


def outputs_of(raw: Path, out_dir: Path) -> Tuple[Path, Path]:
    """(cuts with features, feature storage) for one raw manifest."""
    match = _RAW.match(raw.name)
    if match is None:
        raise ValueError(f"{raw}: expected a name like <prefix>_cuts_<part>_raw[.<index>].jsonl.gz")
    prefix, part, index = match.group("prefix"), match.group("part"), match.group("index")
    suffix = f".{index}" if index is not None else ""
    return (out_dir / f"{prefix}_cuts_{part}{suffix}.jsonl.gz",
            out_dir / f"{prefix}_feats_{part}{'_' + index if index is not None else ''}")


def compute(raw_manifests: Sequence[Path], out_dir: Path, num_mel_bins: int, num_jobs: int = 1) -> List[Path]:
    from lhotse import load_manifest

    from local.compute_fbank import compute_fbank

    if num_mel_bins < 1:
        raise ValueError(f"--num-mel-bins must be >= 1, got {num_mel_bins}")
    missing = [str(p) for p in raw_manifests if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"raw cut manifests not found (run the data stages first): {missing[:3]}")
    planned = [(Path(raw), *outputs_of(Path(raw), out_dir)) for raw in raw_manifests]
    out_dir.mkdir(parents=True, exist_ok=True)
    began, outputs = time.time(), []
    for done, (raw, output_cuts, storage) in enumerate(planned, 1):
        compute_fbank(load_manifest(raw), output_cuts, storage, num_jobs, trim_to_supervisions=True,
                      num_mel_bins=num_mel_bins)
        outputs.append(output_cuts)
        elapsed = time.time() - began
        logging.info(f"{num_mel_bins}-bin fbank {done}/{len(planned)} ({raw.name}) done; {elapsed:.0f} s elapsed, "
                     f"about {(len(planned) - done) * elapsed / done:.0f} s to go")
    return outputs


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw_manifests", type=Path, nargs="+", help="<prefix>_cuts_<part>_raw[.<index>].jsonl.gz")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--num-mel-bins", type=int, default=128)
    parser.add_argument("--num-jobs", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        compute(args.raw_manifests, args.out_dir, args.num_mel_bins, args.num_jobs)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
