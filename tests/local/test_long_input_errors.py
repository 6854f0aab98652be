"""local.long_input_errors: counts each reference word's error at its place in its sentence
and its sentence's start time, as worked out by hand from the definition on a small
example."""

from collections import Counter

import pytest

from local.long_input_errors import (BY_WORD, chunk_phase_key, count_errors, format_table, format_word_by_word,
                                     from_starts, main, place_in_sentence, reference_word_errors, with_gaps)


def test_places_in_a_sentence():
    assert [place_in_sentence(j, 5) for j in range(5)] == ["first", "second", "other", "other", "last"]
    assert [place_in_sentence(j, 2) for j in range(2)] == ["first", "last"]
    assert place_in_sentence(0, 1) == "first"


def test_reference_word_errors():
    assert reference_word_errors(["a", "b", "c", "d"], ["a", "x", "d", "e"]) == (["C", "S", "D", "C"], 1)


def test_errors_are_counted_at_each_words_place_and_its_sentences_start():
    # Three sentences of 4, 7 and 2 s: they start at 0, 4 and 11 s.
    sentences = {"s1": (["a", "b", "c"], ["a", "b", "c"]),
                 "s2": (["d", "e", "f", "g"], ["d", "e", "f", "g", "h"]),  # one inserted word
                 "s3": (["i", "j"], ["i", "k"])}  # its last word substituted
    # The long decode drops s2's first word and substitutes s1's last.
    recording = (["a", "b", "c", "d", "e", "f", "g", "i", "j"], ["a", "b", "x", "e", "f", "g", "i", "j"],
                 [("s1", 4.0), ("s2", 7.0), ("s3", 2.0)])
    table = count_errors([recording], sentences)
    assert table["first"] == {("long", "C"): 2, ("long", "D"): 1, ("one by one", "C"): 3}
    assert table["last"] == {("long", "S"): 1, ("long", "C"): 2, ("one by one", "C"): 2, ("one by one", "S"): 1}
    assert table["second"] == {("long", "C"): 2, ("one by one", "C"): 2}  # b and e
    assert table["other"] == {("long", "C"): 1, ("one by one", "C"): 1}  # f
    assert table["0-10 s"] == {("long", "C"): 5, ("long", "S"): 1, ("long", "D"): 1, ("one by one", "C"): 7}
    assert table["10-20 s"] == {("long", "C"): 2, ("one by one", "C"): 1, ("one by one", "S"): 1}
    assert table["insertions"] == Counter({"long": 0, "one by one": 1})
    # First words after a join by where their sentence starts in a 2 s chunk: s2 at 4 s (a
    # boundary), s3 at 11 s (1 s in); s1 opens the recording and has no join before it.
    assert table["after a join, 0.0-0.5 s into a chunk"] == {("long", "D"): 1, ("one by one", "C"): 1}
    assert table["after a join, 1.0-1.5 s into a chunk"] == {("long", "C"): 1, ("one by one", "C"): 1}
    assert sum(sum(row.values()) for key, row in table.items() if key.endswith("into a chunk")) == 4
    text = format_table(table)
    assert "| first word of a sentence | 3 | 33.3% (0 S, 1 D) | 0.0% (0 S, 0 D) |" in text
    assert "| sentence starting at 10-20 s | 2 | 0.0% (0 S, 0 D) | 50.0% (1 S, 0 D) |" in text
    assert "| first word after a join, 0.0-0.5 s into a chunk | 1 | 100.0% (0 S, 1 D) | 0.0% (0 S, 0 D) |" in text
    lines = text.splitlines()
    assert lines.index("| first word after a join, 0.0-0.5 s into a chunk | 1 | 100.0% (0 S, 1 D) | 0.0% (0 S, 0 D) |") \
        < lines.index("| first word after a join, 1.0-1.5 s into a chunk | 1 | 0.0% (0 S, 0 D) | 0.0% (0 S, 0 D) |") \
        < lines.index("| sentence starting at 0-10 s | 7 | 28.6% (1 S, 1 D) | 0.0% (0 S, 0 D) |")
    # Word by word: the words where two sentences meet are c, d (s1 | s2) and g, i (s2 | s3);
    # a and j open and close the recording. c and d are wrong only in the recording, j only
    # one by one.
    assert table[BY_WORD] == {("at a join", True, False): 2, ("at a join", False, False): 2,
                              ("inside a sentence", False, False): 4, ("inside a sentence", False, True): 1}
    assert format_word_by_word(table).splitlines()[2:] == ["| at a join | 4 | 0 | 2 | 0 |",
                                                           "| inside a sentence | 5 | 0 | 0 | 1 |"]


