"""Where the errors of the long-input test are (egs/mini run.sh stage 10; RESULTS.md, "Long
inputs: the joins between sentences"): every reference word of the 30-60 s recordings
decoded chunk by chunk, and of the same sentences decoded one by one, counted by its place
in its sentence (first word, last word, the others) and by the time its sentence starts in
the recording (10 s bins)::

    python -m local.long_input_errors data/full/test_long \\
        data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
        exp/full_llm_ctc_streaming/recogs-test-clean-long-<setting>.txt \\
        exp/full_llm_ctc_streaming/recogs-test-clean-<setting>.txt

The first folder is ``local.join_utterances``'s (``cuts.jsonl.gz``, ``members.tsv``); the
recogs files are ``asr.decode``'s. Substitutions and deletions belong to reference words
(a Levenshtein alignment by kaldialign); insertions have none and are totalled.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import kaldialign

from asr.scoring import ERROR_SYMBOL, read_recogs

PLACES = ("first", "last", "other")
CORRECT, SUBSTITUTED, DELETED = "C", "S", "D"


def reference_word_errors(reference: Sequence[str], hypothesis: Sequence[str]) -> Tuple[List[str], int]:
    """Per reference word C (correct), S or D, and the number of inserted words."""
    flags, insertions = [], 0
    for ref, hyp in kaldialign.align(list(reference), list(hypothesis), ERROR_SYMBOL):
        if ref == ERROR_SYMBOL:
            insertions += 1
        else:
            flags.append(CORRECT if ref == hyp else DELETED if hyp == ERROR_SYMBOL else SUBSTITUTED)
    return flags, insertions


def place_in_sentence(index: int, length: int) -> str:
    """'first', 'last' or 'other' for word ``index`` of a sentence of ``length`` words (a
    one-word sentence's word is its first)."""
    return "first" if index == 0 else "last" if index == length - 1 else "other"


def count_errors(recordings: Sequence[Tuple[List[str], List[str], List[Tuple[str, float]]]],
                 sentences: Dict[str, Tuple[List[str], List[str]]], bin_seconds: float = 10.0) -> Dict[str, Counter]:
    """Counters of (decode, flag) per place and per start-time bin ('0-10 s', ...), and the
    insertions: ``recordings`` holds each long recording's (reference, hypothesis, [(sentence
    cut id, its duration)] in order); ``sentences`` the one-by-one results by cut id."""
    table: Dict[str, Counter] = {}
    insertions = Counter()
    for reference, hypothesis, members in recordings:
        long_flags, inserted = reference_word_errors(reference, hypothesis)
        insertions["long"] += inserted
        start, word = 0.0, 0
        for cut_id, duration in members:
            if cut_id not in sentences:
                raise KeyError(f"sentence {cut_id} of a long recording is not in the one-by-one results")
            sentence_ref, sentence_hyp = sentences[cut_id]
            one_flags, inserted = reference_word_errors(sentence_ref, sentence_hyp)
            insertions["one by one"] += inserted
            low = int(start // bin_seconds) * bin_seconds
            for j, one_flag in enumerate(one_flags):
                for key in (place_in_sentence(j, len(one_flags)), f"{low:.0f}-{low + bin_seconds:.0f} s"):
                    row = table.setdefault(key, Counter())
                    row["long", long_flags[word + j]] += 1
                    row["one by one", one_flag] += 1
            word += len(one_flags)
            start += duration
        if word != len(reference):
            raise ValueError(f"a long recording's reference has {len(reference)} words, its sentences {word}")
    table["insertions"] = insertions
    return table


def format_table(table: Dict[str, Counter]) -> str:
    def cell(row: Counter, decode: str) -> str:
        words = sum(row[decode, flag] for flag in (CORRECT, SUBSTITUTED, DELETED))
        errors = row[decode, SUBSTITUTED] + row[decode, DELETED]
        return f"{100 * errors / words:.1f}% ({row[decode, SUBSTITUTED]} S, {row[decode, DELETED]} D)"

    lines = ["| words | count | long recordings, chunk by chunk | the sentences one by one |", "|---|---|---|---|"]
    keys = [p for p in PLACES if p in table] + sorted((k for k in table if k.endswith(" s")),
                                                     key=lambda k: float(k.split("-")[0]))
    for key in keys:
        row = table[key]
        count = sum(row["long", flag] for flag in (CORRECT, SUBSTITUTED, DELETED))
        label = f"{key} word of a sentence" if key in PLACES else f"sentence starting at {key}"
        lines.append(f"| {label} | {count} | {cell(row, 'long')} | {cell(row, 'one by one')} |")
    inserted = table["insertions"]
    lines.append(f"| inserted words | - | {inserted['long']} | {inserted['one by one']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("long_dir", type=Path, help="local.join_utterances's folder (cuts.jsonl.gz, members.tsv)")
    parser.add_argument("sentence_cuts", type=Path, help="the cuts the recordings were joined from")
    parser.add_argument("long_recogs", type=Path, help="recogs- file of the long recordings")
    parser.add_argument("sentence_recogs", type=Path, help="recogs- file of the same sentences one by one")
    args = parser.parse_args(argv)
    from lhotse import load_manifest

    for path in (args.long_dir / "cuts.jsonl.gz", args.long_dir / "members.tsv", args.sentence_cuts,
                 args.long_recogs, args.sentence_recogs):
        if not path.is_file():
            raise SystemExit(f"ERROR: {path} does not exist")
    durations = {cut.id: cut.duration for cut in load_manifest(args.sentence_cuts)}
    recording_of = {cut.id: cut.recording_id for cut in load_manifest(args.long_dir / "cuts.jsonl.gz")}
    members = {}
    for line in (args.long_dir / "members.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        long_id, _, cut_ids = line.split("\t")
        members[long_id] = [(cut_id, durations[cut_id]) for cut_id in cut_ids.split(",")]
    long_results = read_recogs(args.long_recogs)
    recordings = [(reference, hypothesis, members[recording_of[cut_id]])
                  for cut_id, (reference, hypothesis) in sorted(long_results.items())]
    print(format_table(count_errors(recordings, read_recogs(args.sentence_recogs))), end="")


if __name__ == "__main__":
    main()
