"""local.sentence_grammar: English and Mandarin transcripts for synthesized corpora."""

import random

import numpy as np
import pytest

from local.sentence_grammar import (
    MANDARIN_WORDS,
    english_sentence,
    english_sentences,
    english_vocabulary,
    mandarin_sentence,
)


def test_english_grammar_has_several_hundred_words_and_about_8_words_a_sentence():
    rng = random.Random(0)
    sentences = [english_sentence(rng) for _ in range(2000)]
    used = {word for sentence in sentences for word in sentence.split()}
    assert len(english_vocabulary()) >= 600
    assert used <= english_vocabulary() and len(used) > 500
    assert 7.0 < np.mean([len(s.split()) for s in sentences]) < 9.5


def test_sentences_are_distinct_and_avoid_the_excluded_ones():
    rng = random.Random(1)
    test = english_sentences(200, rng)
    train = english_sentences(3000, rng, exclude=test)
    assert len(set(train)) == 3000 and len(set(test)) == 200
    assert not set(train) & set(test)


def test_asking_for_more_sentences_than_the_grammar_allows_fails_clearly(monkeypatch):
    import local.sentence_grammar as grammar

    # One choice per slot leaves one sentence per template.
    monkeypatch.setattr(grammar, "_CHOICES", {name: c[:1] for name, c in grammar._CHOICES.items()})
    with pytest.raises(RuntimeError, match="could not produce 50 distinct sentences"):
        grammar.english_sentences(50, random.Random(2))


def test_mandarin_sentences_are_space_separated_known_words():
    rng = random.Random(3)
    for _ in range(100):
        words = mandarin_sentence(rng).split(" ")
        assert 4 <= len(words) <= 8 and set(words) <= set(MANDARIN_WORDS)
