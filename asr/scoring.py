"""Word/character error rates and icefall's decoding result files.

A decoding result is a triple ``(cut_id, reference_words, hypothesis_words)``. Scores
come from a Levenshtein alignment by kaldialign (the error symbol ``*``), error rate =
100 * (substitutions + deletions + insertions) / reference length, as icefall reports
it. With ``compute_cer=True`` (AISHELL) every word list is first turned into its
characters, whitespace removed.

Files written per test set (names and layouts are icefall's, so existing parsers work):

- ``recogs-<set>-<key>.txt``: for each cut, sorted by id, the lines
  ``<cut_id>:\\tref=[...]`` and ``<cut_id>:\\thyp=[...]`` (Python list reprs).
- ``errs-<set>-<key>.txt``: ``%WER = x.xx``, the error counts, and the sections
  ``PER-UTT DETAILS`` (consecutive errors merged into one ``(ref->hyp)``),
  ``SUBSTITUTIONS``, ``DELETIONS``, ``INSERTIONS``, ``PER-WORD STATS``.
- ``wer-summary-<set>.txt``: ``settings\\tWER`` then one ``<key>\\t<rate>`` line per
  decoding setting, best first: the settings scored now and those an earlier run scored
  into the same folder with the same suffix (whose ``errs-*`` file is still there), so a
  second decode with other settings adds to the summary instead of hiding the first.

Every file is written under a temporary name and renamed, so a reader never sees a
half-written file.

GigaSpeech is scored after the official normalization (SpeechColab's
``gigaspeech_scoring.py``), applied to both reference and hypothesis: upper-case,
hyphens become spaces, and fillers and tags that are not scored are removed.
"""

from __future__ import annotations

import ast
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import kaldialign

from asr.atomic_io import write_text_atomically

__all__ = [
    "GIGASPEECH_NON_SCORING_WORDS",
    "ErrorStats",
    "Result",
    "compute_error_stats",
    "format_error_stats",
    "format_recogs",
    "format_wer_summary",
    "normalize_gigaspeech_text",
    "read_recogs",
    "save_results",
]

Result = Tuple[str, List[str], List[str]]
ERROR_SYMBOL = "*"

GIGASPEECH_CONVERSATIONAL_FILLERS = (
    "UH", "UHH", "UM", "EH", "MM", "HM", "AH", "HUH", "HA", "ER", "OOF", "HEE", "ACH", "EEE", "EW",
)
GIGASPEECH_UNKNOWN_TAGS = ("<UNK>", "<unk>")
GIGASPEECH_PUNCTUATION_TAGS = ("<COMMA>", "<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>")
GIGASPEECH_GARBAGE_UTTERANCE_TAGS = ("<SIL>", "<NOISE>", "<MUSIC>", "<OTHER>")
GIGASPEECH_NON_SCORING_WORDS = frozenset(
    GIGASPEECH_CONVERSATIONAL_FILLERS
    + GIGASPEECH_UNKNOWN_TAGS
    + GIGASPEECH_PUNCTUATION_TAGS
    + GIGASPEECH_GARBAGE_UTTERANCE_TAGS
)


