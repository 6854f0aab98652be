"""Specification of asr.scoring: error counts against kaldialign, hand-checked
icefall files, GigaSpeech normalization against the official tag list."""

from __future__ import annotations

import random

import kaldialign
import pytest

from asr.atomic_io import write_text_atomically
from asr.scoring import (
    GIGASPEECH_NON_SCORING_WORDS,
    compute_error_stats,
    format_error_stats,
    format_recogs,
    format_wer_summary,
    normalize_gigaspeech_text,
    read_recogs,
    save_results,
)

# Two utterances, two substitutions over six words; expected errs- text checked by hand.
HAND_RESULTS = [
    ("utt-2", ["I", "HATE", "YOU"], ["I", "hate", "YOU"]),
    ("utt-1", ["I", "LOVE", "YOU"], ["i", "LOVE", "YOU"]),
]
HAND_ERRS = """\
%WER = 33.33
Errors: 0 insertions, 0 deletions, 2 substitutions, over 6 reference words (4 correct)
Search below for sections starting with PER-UTT DETAILS:, SUBSTITUTIONS:, DELETIONS:, INSERTIONS:, PER-WORD STATS:

PER-UTT DETAILS: corr or (ref->hyp)  
utt-1:\t(I->i) LOVE YOU
utt-2:\tI (HATE->hate) YOU

SUBSTITUTIONS: count ref -> hyp
1   I -> i
1   HATE -> hate

DELETIONS: count ref

INSERTIONS: count hyp

PER-WORD STATS: word  corr tot_errs count_in_ref count_in_hyp
i   0 1 0 1
hate   0 1 0 1
I   1 1 2 1
HATE   0 1 1 0
YOU   2 0 2 2
LOVE   1 0 1 1
"""


def random_word_results(seed: int, count: int):
    rng = random.Random(seed)
    vocabulary = ["A", "B", "C", "D", "E"]
    return [
        (
            f"cut-{index:03d}",
            [rng.choice(vocabulary) for _ in range(rng.randint(0, 8))],
            [rng.choice(vocabulary) for _ in range(rng.randint(0, 8))],
        )
        for index in range(count)
    ]


def test_counts_equal_kaldialign_edit_distance_summed_over_utterances():
    results = random_word_results(seed=0, count=200)
    stats = compute_error_stats(results)
    expected = {"ins": 0, "del": 0, "sub": 0, "ref_len": 0}
    for _, reference, hypothesis in results:
        distance = kaldialign.edit_distance(reference, hypothesis)
        for name in expected:
            expected[name] += distance[name]
    assert (stats.insertions, stats.deletions, stats.substitutions, stats.reference_length) == (
        expected["ins"], expected["del"], expected["sub"], expected["ref_len"],
    )
    errors = expected["ins"] + expected["del"] + expected["sub"]
    assert stats.error_rate == pytest.approx(100.0 * errors / expected["ref_len"])
    assert stats.correct == stats.reference_length - stats.deletions - stats.substitutions


def test_errs_file_of_hand_checked_example():
    assert format_error_stats(compute_error_stats(HAND_RESULTS)) == HAND_ERRS


def test_consecutive_errors_are_merged_in_per_utterance_details():
    stats = compute_error_stats([("u", ["A", "B", "C", "D"], ["A", "X", "D", "E"])])
    # kaldialign: A=A, B->X, C deleted, D=D, E inserted.
    assert (stats.substitutions, stats.deletions, stats.insertions) == (1, 1, 1)
    assert "u:\tA (B C->X) D (*->E)\n" in format_error_stats(stats)
    assert format_error_stats(stats).startswith("%WER = 75.00\n")


def test_cer_scores_characters_with_spaces_removed():
    results = [("c1", ["今天", "天气 好"], ["今天天", "汽"])]
    stats = compute_error_stats(results, compute_cer=True)
    # 今天天气好 vs 今天天汽: one substitution, one deletion over five characters.
    assert (stats.substitutions, stats.deletions, stats.insertions, stats.reference_length) == (1, 1, 0, 5)
    assert stats.error_rate == pytest.approx(40.0)
    assert format_recogs(results, compute_cer=True) == (
        "c1:\tref=['今', '天', '天', '气', '好']\nc1:\thyp=['今', '天', '天', '汽']\n"
    )


