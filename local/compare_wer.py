"""Is one decoding's WER really above another's on the same test set? A paired bootstrap
over the test utterances (Bisani and Ney, "Bootstrap estimates for confidence intervals in
ASR performance evaluation", ICASSP 2004): each of ``--samples`` resamples draws as many
utterances as the test set holds, with replacement, and scores both decodings on the same
draw. For each decoding after the first it prints the WER, the ratio of its WER to the
first's with the central 95% of the resampled ratios, and the fraction of resamples on
which it makes more errors than the first::

    python -m local.compare_wer \\
        exp/full_llm_ctc_speech/recogs-test-clean-ctc-prefix-beam-search_<setting>.txt \\
        exp/full_llm_ctc_query/recogs-test-clean-ctc-prefix-beam-search_<setting>.txt

On a small test set the interval is wide: on egs/mini's 200 test sentences (1,618 words),
12 errors against 17 (0.74% and 1.05% WER) put the ratio anywhere from 0.76x to 3.14x
(egs/mini/RESULTS.md). The bootstrap measures what the choice of test utterances does,
not what a training run's seed does; compare seeds as separate decodings. The recogs
files are ``asr.decode``'s; every file must hold the same cut ids with the same
references. With ``--joined data/full/test_long`` the first file decodes the test sentences
one by one and the others the 30-60 s recordings ``local.join_utterances`` joined them
into (egs/mini stage 10), and the bootstrap draws recordings.

Runs that differ only in their seed are one decoding each: give each decoding as its runs'
files joined by commas, in the same order for every decoding, and the runs are pooled
into one test set (each run's cuts kept apart) that the bootstrap draws from::

    python -m local.compare_wer --joined data/full/test_long_pauses \
        seed42/recogs-test-clean-<setting>.txt,seed43/recogs-test-clean-<setting>.txt \
        seed42/recogs-test-clean-long-pauses-<setting>.txt,seed43/recogs-test-clean-long-pauses-<setting>.txt
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import kaldialign
import numpy as np

from asr.scoring import read_recogs


@dataclass
class Comparison:
    """One decoding against the first: WERs (%), the ratio of the two, the central
    ``level`` of the resampled ratios, and the fraction of resamples on which the
    decoding makes more errors than the first (ties count half)."""

    name: str
    words: int
    errors: int
    wer: float
    ratio: float
    low: float
    high: float
    worse: float


def utterance_errors(results: Dict[str, Tuple[List[str], List[str]]], ids: Sequence[str]) -> np.ndarray:
    """Errors (substitutions + deletions + insertions) of each cut in ``ids``."""
    return np.array([kaldialign.edit_distance(*results[cut_id])["total"] for cut_id in ids], dtype=np.int64)


def paired_bootstrap(words: np.ndarray, first: np.ndarray, other: np.ndarray, samples: int = 10000,
                     seed: int = 0, level: float = 0.95) -> Tuple[float, float, float]:
    """(low, high, worse) over ``samples`` resamples of the utterances: the central
    ``level`` of other's errors over first's, and the fraction of resamples on which other
    makes more errors (ties count half). ``words``, ``first``, ``other``: per utterance."""
    if not len(words) == len(first) == len(other) or len(words) == 0:
        raise ValueError(f"paired_bootstrap: per-utterance arrays of one nonzero length expected, got "
                         f"{len(words)}, {len(first)}, {len(other)}")
    if samples < 1:
        raise ValueError(f"--samples must be positive, got {samples}")
    rng = np.random.default_rng(seed)
    block = max(1, 2 ** 22 // len(words))  # resamples drawn at a time: ~32 MiB of indices
    first_errors, other_errors = np.empty(samples, dtype=np.int64), np.empty(samples, dtype=np.int64)
    for start in range(0, samples, block):
        draws = rng.integers(0, len(words), size=(min(block, samples - start), len(words)))
        first_errors[start:start + len(draws)] = first[draws].sum(1)
        other_errors[start:start + len(draws)] = other[draws].sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(first_errors > 0, other_errors / np.maximum(first_errors, 1),
                          np.where(other_errors > 0, np.inf, 1.0))
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    worse = float(np.mean((other_errors > first_errors) + 0.5 * (other_errors == first_errors)))
    return float(low), float(high), worse


def read_joined(folder: Path) -> Dict[str, List[str]]:
    """Long cut id -> the sentence cut ids joined into it, from ``local.join_utterances``'s
    folder (``cuts.jsonl.gz``, ``members.tsv``)."""
    from lhotse import load_manifest

    for path in (folder / "cuts.jsonl.gz", folder / "members.tsv"):
        if not path.is_file():
            raise ValueError(f"--joined: {path} does not exist (expected local.join_utterances's folder)")
    members = {}
    for line in (folder / "members.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        long_id, _, cut_ids = line.split("\t")[:3]  # a fourth column: the members' starts
        members[long_id] = cut_ids.split(",")
    return {cut.id: members[cut.recording_id] for cut in load_manifest(folder / "cuts.jsonl.gz")}


def read_pooled(paths: Sequence[Path]) -> Dict[str, Tuple[List[str], List[str]]]:
    """The recogs of several runs of one decoding as one test set: run k's cut ids prefixed
    with ``k/`` (a single file: its own ids)."""
    if len(paths) == 1:
        return read_recogs(paths[0])
    return {f"{run}/{cut_id}": pair for run, path in enumerate(paths) for cut_id, pair in read_recogs(path).items()}


def pooled_units(units: Dict[str, List[str]], runs: int) -> Dict[str, List[str]]:
    """``units`` (cut id -> sentence ids) repeated for each of ``runs`` pooled runs."""
    if runs == 1:
        return units
    return {f"{run}/{cut_id}": [f"{run}/{member}" for member in members]
            for run in range(runs) for cut_id, members in units.items()}


def compare(paths: Sequence[Union[Path, Sequence[Path]]], samples: int = 10000, seed: int = 0,
            joined: Optional[Dict[str, List[str]]] = None) -> List[Comparison]:
    """The first recogs file, then each other one against it (same cut ids and references),
    each named by its file name, or by its folder when all files have one name (the same
    decoding setting of several experiments). With ``joined`` (long cut id -> its sentence
    ids, :func:`read_joined`) the first file decodes the sentences one by one and the others
    the long recordings they were joined into: the bootstrap draws recordings, each paired
    with its sentences' errors in the first file. A decoding given as a sequence of files
    pools its runs (:func:`read_pooled`); every decoding needs as many."""
    if len(paths) < 2:
        raise ValueError(f"two recogs files or more expected, got {len(paths)}")
    groups = [[Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path] for path in paths]
    runs = len(groups[0])
    uneven = [group for group in groups if len(group) != runs]
    if runs == 0 or uneven:
        raise ValueError(f"every decoding needs the same number of pooled runs: {runs} in the first, "
                         f"{len(uneven[0]) if uneven else 0} in {', '.join(map(str, uneven[0])) if uneven else 'none'}")
    results = [read_pooled(group) for group in groups]
    paths = [group[0] for group in groups]
    units = pooled_units(joined, runs) if joined is not None else {cut_id: [cut_id] for cut_id in results[0]}
    ids = sorted(units)
    missing = sorted({member for cut_id in ids for member in units[cut_id]} - set(results[0]))
    if missing:
        raise ValueError(f"{paths[0]} lacks sentence {missing[0]} of a joined recording")
    references = {cut_id: [word for member in units[cut_id] for word in results[0][member][0]] for cut_id in ids}
    for path, other in zip(paths[1:], results[1:]):
        if sorted(other) != ids:
            different = sorted(set(ids) ^ set(other))
            raise ValueError(f"{path} and {paths[0]} hold different cuts (e.g. {different[0]}): "
                             "compare decodings of one test set" + (" (its joined recordings)" if joined else ""))
        changed = [cut_id for cut_id in ids if other[cut_id][0] != references[cut_id]]
        if changed:
            raise ValueError(f"{path} and {paths[0]} have other references for cut {changed[0]}")
    words = np.array([len(references[cut_id]) for cut_id in ids], dtype=np.int64)
    per_sentence = dict(zip(results[0], utterance_errors(results[0], list(results[0]))))
    first = np.array([sum(per_sentence[member] for member in units[cut_id]) for cut_id in ids], dtype=np.int64)
    found = []
    for number, (path, result) in enumerate(zip(paths, results)):
        name = path.parent.name if len({p.name for p in paths}) == 1 else path.name
        name += f" (+{runs - 1} runs)" if runs > 1 else ""
        errors = first if number == 0 else utterance_errors(result, ids)
        low, high, worse = paired_bootstrap(words, first, errors, samples, seed)
        wer = 100 * errors.sum() / words.sum()
        ratio = errors.sum() / first.sum() if first.sum() else float("inf") if errors.sum() else 1.0
        found.append(Comparison(name, int(words.sum()), int(errors.sum()), wer, ratio, low, high, worse))
    return found


def format_comparisons(comparisons: Sequence[Comparison]) -> str:
    lines = ["| recogs | words | errors | WER | / first | 95% of resamples | more errors than the first |",
             "|---|---|---|---|---|---|---|"]
    for number, row in enumerate(comparisons):
        if number == 0:
            lines.append(f"| {row.name} | {row.words} | {row.errors} | {row.wer:.2f}% | 1 | - | - |")
        else:
            lines.append(f"| {row.name} | {row.words} | {row.errors} | {row.wer:.2f}% | {row.ratio:.2f}x "
                         f"| {row.low:.2f}-{row.high:.2f}x | {100 * row.worse:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recogs", nargs="+", help="recogs- files of one test set, the first the base; "
                        "several runs of one decoding (seeds) pooled as FILE,FILE,...")
    parser.add_argument("--samples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")
    parser.add_argument("--joined", type=Path, help="local.join_utterances's folder: the first recogs file holds "
                        "the sentences one by one, the others the long recordings they were joined into")
    args = parser.parse_args(argv)
    decodings = [[Path(part) for part in argument.split(",")] for argument in args.recogs]
    for path in (path for group in decodings for path in group):
        if not path.is_file():
            raise SystemExit(f"ERROR: {path} does not exist")
    try:
        joined = read_joined(args.joined) if args.joined else None
        print(format_comparisons(compare(decodings, args.samples, args.seed, joined)), end="")
    except ValueError as error:
        raise SystemExit(f"ERROR: {error}")


if __name__ == "__main__":
    main()