def normalize_gigaspeech_text(text: str) -> str:
    """GigaSpeech's official scoring normalization of one transcript (ref or hyp)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r}")
    words = text.upper().replace("-", " ").split()
    return " ".join(word for word in words if word not in GIGASPEECH_NON_SCORING_WORDS)


# decode.text_normalization -> the normalizer applied to references and hypotheses before scoring.
TEXT_NORMALIZERS: Dict[str, Optional[Callable[[str], str]]] = {
    "none": None,
    "gigaspeech": normalize_gigaspeech_text,
}


def to_characters(words: Sequence[str]) -> List[str]:
    """The characters of a word sequence, whitespace removed (CER units)."""
    return [char for char in "".join(words) if not char.isspace()]


@dataclass
class ErrorStats:
    """Alignment counts of a whole test set, as icefall's errs- file reports them."""

    insertions: int = 0
    deletions: int = 0
    substitutions: int = 0
    correct: int = 0
    reference_length: int = 0
    substitution_counts: Counter = field(default_factory=Counter)  # (ref, hyp) -> count
    deletion_counts: Counter = field(default_factory=Counter)
    insertion_counts: Counter = field(default_factory=Counter)
    # word -> [correct, substituted in ref, substituted in hyp, inserted, deleted]
    word_counts: Dict[str, List[int]] = field(default_factory=dict)
    alignments: List[Tuple[str, List[Tuple[str, str]]]] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return self.insertions + self.deletions + self.substitutions

    @property
    def error_rate(self) -> float:
        """Percent errors over reference units; inf if there are errors but no reference."""
        if self.reference_length == 0:
            return 0.0 if self.errors == 0 else math.inf
        return 100.0 * self.errors / self.reference_length

    def _count(self, word: str, column: int) -> None:
        self.word_counts.setdefault(word, [0, 0, 0, 0, 0])[column] += 1

    def add(self, cut_id: str, reference: Sequence[str], hypothesis: Sequence[str]) -> None:
        alignment = kaldialign.align(list(reference), list(hypothesis), ERROR_SYMBOL)
        self.alignments.append((cut_id, alignment))
        self.reference_length += len(reference)
        for ref_word, hyp_word in alignment:
            if ref_word == ERROR_SYMBOL:
                self.insertions += 1
                self.insertion_counts[hyp_word] += 1
                self._count(hyp_word, 3)
            elif hyp_word == ERROR_SYMBOL:
                self.deletions += 1
                self.deletion_counts[ref_word] += 1
                self._count(ref_word, 4)
            elif ref_word != hyp_word:
                self.substitutions += 1
                self.substitution_counts[(ref_word, hyp_word)] += 1
                self._count(ref_word, 1)
                self._count(hyp_word, 2)
            else:
                self.correct += 1
                self._count(ref_word, 0)


def _check_results(results: Sequence[Result], argument: str) -> None:
    for result in results:
        if not (isinstance(result, (tuple, list)) and len(result) == 3 and isinstance(result[0], str)):
            raise TypeError(f"{argument} must hold (cut_id, ref_words, hyp_words) triples, got {result!r}")
        for words in result[1:]:
            if isinstance(words, str) or not all(isinstance(word, str) for word in words):
                raise TypeError(
                    f"{argument}: ref/hyp must be lists of str words, got {words!r} in {result!r}"
                )


def _scoring_units(results: Sequence[Result], compute_cer: bool) -> List[Result]:
    units = [(cut_id, list(ref), list(hyp)) for cut_id, ref, hyp in results]
    if compute_cer:
        units = [(cut_id, to_characters(ref), to_characters(hyp)) for cut_id, ref, hyp in units]
    return sorted(units)


def compute_error_stats(results: Sequence[Result], compute_cer: bool = False) -> ErrorStats:
    """Align every (ref, hyp) pair with kaldialign and add up the counts.

    Args:
      results: (cut_id, reference words, hypothesis words) triples.
      compute_cer: score characters (whitespace removed) instead of words.
    """
    _check_results(results, "results")
    stats = ErrorStats()
    for cut_id, reference, hypothesis in _scoring_units(results, compute_cer):
        stats.add(cut_id, reference, hypothesis)
    return stats


