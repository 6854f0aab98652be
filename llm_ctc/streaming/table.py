"""Offline against streaming WER in the layout of the paper's Table 5: one row for the
offline model, one per left history h of each streaming model, per test set, with the
relative change against offline (Sec. 5.4: within 3% relative on GigaSpeech test); and,
given a speech-readout model, first the layout of Table 9 (speech against query readout,
offline, the query readout's relative change against the speech readout)::

    python -m llm_ctc.streaming.table --offline exp/table5_offline_qwen3-asr-0.6b \\
        --streaming exp/table5_streaming_qwen3-asr-0.6b --sets dev test
    python -m llm_ctc.streaming.table --speech exp/full_llm_ctc_speech_offline_lookahead0.32 \\
        --offline exp/full_llm_ctc_query_offline_lookahead0.32 --streaming exp/full_llm_ctc_streaming_lookahead0.32 \\
        --sets dev-clean test-clean --search beam
    python -m llm_ctc.streaming.table --offline exp/full_llm_ctc_query_offline_lookahead0.32 \\
        --streaming exp/full_llm_ctc_streaming_lookahead0.32_sentences \\
        --streaming exp/full_llm_ctc_streaming_lookahead0.32 \\
        --sets dev-clean test-clean

Reads the ``wer-summary-<set>-<suffix>.txt`` files of ``asr.decode`` (the newest one per
set and folder). Each row is the best of the settings it may use: ``--search beam`` or
``greedy`` keeps prefix beam or greedy search only (default: either), ``--blank-penalty``
the settings decoded with that ``decode.blank_penalty`` (default 0), and
``--offline-key`` names one offline setting; the streaming rows are the
``..._history-<h>s`` settings. With several ``--streaming`` folders each one's rows are
named by its folder ("streaming: full_llm_ctc_streaming").
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from asr.scoring import read_wer_summary

HISTORY = re.compile(r"^(?P<method>.+)_history-(?P<h>\d+)s$")
BLANK_PENALTY = re.compile(r"_blank-penalty-(?P<b>[-0-9.e]+)")
SEARCHES = {"best": None, "beam": "prefix-beam-search", "greedy": "greedy-search"}
# The weights' part of result file names (asr.weights): epoch-30_avg-15, iter-2300_avg-1_...
WEIGHTS_SUFFIX = re.compile(r"^(epoch|iter)-\d+_avg-\d+")


def newest_suffix(exp_dir: Path, test_set: str) -> str:
    """The weights' suffix of the newest wer-summary file of ``test_set`` in ``exp_dir``
    (not of a set whose name extends it: test-clean-long is not test-clean)."""
    paths = sorted((path for path in exp_dir.glob(f"wer-summary-{test_set}-*.txt")
                    if WEIGHTS_SUFFIX.match(path.name[len(f"wer-summary-{test_set}-"):])),
                   key=lambda path: path.stat().st_mtime)
    if not paths:
        raise FileNotFoundError(f"no wer-summary-{test_set}-*.txt in {exp_dir}: decode it first")
    return paths[-1].name[len(f"wer-summary-{test_set}-"):-len(".txt")]


def newest_summary(exp_dir: Path, test_set: str) -> Dict[str, float]:
    """setting -> WER of the newest wer-summary file of ``test_set`` in ``exp_dir``."""
    return read_wer_summary(exp_dir, test_set, newest_suffix(exp_dir, test_set))


def best_setting(rates: Dict[str, float], history: Optional[int] = None, search: str = "best",
                 blank_penalty: float = 0.0) -> str:
    """The usable setting of lowest rate: an offline one, or one of history ``history``."""
    def of_history(key: str) -> Optional[int]:
        match = HISTORY.match(key)
        return int(match.group("h")) if match else None

    found = [(rate, key) for key, rate in rates.items() if usable(key, search, blank_penalty)
             and of_history(key) == history]
    if not found:
        what = "offline" if history is None else f"history-{history}s"
        raise ValueError(f"no {what} setting of search {search!r} and blank penalty {blank_penalty:g}; "
                         f"found {sorted(rates)}")
    return min(found)[1]


def usable(key: str, search: str = "best", blank_penalty: float = 0.0) -> bool:
    """Whether a setting's key is of the search and blank penalty asked for."""
    method = HISTORY.match(key).group("method") if HISTORY.match(key) else key
    found = BLANK_PENALTY.search(method)
    if (float(found.group("b")) if found else 0.0) != blank_penalty:
        return False
    wanted = SEARCHES[search]
    return wanted is None or method.split("_")[0].endswith(wanted)


