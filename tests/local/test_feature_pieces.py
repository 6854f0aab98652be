"""local.feature_pieces: which pieces lack features, and the checks run.sh calls before
training (they read file names only, so empty files stand for manifests here)."""

import logging

import pytest

from local.feature_pieces import DONE_MARK, check_pieces, compute_pieces, pieces_without_features


def make_split(folder, pieces, finished, mark=True):
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(pieces):
        (folder / f"gigaspeech_cuts_XL_raw.{index}.jsonl.gz").write_text("")
    for index in finished:
        (folder / f"gigaspeech_cuts_XL.{index}.jsonl.gz").write_text("")
    if mark:
        (folder / DONE_MARK).write_text("")
    return folder


def test_pieces_without_their_cuts_with_features_are_listed(tmp_path):
    split = make_split(tmp_path / "split", 4, finished=[0, 2])
    assert [p.name for p in pieces_without_features(split)] == [
        "gigaspeech_cuts_XL_raw.1.jsonl.gz", "gigaspeech_cuts_XL_raw.3.jsonl.gz"]
    # Features of another stage, in another folder under the same names.
    other = make_split(tmp_path / "fbank128", 0, finished=[0, 1, 2, 3], mark=False)
    assert pieces_without_features(split, other) == []


def test_the_check_names_the_missing_count_and_the_stages_that_make_them(tmp_path):
    split = make_split(tmp_path / "split", 3, finished=[1])
    with pytest.raises(ValueError, match=rf"^2 of 3 piece\(s\) of {split} without features: finish stages 5 and 6 first$"):
        check_pieces(split, finish="stages 5 and 6")
    elsewhere = tmp_path / "fbank128"
    with pytest.raises(ValueError, match=rf"3 of 3 piece\(s\) of {split} without features in {elsewhere}: finish stage 20"):
        check_pieces(split, elsewhere, finish="stage 20")
    for index in (0, 2):
        (split / f"gigaspeech_cuts_XL.{index}.jsonl.gz").write_text("")
    assert check_pieces(split) == f"all 3 pieces of {split} have features"


def test_a_missing_split_is_named(tmp_path):
    split = make_split(tmp_path / "split", 2, finished=[0, 1], mark=False)
    with pytest.raises(ValueError, match=rf"{split}: not split \(no {DONE_MARK}\): finish stages 5 and 6 first"):
        check_pieces(split, finish="stages 5 and 6")


def test_a_finished_range_is_skipped_without_reading_a_piece(tmp_path, caplog):
    # Empty files are no manifests: reading one would fail.
    split = make_split(tmp_path / "split", 3, finished=[0, 1])
    with caplog.at_level(logging.INFO):
        outputs = compute_pieces(split, start=0, stop=2)
    assert [p.name for p in outputs] == ["gigaspeech_cuts_XL.0.jsonl.gz", "gigaspeech_cuts_XL.1.jsonl.gz"]
    assert "fbank of pieces [0, 2): all done, skipping" in caplog.text