def _merge_consecutive_errors(alignment: Sequence[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """One (ref, hyp) pair per correct word and per maximal run of errors, '*' for nothing."""
    merged: List[Tuple[str, str]] = []
    run: List[Tuple[str, str]] = []

    def close_run() -> None:
        if run:
            ref_words = [ref for ref, _ in run if ref != ERROR_SYMBOL]
            hyp_words = [hyp for _, hyp in run if hyp != ERROR_SYMBOL]
            merged.append((" ".join(ref_words) or ERROR_SYMBOL, " ".join(hyp_words) or ERROR_SYMBOL))
            run.clear()

    for ref_word, hyp_word in alignment:
        if ref_word == hyp_word:
            close_run()
            merged.append((ref_word, hyp_word))
        else:
            run.append((ref_word, hyp_word))
    close_run()
    return merged


def format_error_stats(stats: ErrorStats) -> str:
    """The text of an icefall errs- file."""
    rate = "inf" if math.isinf(stats.error_rate) else f"{stats.error_rate:.2f}"
    lines = [
        f"%WER = {rate}",
        f"Errors: {stats.insertions} insertions, {stats.deletions} deletions, "
        f"{stats.substitutions} substitutions, over {stats.reference_length} reference "
        f"words ({stats.correct} correct)",
        "Search below for sections starting with PER-UTT DETAILS:, "
        "SUBSTITUTIONS:, DELETIONS:, INSERTIONS:, PER-WORD STATS:",
        "",
        "PER-UTT DETAILS: corr or (ref->hyp)  ",
    ]
    for cut_id, alignment in stats.alignments:
        pieces = (
            ref if ref == hyp else f"({ref}->{hyp})" for ref, hyp in _merge_consecutive_errors(alignment)
        )
        lines.append(f"{cut_id}:\t" + " ".join(pieces))
    lines += ["", "SUBSTITUTIONS: count ref -> hyp"]
    for (ref, hyp), count in sorted(stats.substitution_counts.items(), key=_by_count_then_key, reverse=True):
        lines.append(f"{count}   {ref} -> {hyp}")
    lines += ["", "DELETIONS: count ref"]
    for word, count in sorted(stats.deletion_counts.items(), key=_by_count_then_key, reverse=True):
        lines.append(f"{count}   {word}")
    lines += ["", "INSERTIONS: count hyp"]
    for word, count in sorted(stats.insertion_counts.items(), key=_by_count_then_key, reverse=True):
        lines.append(f"{count}   {word}")
    lines += ["", "PER-WORD STATS: word  corr tot_errs count_in_ref count_in_hyp"]
    per_word = sorted(stats.word_counts.items(), key=lambda item: (sum(item[1][1:]), item[0]), reverse=True)
    for word, (correct, ref_sub, hyp_sub, inserted, deleted) in per_word:
        errors = ref_sub + hyp_sub + inserted + deleted
        in_ref, in_hyp = correct + ref_sub + deleted, correct + hyp_sub + inserted
        lines.append(f"{word}   {correct} {errors} {in_ref} {in_hyp}")
    return "\n".join(lines) + "\n"


def _by_count_then_key(item: Tuple[object, int]) -> Tuple[int, object]:
    return item[1], item[0]


def format_recogs(results: Sequence[Result], compute_cer: bool = False) -> str:
    """The text of an icefall recogs- file (character lists when ``compute_cer``)."""
    _check_results(results, "results")
    lines = []
    for cut_id, reference, hypothesis in _scoring_units(results, compute_cer):
        lines += [f"{cut_id}:\tref={reference}", f"{cut_id}:\thyp={hypothesis}"]
    return "".join(line + "\n" for line in lines)


def read_recogs(path: Path) -> Dict[str, Tuple[List[str], List[str]]]:
    """cut id -> (reference words, hypothesis words) of an icefall recogs- file (what
    :func:`format_recogs` writes); a line of another form, or a cut without both lines, is
    an error naming the file and line."""
    found: Dict[str, Dict[str, List[str]]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        key, sep, rest = line.partition(":\t")
        side, equals, words = rest.partition("=")
        if not sep or not equals or side not in ("ref", "hyp"):
            raise ValueError(f"{path}:{number}: expected '<cut id>:\\tref=[...]' or 'hyp=[...]', got {line[:80]!r}")
        found.setdefault(key, {})[side] = ast.literal_eval(words)
    incomplete = [key for key, sides in found.items() if len(sides) != 2]
    if incomplete:
        raise ValueError(f"{path}: cut {incomplete[0]} lacks its ref= or hyp= line")
    return {key: (sides["ref"], sides["hyp"]) for key, sides in found.items()}


def format_wer_summary(rates: Mapping[str, float]) -> str:
    """The text of an icefall wer-summary- file: settings sorted by error rate, best first."""
    ranked = sorted(rates.items(), key=lambda kv: kv[1])
    lines = ["settings\tWER"] + [f"{key}\t{rate}" for key, rate in ranked]
    return "\n".join(lines) + "\n"


def read_wer_summary(result_dir: Union[str, Path], test_set_name: str, suffix: str = "") -> Dict[str, float]:
    """setting -> error rate of a ``wer-summary-*`` file written by :func:`save_results`
    (empty if there is none)."""
    path = Path(result_dir) / f"wer-summary-{test_set_name}{f'-{suffix}' if suffix else ''}.txt"
    if not path.is_file():
        return {}
    rates = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        key, _, rate = line.partition("\t")
        if key and rate:
            rates[key] = float(rate.split()[0])
    return rates


def _normalized(results: Sequence[Result], normalizer: Callable[[str], str]) -> List[Result]:
    return [
        (cut_id, normalizer(" ".join(ref)).split(), normalizer(" ".join(hyp)).split())
        for cut_id, ref, hyp in results
    ]


def save_results(
    result_dir: Union[str, Path],
    test_set_name: str,
    results_by_key: Mapping[str, Sequence[Result]],
    compute_cer: bool = False,
    text_normalizer: Optional[Callable[[str], str]] = None,
    suffix: str = "",
) -> Dict[str, float]:
    """Score one test set under several decoding settings and write icefall's files.

    Args:
      result_dir: folder for the files (created if missing).
      test_set_name: e.g. "test-clean"; used in the file names.
      results_by_key: decoding setting (e.g. "ctc-prefix-beam-search_beam-4") ->
        (cut_id, reference words, hypothesis words) triples.
      compute_cer: score characters instead of words (AISHELL).
      text_normalizer: applied to the joined ref and hyp before scoring, e.g.
        :func:`normalize_gigaspeech_text`.
      suffix: appended as "-<suffix>" to every file name (e.g. "epoch-30_avg-15").
    Returns:
      setting -> error rate in percent, rounded to 2 decimals as in the files. Empty
      (and nothing written) if the test set has no utterances.
    """
    if not isinstance(test_set_name, str) or not test_set_name or "/" in test_set_name:
        raise ValueError(f"test_set_name must be a non-empty name without '/', got {test_set_name!r}")
    if not isinstance(results_by_key, Mapping):
        raise TypeError(f"results_by_key must map setting -> results, got {type(results_by_key).__name__}")
    for key, results in results_by_key.items():
        if not isinstance(key, str) or not key or "/" in key:
            raise ValueError(f"results_by_key keys must be non-empty names without '/', got {key!r}")
        _check_results(results, f"results_by_key[{key!r}]")
    unit = "CER" if compute_cer else "WER"
    non_empty = {key: results for key, results in results_by_key.items() if len(results) > 0}
    if not non_empty:
        print(f"Test set {test_set_name}: no utterances to score, no result files written.")
        return {}
    for key in results_by_key.keys() - non_empty.keys():
        print(f"Test set {test_set_name}, setting {key}: no utterances, skipped.")

    result_dir = Path(result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    tail = f"-{suffix}" if suffix else ""
    rates: Dict[str, float] = {}
    for key, results in non_empty.items():
        if text_normalizer is not None:
            results = _normalized(results, text_normalizer)
        recogs = format_recogs(results, compute_cer)
        write_text_atomically(result_dir / f"recogs-{test_set_name}-{key}{tail}.txt", recogs)
        stats = compute_error_stats(results, compute_cer)
        if stats.reference_length == 0:
            print(f"Test set {test_set_name}, setting {key}: empty references, {unit} {stats.error_rate}.")
        write_text_atomically(result_dir / f"errs-{test_set_name}-{key}{tail}.txt", format_error_stats(stats))
        rates[key] = float(f"{stats.error_rate:.2f}")  # the value icefall prints
        logging.info(
            f"[{test_set_name}-{key}] %{unit} {rates[key]:.2f}% [{stats.errors} / {stats.reference_length}, "
            f"{stats.insertions} ins, {stats.deletions} del, {stats.substitutions} sub ]"
        )
    earlier = {key: rate for key, rate in read_wer_summary(result_dir, test_set_name, suffix).items()
               if key not in rates and (result_dir / f"errs-{test_set_name}-{key}{tail}.txt").is_file()}
    write_text_atomically(result_dir / f"wer-summary-{test_set_name}{tail}.txt",
                          format_wer_summary({**earlier, **rates}))
    summary = [f"For {test_set_name}, {unit} of different settings are:"]
    note = f"\tbest for {test_set_name}"
    for key, rate in sorted(rates.items(), key=lambda kv: kv[1]):
        summary.append(f"{key}\t{rate}{note}")
        note = ""
    print("\n".join(summary))
    return rates
