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


def test_a_set_whose_name_extends_another_is_not_read_for_it(tmp_path):
    """test-clean-long's summary, newer, is not test-clean's."""
    import os

    offline, streaming = tmp_path / "off", tmp_path / "on"
    write_summary(offline, "test-clean", {"ctc-greedy-search": 2.0})
    key = "ctc-streaming-greedy-search_history-2s"
    write_summary(streaming, "test-clean", {key: 3.0})
    write_summary(streaming, "test-clean-long", {key: 6.0})
    long = streaming / "wer-summary-test-clean-long-iter-8_avg-1.txt"
    os.utime(long, (long.stat().st_mtime + 10, long.stat().st_mtime + 10))
    text = table(["--offline", str(offline), "--streaming", str(streaming), "--sets", "test-clean"])
    assert text.splitlines()[-1] == "| streaming | 2 | 3.00 (+50.0%) |"


def test_missing_results_are_named(tmp_path):
    with pytest.raises(SystemExit, match="no wer-summary-dev-\\*.txt in .*off: decode it first"):
        table(["--offline", str(tmp_path / "off"), "--streaming", str(tmp_path), "--sets", "dev"])


def test_the_table_9_layout_and_the_search_and_blank_penalty_chosen(tmp_path):
    """With --speech the readouts come first (query relative to speech); --search and
    --blank-penalty choose the settings every row may use."""
    speech, query, streaming = tmp_path / "speech", tmp_path / "query", tmp_path / "on"
    beam, greedy = "ctc-prefix-beam-search_beam-4_token-penalty-0.3", "ctc-greedy-search"
    for test_set, scale in (("dev", 1.0), ("test", 2.0)):
        write_summary(speech, test_set, {beam: 2.0 * scale, greedy: 1.5 * scale, f"{beam}_blank-penalty-0.5": 1.0})
        write_summary(query, test_set, {beam: 2.5 * scale, greedy: 3.0 * scale, f"{beam}_blank-penalty-0.5": 2.0})
        on = "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3"
        write_summary(streaming, test_set, {f"{on}_history-2s": 3.0 * scale, f"{on}_blank-penalty-0.5_history-2s": 2.2,
                                            f"ctc-streaming-greedy-search_history-2s": 1.0})
    args = ["--speech", str(speech), "--offline", str(query), "--streaming", str(streaming), "--sets", "dev", "test"]
    lines = table(args + ["--search", "beam"]).splitlines()
    assert lines[0] == "| readout (offline) | dev WER (%) | test WER (%) |"
    assert lines[2:4] == ["| speech | 2.00 | 4.00 |", "| query (causal) | 2.50 (+25.0%) | 5.00 (+25.0%) |"]
    assert lines[7:] == ["| offline | - | 2.50 | 5.00 |", "| streaming | 2 | 3.00 (+20.0%) | 6.00 (+20.0%) |"]
    lines = table(args + ["--search", "beam", "--blank-penalty", "0.5"]).splitlines()
    assert lines[2:4] == ["| speech | 1.00 | 1.00 |", "| query (causal) | 2.00 (+100.0%) | 2.00 (+100.0%) |"]
    assert lines[-1] == "| streaming | 2 | 2.20 (+10.0%) | 2.20 (+10.0%) |"
    # The default takes the better of greedy and beam search, at blank penalty 0.
    assert table(args).splitlines()[2] == "| speech | 1.50 | 3.00 |"
    with pytest.raises(SystemExit, match="no offline setting of search 'beam' and blank penalty 1"):
        table(args + ["--search", "beam", "--blank-penalty", "1"])


def test_several_streaming_models_each_give_their_rows_named_by_their_folder(tmp_path):
    """Table 5 with stage 11's single-sentence streaming model and stage 10's: each model's
    histories in the order given, each relative to the one offline model."""
    offline, sentences, joined = tmp_path / "off", tmp_path / "full_sentences", tmp_path / "full_joined"
    write_summary(offline, "test", {"ctc-prefix-beam-search_beam-4_token-penalty-0.3": 2.0})
    key = "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3_history-{}s"
    write_summary(sentences, "test", {key.format(2): 2.1, key.format(8): 2.05})
    write_summary(joined, "test", {key.format(2): 4.0})
    text = table(["--offline", str(offline), "--streaming", str(sentences), "--streaming", str(joined),
                  "--sets", "test"])
    assert text.splitlines()[2:] == ["| offline | - | 2.00 |",
                                     "| streaming: full_sentences | 2 | 2.10 (+5.0%) |",
                                     "| streaming: full_sentences | 8 | 2.05 (+2.5%) |",
                                     "| streaming: full_joined | 2 | 4.00 (+100.0%) |"]
    # A folder without streaming settings is named in the error.
    write_summary(tmp_path / "full_offline_only", "test", {"ctc-greedy-search": 3.0})
    with pytest.raises(SystemExit, match="the streaming: full_offline_only results hold no _history"):
        table(["--offline", str(offline), "--streaming", str(sentences), "--streaming",
               str(tmp_path / "full_offline_only"), "--sets", "test"])


def test_best_setting_is_the_lowest_usable_one_of_its_history():
    from llm_ctc.streaming.table import best_setting

    rates = {"ctc-prefix-beam-search_beam-4": 2.0, "ctc-prefix-beam-search_beam-4_blank-penalty-0.5": 1.0,
             "ctc-greedy-search": 1.5, "ctc-streaming-prefix-beam-search_beam-4_history-2s": 3.0,
             "ctc-streaming-greedy-search_history-2s": 2.5, "ctc-streaming-prefix-beam-search_beam-4_history-8s": 0.5}
    assert best_setting(rates, search="beam") == "ctc-prefix-beam-search_beam-4"
    assert best_setting(rates, search="best") == "ctc-greedy-search"
    assert best_setting(rates, search="beam", blank_penalty=0.5) == "ctc-prefix-beam-search_beam-4_blank-penalty-0.5"
    assert best_setting(rates, history=2) == "ctc-streaming-greedy-search_history-2s"
    assert best_setting(rates, history=2, search="beam") == "ctc-streaming-prefix-beam-search_beam-4_history-2s"
    with pytest.raises(ValueError, match="history-4s"):
        best_setting(rates, history=4)
