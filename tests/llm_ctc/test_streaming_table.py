"""The Table 5 layout from asr.decode's summary files."""

import pytest

from llm_ctc.streaming.table import main as table


def write_summary(folder, test_set, rates):
    folder.mkdir(exist_ok=True)
    lines = ["settings\tWER"] + [f"{key}\t{rate}" for key, rate in rates.items()]
    (folder / f"wer-summary-{test_set}-iter-8_avg-1.txt").write_text("\n".join(lines) + "\n")


def test_rows_are_offline_then_each_history_with_the_relative_change(tmp_path):
    offline, streaming = tmp_path / "off", tmp_path / "on"
    write_summary(offline, "test", {"ctc-prefix-beam-search_beam-4_token-penalty-0.7": 10.0,
                                    "ctc-greedy-search": 12.0})
    key = "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.7_history-{}s"
    write_summary(streaming, "test", {key.format(8): 10.3, key.format(2): 10.5})
    text = table(["--offline", str(offline), "--streaming", str(streaming), "--sets", "test"])
    assert text.splitlines()[2:] == ["| offline | - | 10.00 |", "| streaming | 2 | 10.50 (+5.0%) |",
                                     "| streaming | 8 | 10.30 (+3.0%) |"]


def test_missing_results_are_named(tmp_path):
    with pytest.raises(SystemExit, match="no wer-summary-dev-\\*.txt in .*off: decode it first"):
        table(["--offline", str(tmp_path / "off"), "--streaming", str(tmp_path), "--sets", "dev"])