@pytest.mark.parametrize("start, chunk, expected", [
    (0.5, 2.0, "0.5-1.0"), (1.999, 2.0, "1.5-2.0"), (7.25, 2.0, "1.0-1.5"),
    # Sums of float durations a hair below an edge belong to the part it opens.
    (0.1 + 0.2 + 0.2, 2.0, "0.5-1.0"), (3.9999999999, 2.0, "0.0-0.5"), (2.0, 4.0, "2.0-3.0"),
])
def test_chunk_phase_key(start, chunk, expected):
    assert chunk_phase_key(start, chunk) == f"after a join, {expected} s into a chunk"


def test_a_chunk_of_no_length_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--chunk-seconds must be > 0, got 0.0"):
        main([str(tmp_path), "a", "b", "c", "--chunk-seconds", "0"])


def test_a_recording_whose_sentences_do_not_add_up_is_refused():
    sentences = {"s1": (["a", "b"], ["a", "b"])}
    with pytest.raises(ValueError, match="reference has 3 words, its sentences 2"):
        count_errors([(["a", "b", "c"], ["a", "b", "c"], [("s1", 1.0)])], sentences)


def test_the_silence_between_sentences_moves_the_next_starts():
    """Three sentences of 4, 7 and 2 s with 0.5 s between them (a 14 s recording) start at
    0, 4.5 and 12 s: each but the last spans its duration and the silence after it."""
    assert with_gaps([("s1", 4.0), ("s2", 7.0), ("s3", 2.0)], 14.0) == [("s1", 4.5), ("s2", 7.5), ("s3", 2.0)]
    assert with_gaps([("s1", 4.0), ("s2", 7.0)], 11.0) == [("s1", 4.0), ("s2", 7.0)]  # back to back
    assert with_gaps([("s1", 4.0)], 4.0) == [("s1", 4.0)]
    with pytest.raises(ValueError, match="shorter than its sentences"):
        with_gaps([("s1", 4.0), ("s2", 7.0)], 10.0)


def test_the_starts_join_utterances_lists_place_each_sentence():
    """Sentences listed as starting at 1.5, 4.5 and 8.5 s (join_utterances --phase-seconds
    1.5 --chunk-seconds 2 over 2.6 s and 3.1 s sentences with 0.3 s or more between them):
    3 s and 4 s from each start to the next, the first at 1.5 s; their first words after a
    join fall 0.5 s into a chunk, and without the lead they would fall 1 s into one."""
    members, lead = from_starts(["s1", "s2", "s3"], [1.5, 4.5, 8.5])
    assert members == [("s1", 3.0), ("s2", 4.0), ("s3", 0.0)] and lead == 1.5
    sentences = {"s1": (["a"], ["a"]), "s2": (["b"], ["b"]), "s3": (["c"], ["c"])}
    recording = (["a", "b", "c"], ["a", "x", "c"], members)
    table = count_errors([recording], sentences, leads=[lead])
    assert table["after a join, 0.5-1.0 s into a chunk"] == {("long", "S"): 1, ("long", "C"): 1,
                                                             ("one by one", "C"): 2}
    unshifted = count_errors([recording], sentences)
    assert "after a join, 0.5-1.0 s into a chunk" not in unshifted
    assert unshifted["after a join, 1.0-1.5 s into a chunk"] == table["after a join, 0.5-1.0 s into a chunk"]
    with pytest.raises(ValueError, match="3 sentences need as many starts in order"):
        from_starts(["s1", "s2", "s3"], [0.0, 2.0])
