"""local.normalize_text: training and scoring text of each corpus."""

import pytest

from asr.scoring import normalize_gigaspeech_text as gigaspeech_scoring_text
from local.normalize_text import gigaspeech_training_text


@pytest.mark.parametrize("tag", ["<SIL>", "<MUSIC>", "<NOISE>", "<OTHER>"])
def test_gigaspeech_segments_with_garbage_tags_are_dropped(tag):
    assert gigaspeech_training_text(tag) is None
    assert gigaspeech_training_text(f"HELLO {tag} THERE") is None


def test_gigaspeech_punctuation_tags_are_deleted():
    text = "AS THEY SAY <COMMA> TIME IS MONEY <PERIOD>"
    assert gigaspeech_training_text(text) == "AS THEY SAY TIME IS MONEY"
    assert gigaspeech_training_text("WHY <QUESTIONMARK> NO <EXCLAMATIONPOINT>") == "WHY NO"
    # A tag glued to a word is not a tag.
    assert gigaspeech_training_text("A<COMMA>B") == "A<COMMA>B"


def test_gigaspeech_scoring_removes_fillers_tags_and_hyphens():
    assert gigaspeech_scoring_text("uh the e-commerce <COMMA> um site <UNK> <MUSIC>") == "THE E COMMERCE SITE"
    assert gigaspeech_scoring_text("HUH") == ""
