"""Offline against streaming WER in the layout of the paper's Table 5: one row for the
offline model, one per left history h of the streaming model, per test set, with the
relative change against offline (Sec. 5.4: within 3% relative on GigaSpeech test)::

    python -m llm_ctc.streaming.table --offline exp/table5_offline_qwen3-asr-0.6b \\
        --streaming exp/table5_streaming_qwen3-asr-0.6b --sets dev test

Reads the ``wer-summary-<set>-<suffix>.txt`` files of ``asr.decode`` (the newest one per
set and folder); the offline row is its best setting (``--offline-key`` to choose one),
the streaming rows its ``..._history-<h>s`` settings.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from asr.scoring import read_wer_summary

HISTORY = re.compile(r"^(?P<method>.+)_history-(?P<h>\d+)s$")


def newest_summary(exp_dir: Path, test_set: str) -> Dict[str, float]:
    """setting -> WER of the newest wer-summary file of ``test_set`` in ``exp_dir``."""
    paths = sorted(exp_dir.glob(f"wer-summary-{test_set}-*.txt"), key=lambda path: path.stat().st_mtime)
    if not paths:
        raise FileNotFoundError(f"no wer-summary-{test_set}-*.txt in {exp_dir}: decode it first")
    suffix = paths[-1].name[len(f"wer-summary-{test_set}-"):-len(".txt")]
    return read_wer_summary(exp_dir, test_set, suffix)


def table_rows(offline: Dict[str, Dict[str, float]], streaming: Dict[str, Dict[str, float]],
               sets: Sequence[str], offline_key: Optional[str] = None) -> List[List[str]]:
    """Rows [mode, h, (WER, relative change) per set]: the offline row first."""
    def offline_rate(test_set: str) -> float:
        rates = offline[test_set]
        if offline_key is not None:
            if offline_key not in rates:
                raise KeyError(f"--offline-key {offline_key!r} not decoded for {test_set}; found {sorted(rates)}")
            return rates[offline_key]
        return min(rates.values())

    histories = sorted({int(m.group("h")) for s in sets for key in streaming[s] if (m := HISTORY.match(key))})
    if not histories:
        raise ValueError("the streaming results hold no _history-<h>s setting (decode with ctc-streaming-* methods)")
    rows = [["offline", "-"] + [f"{offline_rate(s):.2f}" for s in sets]]
    for h in histories:
        row = ["streaming", str(h)]
        for test_set in sets:
            found = [rate for key, rate in streaming[test_set].items()
                     if (m := HISTORY.match(key)) and int(m.group("h")) == h]
            if not found:
                row.append("-")
                continue
            rate, base = min(found), offline_rate(test_set)
            row.append(f"{rate:.2f} ({100 * (rate - base) / base:+.1f}%)" if base else f"{rate:.2f}")
        rows.append(row)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--offline", type=Path, required=True, help="the offline model's experiment folder")
    parser.add_argument("--streaming", type=Path, required=True, help="the streaming model's experiment folder")
    parser.add_argument("--sets", nargs="+", required=True, help="test set names, e.g. dev test")
    parser.add_argument("--offline-key", default=None, help="the offline setting (default: its best)")
    args = parser.parse_args(argv)
    try:
        offline = {s: newest_summary(args.offline, s) for s in args.sets}
        streaming = {s: newest_summary(args.streaming, s) for s in args.sets}
        rows = table_rows(offline, streaming, args.sets, args.offline_key)
    except (FileNotFoundError, KeyError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    header = ["mode", "h (s)"] + [f"{s} WER (%)" for s in args.sets]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
