"""Where the errors of the long-input test are (egs/mini run.sh stage 10; RESULTS.md, "Long
inputs: the joins between sentences"): every reference word of the 30-60 s recordings
decoded chunk by chunk, and of the same sentences decoded one by one, counted by its place
in its sentence (first word, second, last, the others), by the time its sentence starts in
the recording (10 s bins), and, for the first word after a join, by where in its 2 s
chunk its sentence starts (quarters of a chunk: whether a sentence start on a chunk
boundary fares better than one inside a chunk); then each word beside the same word decoded
one by one (wrong in both, only in the recording, only one by one), for the words where two
sentences meet and the others::

    python -m local.long_input_errors data/full/test_long \\
        data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
        exp/full_llm_ctc_streaming_lookahead0.32/recogs-test-clean-long-<setting>.txt \\
        exp/full_llm_ctc_streaming_lookahead0.32/recogs-test-clean-<setting>.txt

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

PLACES = ("first", "second", "last", "other")
# The word-by-word rows: a word at a join is the first or the last word of a sentence where
# it meets another in the recording (not the recording's own first or last word).
BY_WORD, JOIN, INSIDE = "word by word", "at a join", "inside a sentence"
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
    """'first', 'second', 'last' or 'other' for word ``index`` of a sentence of ``length``
    words (a one-word sentence's word is its first, a two-word sentence's second its last).
    The second word is where a sentence that starts late in a chunk meets the chunk
    boundary (RESULTS.md, "Where in its chunk a recording's sentence starts")."""
    return "first" if index == 0 else "last" if index == length - 1 else "second" if index == 1 else "other"


def chunk_phase_key(start: float, chunk_seconds: float, bins: int = 4) -> str:
    """The row of a first word after a join whose sentence starts ``start`` seconds into the
    recording: which of ``bins`` equal parts of its chunk the start falls in."""
    width = chunk_seconds / bins
    phase = start % chunk_seconds
    # The durations are sums of floats: a start within a microsecond of a part's edge
    # belongs to the part that edge opens.
    if phase > chunk_seconds - 1e-6:
        phase = 0.0
    part = min(int((phase + 1e-6) // width), bins - 1)
    return f"after a join, {part * width:.1f}-{(part + 1) * width:.1f} s into a chunk"


def count_errors(recordings: Sequence[Tuple[List[str], List[str], List[Tuple[str, float]]]],
                 sentences: Dict[str, Tuple[List[str], List[str]]], bin_seconds: float = 10.0,
                 chunk_seconds: float = 2.0, leads: Optional[Sequence[float]] = None) -> Dict[str, Counter]:
    """Counters of (decode, flag) per place, per start-time bin ('0-10 s', ...) and, for the
    first words of the sentences after a join, per part of a ``chunk_seconds`` chunk their
    sentence starts in (:func:`chunk_phase_key`), the insertions, and under ``BY_WORD``
    each word's (JOIN or INSIDE, wrong in the recording, wrong one by one): ``recordings`` holds
    each long recording's (reference, hypothesis, [(sentence cut id, its duration)] in
    order) and ``leads`` the second each recording's first sentence starts at (0 when not
    given); ``sentences`` the one-by-one results by cut id."""
    table: Dict[str, Counter] = {}
    insertions = Counter()
    by_word = Counter()
    for number, (reference, hypothesis, members) in enumerate(recordings):
        long_flags, inserted = reference_word_errors(reference, hypothesis)
        insertions["long"] += inserted
        start, word = (0.0 if leads is None else leads[number]), 0
        for cut_id, duration in members:
            if cut_id not in sentences:
                raise KeyError(f"sentence {cut_id} of a long recording is not in the one-by-one results")
            sentence_ref, sentence_hyp = sentences[cut_id]
            one_flags, inserted = reference_word_errors(sentence_ref, sentence_hyp)
            insertions["one by one"] += inserted
            low = int(start // bin_seconds) * bin_seconds
            for j, one_flag in enumerate(one_flags):
                keys = [place_in_sentence(j, len(one_flags)), f"{low:.0f}-{low + bin_seconds:.0f} s"]
                at_join = (j == 0 and word > 0) or (j == len(one_flags) - 1 and word + j < len(reference) - 1)
                by_word[JOIN if at_join else INSIDE, long_flags[word + j] != CORRECT, one_flag != CORRECT] += 1
                if j == 0 and word > 0:
                    keys.append(chunk_phase_key(start, chunk_seconds))
                for key in keys:
                    row = table.setdefault(key, Counter())
                    row["long", long_flags[word + j]] += 1
                    row["one by one", one_flag] += 1
            word += len(one_flags)
            start += duration
        if word != len(reference):
            raise ValueError(f"a long recording's reference has {len(reference)} words, its sentences {word}")
    table["insertions"] = insertions
    table[BY_WORD] = by_word
    return table


def format_table(table: Dict[str, Counter]) -> str:
    def cell(row: Counter, decode: str) -> str:
        words = sum(row[decode, flag] for flag in (CORRECT, SUBSTITUTED, DELETED))
        errors = row[decode, SUBSTITUTED] + row[decode, DELETED]
        return f"{100 * errors / words:.1f}% ({row[decode, SUBSTITUTED]} S, {row[decode, DELETED]} D)"

    lines = ["| words | count | long recordings, chunk by chunk | the sentences one by one |", "|---|---|---|---|"]
    keys = [p for p in PLACES if p in table]
    keys += sorted((k for k in table if k.endswith(" into a chunk")), key=lambda k: float(k.split(", ")[1].split("-")[0]))
    keys += sorted((k for k in table if k.endswith(" s")), key=lambda k: float(k.split("-")[0]))
    for key in keys:
        row = table[key]
        count = sum(row["long", flag] for flag in (CORRECT, SUBSTITUTED, DELETED))
        label = (f"{key} word of a sentence" if key in PLACES else
                 f"first word {key}" if key.endswith(" into a chunk") else f"sentence starting at {key}")
        lines.append(f"| {label} | {count} | {cell(row, 'long')} | {cell(row, 'one by one')} |")
    inserted = table["insertions"]
    lines.append(f"| inserted words | - | {inserted['long']} | {inserted['one by one']} |")
    return "\n".join(lines) + "\n"


def format_word_by_word(table: Dict[str, Counter]) -> str:
    """Each reference word of the recordings beside the same word decoded one by one: wrong
    in both, only in the recording (the recordings' own errors) or only one by one, for the
    words at a join and the others."""
    counts = table[BY_WORD]
    lines = ["| words | count | wrong in both | only in the recording | only one by one |", "|---|---|---|---|---|"]
    for edge in (JOIN, INSIDE):
        total = sum(counts[edge, long_wrong, one_wrong] for long_wrong in (False, True) for one_wrong in (False, True))
        lines.append(f"| {edge} | {total} | {counts[edge, True, True]} | {counts[edge, True, False]} | "
                     f"{counts[edge, False, True]} |")
    return "\n".join(lines) + "\n"


def with_gaps(members: List[Tuple[str, float]], recording_seconds: float) -> List[Tuple[str, float]]:
    """Each sentence's (cut id, seconds from its start to the next sentence's): its duration
    and the silence after it (``local.join_utterances --gap-seconds``, the recording's
    length beyond its sentences' shared by the joins)."""
    if len(members) < 2:
        return members
    gap = (recording_seconds - sum(duration for _, duration in members)) / (len(members) - 1)
    if gap < -1e-3:
        raise ValueError(f"a long recording of {recording_seconds:.2f} s is shorter than its sentences")
    gap = max(gap, 0.0)
    return [(cut_id, duration + (gap if index < len(members) - 1 else 0.0))
            for index, (cut_id, duration) in enumerate(members)]


def from_starts(cut_ids: Sequence[str], starts: Sequence[float]) -> Tuple[List[Tuple[str, float]], float]:
    """Each sentence's (cut id, seconds from its start to the next sentence's; 0 for the
    last) and the first one's start, from the starts ``local.join_utterances`` lists."""
    if len(starts) != len(cut_ids) or any(b < a for a, b in zip(starts, starts[1:])):
        raise ValueError(f"members.tsv: {len(cut_ids)} sentences need as many starts in order, got {list(starts)}")
    return [(cut_id, (starts[k + 1] - starts[k]) if k + 1 < len(starts) else 0.0)
            for k, cut_id in enumerate(cut_ids)], starts[0]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("long_dir", type=Path, help="local.join_utterances's folder (cuts.jsonl.gz, members.tsv)")
    parser.add_argument("sentence_cuts", type=Path, help="the cuts the recordings were joined from")
    parser.add_argument("long_recogs", type=Path, help="recogs- file of the long recordings")
    parser.add_argument("sentence_recogs", type=Path, help="recogs- file of the same sentences one by one")
    parser.add_argument("--chunk-seconds", type=float, default=2.0,
                        help="the streaming chunk, for the rows of first words by where their sentence starts in it")
    args = parser.parse_args(argv)
    if not args.chunk_seconds > 0:
        raise SystemExit(f"ERROR: --chunk-seconds must be > 0, got {args.chunk_seconds}")
    from lhotse import load_manifest

    for path in (args.long_dir / "cuts.jsonl.gz", args.long_dir / "members.tsv", args.sentence_cuts,
                 args.long_recogs, args.sentence_recogs):
        if not path.is_file():
            raise SystemExit(f"ERROR: {path} does not exist")
    durations = {cut.id: cut.duration for cut in load_manifest(args.sentence_cuts)}
    long_cuts = list(load_manifest(args.long_dir / "cuts.jsonl.gz"))
    recording_of = {cut.id: cut.recording_id for cut in long_cuts}
    long_durations = {cut.recording_id: cut.duration for cut in long_cuts}
    members, leads = {}, {}
    for line in (args.long_dir / "members.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        long_id, _, cut_ids, *starts = line.split("\t")
        if starts:  # local.join_utterances lists where each sentence starts since 2026-12-07
            members[long_id], leads[long_id] = from_starts(cut_ids.split(","),
                                                           [float(s) for s in starts[0].split(",")])
        else:
            members[long_id] = with_gaps([(cut_id, durations[cut_id]) for cut_id in cut_ids.split(",")],
                                         long_durations[long_id])
            leads[long_id] = 0.0
    long_results = read_recogs(args.long_recogs)
    order = sorted(long_results.items())
    recordings = [(reference, hypothesis, members[recording_of[cut_id]]) for cut_id, (reference, hypothesis) in order]
    table = count_errors(recordings, read_recogs(args.sentence_recogs), chunk_seconds=args.chunk_seconds,
                         leads=[leads[recording_of[cut_id]] for cut_id, _ in order])
    print(format_table(table), end="")
    print()
    print(format_word_by_word(table), end="")


if __name__ == "__main__":
    main()