def best_rate(rates: Dict[str, float], what: str, key: Optional[str] = None, search: str = "best",
              blank_penalty: float = 0.0) -> float:
    """The lowest rate of the usable offline settings (or the setting ``key``)."""
    if key is not None:
        if key not in rates:
            raise KeyError(f"--offline-key {key!r} not decoded for {what}; found {sorted(rates)}")
        return rates[key]
    try:
        return rates[best_setting(rates, None, search, blank_penalty)]
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def relative(rate: float, base: float) -> str:
    return f"{rate:.2f} ({100 * (rate - base) / base:+.1f}%)" if base else f"{rate:.2f}"


def table_rows(offline: Dict[str, Dict[str, float]], streaming: Sequence[Tuple[str, Dict[str, Dict[str, float]]]],
               sets: Sequence[str], offline_key: Optional[str] = None, search: str = "best",
               blank_penalty: float = 0.0) -> List[List[str]]:
    """Rows [mode, h, (WER, relative change) per set]: the offline row first, then those of
    each (name, results) of ``streaming`` in order."""
    bases = {s: best_rate(offline[s], f"the offline model's {s}", offline_key, search, blank_penalty) for s in sets}
    rows = [["offline", "-"] + [f"{bases[s]:.2f}" for s in sets]]
    for name, results in streaming:
        histories = sorted({int(m.group("h")) for s in sets for key in results[s]
                            if (m := HISTORY.match(key)) and usable(key, search, blank_penalty)})
        if not histories:
            raise ValueError(f"the {name} results hold no _history-<h>s setting of that search and blank penalty "
                             "(decode with ctc-streaming-* methods)")
        for h in histories:
            row = [name, str(h)]
            for test_set in sets:
                found = [rate for key, rate in results[test_set].items()
                         if (m := HISTORY.match(key)) and int(m.group("h")) == h and usable(key, search, blank_penalty)]
                row.append(relative(min(found), bases[test_set]) if found else "-")
            rows.append(row)
    return rows


def readout_rows(speech: Dict[str, Dict[str, float]], query: Dict[str, Dict[str, float]], sets: Sequence[str],
                 search: str = "best", blank_penalty: float = 0.0) -> List[List[str]]:
    """Table 9's rows [readout, WER per set]: speech, then query with its relative change."""
    speech_rates = {s: best_rate(speech[s], f"the speech readout's {s}", None, search, blank_penalty) for s in sets}
    query_rates = {s: best_rate(query[s], f"the query readout's {s}", None, search, blank_penalty) for s in sets}
    return [["speech"] + [f"{speech_rates[s]:.2f}" for s in sets],
            ["query (causal)"] + [relative(query_rates[s], speech_rates[s]) for s in sets]]


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(row) + " |" for row in rows]


def main(argv: Optional[Sequence[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offline", type=Path, required=True, help="the offline (query-readout) model's folder")
    parser.add_argument("--streaming", type=Path, required=True, action="append",
                        help="a streaming model's experiment folder (again for another model)")
    parser.add_argument("--speech", type=Path, default=None,
                        help="an offline speech-readout model's folder: the Table 9 layout first")
    parser.add_argument("--sets", nargs="+", required=True, help="test set names, e.g. dev test")
    parser.add_argument("--offline-key", default=None, help="the offline setting (default: its best)")
    parser.add_argument("--search", choices=sorted(SEARCHES), default="best",
                        help="prefix beam or greedy search only (default: the better of either)")
    parser.add_argument("--blank-penalty", type=float, default=0.0,
                        help="the settings decoded with this decode.blank_penalty (default 0)")
    args = parser.parse_args(argv)
    try:
        offline = {s: newest_summary(args.offline, s) for s in args.sets}
        streaming = [(f"streaming: {folder.name}" if len(args.streaming) > 1 else "streaming",
                      {s: newest_summary(folder, s) for s in args.sets}) for folder in args.streaming]
        speech = {s: newest_summary(args.speech, s) for s in args.sets} if args.speech else None
        rows = table_rows(offline, streaming, args.sets, args.offline_key, args.search, args.blank_penalty)
        readouts = readout_rows(speech, offline, args.sets, args.search, args.blank_penalty) if speech else None
    except (FileNotFoundError, KeyError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    lines = []
    if readouts is not None:
        lines += markdown(["readout (offline)"] + [f"{s} WER (%)" for s in args.sets], readouts) + [""]
    lines += markdown(["mode", "h (s)"] + [f"{s} WER (%)" for s in args.sets], rows)
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