def test_recogs_file_is_sorted_by_cut_id_with_python_list_reprs():
    assert format_recogs(HAND_RESULTS) == (
        "utt-1:\tref=['I', 'LOVE', 'YOU']\nutt-1:\thyp=['i', 'LOVE', 'YOU']\n"
        "utt-2:\tref=['I', 'HATE', 'YOU']\nutt-2:\thyp=['I', 'hate', 'YOU']\n"
    )


def test_wer_summary_lists_settings_best_first():
    assert format_wer_summary({"beam-8": 2.5, "greedy": 2.75, "beam-4": 2.49}) == (
        "settings\tWER\nbeam-4\t2.49\nbeam-8\t2.5\ngreedy\t2.75\n"
    )


def test_save_results_writes_the_three_files_and_prints_best_setting(tmp_path, capsys):
    worse = [
        ("utt-1", ["I", "LOVE", "YOU"], ["I", "LOVE"]),
        ("utt-2", ["I", "HATE", "YOU"], ["I", "HATE", "YOU"]),
    ]
    rates = save_results(tmp_path / "out", "test-clean", {"greedy": worse, "beam-4": HAND_RESULTS})
    assert rates == {"greedy": 16.67, "beam-4": 33.33}
    names = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert names == [
        "errs-test-clean-beam-4.txt", "errs-test-clean-greedy.txt",
        "recogs-test-clean-beam-4.txt", "recogs-test-clean-greedy.txt", "wer-summary-test-clean.txt",
    ]
    assert (tmp_path / "out" / "errs-test-clean-beam-4.txt").read_text(encoding="utf-8") == HAND_ERRS
    summary = (tmp_path / "out" / "wer-summary-test-clean.txt").read_text()
    assert summary == "settings\tWER\ngreedy\t16.67\nbeam-4\t33.33\n"
    printed = capsys.readouterr().out
    assert (
        "For test-clean, WER of different settings are:\n"
        "greedy\t16.67\tbest for test-clean\nbeam-4\t33.33\n"
    ) in printed


def test_a_second_run_adds_its_settings_to_the_summary_of_the_first(tmp_path):
    """Settings scored earlier into the same folder and suffix stay in the summary (while
    their errs- file is there); a setting scored again takes its new rate."""
    worse = [("utt-1", ["I", "LOVE", "YOU"], ["I", "LOVE"]), ("utt-2", ["I", "HATE", "YOU"], ["I", "HATE", "YOU"])]
    save_results(tmp_path, "dev", {"greedy": worse, "beam-4": worse}, suffix="iter-8")
    save_results(tmp_path, "dev", {"streaming": HAND_RESULTS, "beam-4": HAND_RESULTS}, suffix="iter-8")
    summary = (tmp_path / "wer-summary-dev-iter-8.txt").read_text()
    assert summary == "settings\tWER\ngreedy\t16.67\nstreaming\t33.33\nbeam-4\t33.33\n"
    (tmp_path / "errs-dev-greedy-iter-8.txt").unlink()
    save_results(tmp_path, "dev", {"beam-4": worse}, suffix="iter-8")
    assert (tmp_path / "wer-summary-dev-iter-8.txt").read_text() == "settings\tWER\nbeam-4\t16.67\nstreaming\t33.33\n"
    save_results(tmp_path, "dev", {"greedy": worse}, suffix="iter-9")  # other weights: a summary of their own
    assert (tmp_path / "wer-summary-dev-iter-9.txt").read_text() == "settings\tWER\ngreedy\t16.67\n"


def test_save_results_suffix_and_normalizer(tmp_path):
    results = [("g1", ["UM", "E-COMMERCE", "<COMMA>", "rocks"], ["e", "commerce", "ROCKS", "uh"])]
    rates = save_results(
        tmp_path,
        "dev",
        {"greedy": results},
        text_normalizer=normalize_gigaspeech_text,
        suffix="epoch-30_avg-15",
    )
    assert rates == {"greedy": 0.0}
    assert (tmp_path / "wer-summary-dev-epoch-30_avg-15.txt").exists()
    recogs = (tmp_path / "recogs-dev-greedy-epoch-30_avg-15.txt").read_text()
    assert "g1:\tref=['E', 'COMMERCE', 'ROCKS']" in recogs


