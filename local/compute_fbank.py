"""80-dim log-mel filterbank features of a CutSet, stored with Lhotse's
``LilcomChunkyWriter``, with optional speed perturbation.

The cuts manifest is the completion mark: it is written under a temporary name and
renamed at the end, so an interrupted run leaves no cuts manifest and the next run
computes the features again.

    python -m local.compute_fbank parts librispeech data/manifests data/fbank \\
        --parts dev-clean train-clean-100 --perturbed-parts train-clean-100 --speed-perturb 0.9,1.1
    python -m local.compute_fbank raw-parts gigaspeech data/fbank --parts DEV TEST
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from lhotse import CutSet, Fbank, FbankConfig, LilcomChunkyWriter

from asr.atomic_io import atomic_output, temporary_name

NUM_MEL_BINS = 80


def cuts_from_manifests(recordings: Path, supervisions: Optional[Path] = None) -> CutSet:
    """One cut per recording (eager: features need sorted, countable cuts)."""
    from lhotse import load_manifest

    recording_set = load_manifest(recordings)
    supervision_set = load_manifest(supervisions) if supervisions else None
    return CutSet.from_manifests(recordings=recording_set, supervisions=supervision_set)


def _one_thread() -> None:
    torch.set_num_threads(1)


def speed_perturbed(cuts: CutSet, factors: Sequence[float]) -> CutSet:
    """The original cuts followed by one copy per factor (ids get a ``_sp<factor>``
    suffix from Lhotse)."""
    result = cuts
    for factor in factors:
        if factor != 1.0:
            result = result + cuts.perturb_speed(factor)
    return result


def compute_fbank(
    cuts: CutSet,
    output_cuts: Path,
    storage_path: Path,
    num_jobs: int = 1,
    speed_factors: Sequence[float] = (),
    trim_to_supervisions: bool = False,
    num_mel_bins: int = NUM_MEL_BINS,
) -> Path:
    """Computes features of ``cuts`` (and their speed-perturbed copies) into
    ``storage_path`` and writes the cuts with features to ``output_cuts``.

    ``trim_to_supervisions``: after computing features of whole recordings, keep one
    cut per supervision (GigaSpeech's long podcasts). ``num_mel_bins``: 128 for the
    SPEAR and Qwen3-ASR encoders (paper App. D.3-D.4). Returns ``output_cuts``.
    Does nothing when ``output_cuts`` exists.
    """
    output_cuts, storage_path = Path(output_cuts), Path(storage_path)
    if output_cuts.is_file():
        logging.info(f"{output_cuts} exists: features already computed, skipping")
        return output_cuts
    if len(cuts) == 0:
        raise ValueError(f"no cuts to compute features for ({output_cuts})")
    torch.set_num_threads(1)
    storage_path.parent.mkdir(parents=True, exist_ok=True)
    cuts = speed_perturbed(cuts, speed_factors)
    extractor = Fbank(FbankConfig(num_mel_bins=num_mel_bins))
    # Leftovers of an interrupted run: the storage is rewritten from the start.
    for stale in (storage_path, Path(f"{storage_path}.lca"), temporary_name(output_cuts)):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    logging.info(f"computing fbank of {len(cuts)} cuts into {storage_path}")
    executor = None
    if num_jobs > 1:
        # Workers are spawned (they re-import this module, not the caller's script) and
        # limited to one torch thread each, so num_jobs processes share the cores.
        executor = ProcessPoolExecutor(num_jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_one_thread)
    with executor or contextlib.nullcontext():
        with_features = cuts.compute_and_store_features(
            extractor=extractor,
            storage_path=storage_path,
            num_jobs=num_jobs,
            storage_type=LilcomChunkyWriter,
            executor=executor,
        )
    _require_every_cut(cuts, with_features, output_cuts)
    if trim_to_supervisions:
        with_features = with_features.trim_to_supervisions(keep_overlapping=False)
    with atomic_output(output_cuts) as partial:
        with_features.to_file(partial)
    logging.info(f"wrote {output_cuts}")
    return output_cuts


def _require_every_cut(cuts: CutSet, with_features: CutSet, output_cuts: Path) -> None:
    """Lhotse logs and skips a cut whose audio cannot be read; a manifest silently
    missing utterances is worse than a stop, so name them and stop."""
    done = {cut.id for cut in with_features}
    missing = [cut for cut in cuts if cut.id not in done]
    if missing:
        sources = sorted({source.source for cut in missing for source in cut.recording.sources})
        raise RuntimeError(
            f"features of {len(missing)} cuts for {output_cuts} could not be computed because their "
            f"audio did not load, e.g. cut {missing[0].id}; audio files: {sources[:5]}"
        )


def compute_fbank_of_parts(
    corpus: str,
    manifest_dir: Path,
    fbank_dir: Path,
    parts: Sequence[str],
    perturbed_parts: Sequence[str] = (),
    speed_factors: Sequence[float] = (),
    num_jobs: int = 1,
) -> List[Path]:
    """``<corpus>_{recordings,supervisions}_<part>`` manifests -> ``<corpus>_cuts_<part>``
    with features in ``<corpus>_feats_<part>``; ``perturbed_parts`` also get one copy
    of every cut per speed factor. Finished parts are skipped."""
    outputs = []
    for part in parts:
        output_cuts = Path(fbank_dir) / f"{corpus}_cuts_{part}.jsonl.gz"
        outputs.append(output_cuts)
        if output_cuts.is_file():
            logging.info(f"{output_cuts} exists: features already computed, skipping")
            continue
        recordings = Path(manifest_dir) / f"{corpus}_recordings_{part}.jsonl.gz"
        supervisions = Path(manifest_dir) / f"{corpus}_supervisions_{part}.jsonl.gz"
        for path in (recordings, supervisions):
            if not path.is_file():
                raise FileNotFoundError(f"manifest {path} does not exist (run the manifest stage first)")
        compute_fbank(
            cuts_from_manifests(recordings, supervisions),
            output_cuts,
            Path(fbank_dir) / f"{corpus}_feats_{part}",
            num_jobs,
            speed_factors if part in perturbed_parts else (),
        )
    return outputs


def compute_fbank_of_raw_parts(corpus: str, fbank_dir: Path, parts: Sequence[str], num_jobs: int = 1) -> List[Path]:
    """Features of whole recordings (``<corpus>_cuts_<part>_raw``), then one cut per
    supervision in ``<corpus>_cuts_<part>``. Finished parts are skipped."""
    from lhotse import load_manifest

    outputs = []
    for part in parts:
        raw_cuts = Path(fbank_dir) / f"{corpus}_cuts_{part}_raw.jsonl.gz"
        output_cuts = Path(fbank_dir) / f"{corpus}_cuts_{part}.jsonl.gz"
        outputs.append(output_cuts)
        if output_cuts.is_file():
            logging.info(f"{output_cuts} exists: features already computed, skipping")
            continue
        if not raw_cuts.is_file():
            raise FileNotFoundError(f"cuts manifest {raw_cuts} does not exist (run the earlier stages first)")
        storage = Path(fbank_dir) / f"{corpus}_feats_{part}"
        compute_fbank(load_manifest(raw_cuts), output_cuts, storage, num_jobs, trim_to_supervisions=True)
    return outputs


def _parse_factors(text: str) -> list:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 0.9,1.1, found {text!r}")


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-jobs", type=int, default=1)
    commands = parser.add_subparsers(dest="command", required=True)
    corpus = commands.add_parser("parts", help="every part of a corpus from its manifests")
    corpus.add_argument("corpus", help="manifest prefix, e.g. librispeech")
    corpus.add_argument("manifest_dir", type=Path)
    corpus.add_argument("fbank_dir", type=Path)
    corpus.add_argument("--parts", nargs="+", required=True)
    corpus.add_argument("--perturbed-parts", nargs="*", default=[])
    corpus.add_argument("--speed-perturb", type=_parse_factors, default=[], help="e.g. 0.9,1.1 (empty: none)")
    raw = commands.add_parser(
        "raw-parts", help="<corpus>_cuts_<part>_raw (whole recordings) -> <corpus>_cuts_<part>, one cut per supervision"
    )
    raw.add_argument("corpus", help="manifest prefix, e.g. gigaspeech")
    raw.add_argument("fbank_dir", type=Path)
    raw.add_argument("--parts", nargs="+", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "parts":
            compute_fbank_of_parts(
                args.corpus, args.manifest_dir, args.fbank_dir, args.parts,
                args.perturbed_parts, args.speed_perturb, args.num_jobs,
            )
        else:
            compute_fbank_of_raw_parts(args.corpus, args.fbank_dir, args.parts, args.num_jobs)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