@pytest.mark.parametrize("results_by_key", [{}, {"greedy": []}])
def test_empty_test_set_prints_a_message_and_writes_nothing(tmp_path, capsys, results_by_key):
    assert save_results(tmp_path, "test", results_by_key) == {}
    assert "no utterances to score" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_empty_references_give_zero_or_infinite_rate(tmp_path):
    assert compute_error_stats([("u", [], [])]).error_rate == 0.0
    rates = save_results(tmp_path, "test", {"greedy": [("u", [], ["A"])]})
    assert rates == {"greedy": float("inf")}
    assert (tmp_path / "errs-test-greedy.txt").read_text().startswith("%WER = inf\n")


def test_atomic_write_keeps_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "errs-test-x.txt"
    write_text_atomically(target, "old\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomically(target, "new \ud800\n")  # lone surrogate: not encodable
    assert target.read_text() == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["errs-test-x.txt"]


def test_gigaspeech_non_scoring_words_are_the_official_list():
    official = {
        "UH", "UHH", "UM", "EH", "MM", "HM", "AH", "HUH", "HA", "ER", "OOF", "HEE", "ACH", "EEE", "EW",
        "<UNK>", "<unk>",
        "<COMMA>", "<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>",
        "<SIL>", "<NOISE>", "<MUSIC>", "<OTHER>",
    }
    assert GIGASPEECH_NON_SCORING_WORDS == official


@pytest.mark.parametrize("word", sorted(GIGASPEECH_NON_SCORING_WORDS))
def test_gigaspeech_removes_each_non_scoring_word_in_any_case(word):
    assert normalize_gigaspeech_text(f"HELLO {word} WORLD") == "HELLO WORLD"
    assert normalize_gigaspeech_text(f"{word.lower()} hello") == "HELLO"


def test_gigaspeech_normalization_hand_checked():
    text = "State-of-the-art <COMMA> um I THINK <unk> it's hmm GREAT <PERIOD>"
    assert normalize_gigaspeech_text(text) == "STATE OF THE ART I THINK IT'S HMM GREAT"
    # Only whole words are removed: near-fillers and glued tags stay.
    assert normalize_gigaspeech_text("UMM UHM HMM AHA <COMMA>, ERR") == "UMM UHM HMM AHA <COMMA>, ERR"
    assert normalize_gigaspeech_text("  E-COMMERCE\tUH-HUH ") == "E COMMERCE"
    assert normalize_gigaspeech_text("<MUSIC> <NOISE>") == ""


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda tmp: compute_error_stats([("u", "A B", ["A"])]), TypeError, "results: .*'A B'"),
        (lambda tmp: compute_error_stats([("u", ["A"])]), TypeError, r"results .*\('u', \['A'\]\)"),
        (lambda tmp: compute_error_stats([(1, ["A"], ["A"])]), TypeError, r"results .*\(1, "),
        (lambda tmp: normalize_gigaspeech_text(["A"]), TypeError, r"text .*\['A'\]"),
        (lambda tmp: save_results(tmp, "", {"k": []}), ValueError, "test_set_name .*''"),
        (lambda tmp: save_results(tmp, "a/b", {"k": []}), ValueError, "test_set_name .*'a/b'"),
        (lambda tmp: save_results(tmp, "test", [("u", ["A"], ["A"])]), TypeError, "results_by_key .*list"),
        (
            lambda tmp: save_results(tmp, "test", {"": [("u", ["A"], ["A"])]}),
            ValueError,
            "results_by_key .*''",
        ),
    ],
)
def test_bad_arguments_raise_errors_naming_the_argument(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)


def test_read_recogs_reads_what_the_decoder_writes(tmp_path):
    results = [("long-000-0", ["a", "b", "c"], ["a", "c"]), ("s-1", ["d"], [])]
    path = tmp_path / "recogs.txt"
    path.write_text(format_recogs(results))
    assert read_recogs(path) == {"long-000-0": (["a", "b", "c"], ["a", "c"]), "s-1": (["d"], [])}


def test_read_recogs_names_a_cut_without_its_hypothesis(tmp_path):
    path = tmp_path / "recogs.txt"
    path.write_text("s-1:\tref=['a']\n")
    with pytest.raises(ValueError, match="cut s-1 lacks its ref= or hyp= line"):
        read_recogs(path)
