"""asr.alignment against brute-force enumeration of every frame labelling."""

import itertools

import pytest
import torch

from asr.alignment import ctc_forced_alignment, token_frames


def collapse(path, blank):
    out, previous = [], blank
    for label in path:
        if label != blank and label != previous:
            out.append(label)
        previous = label
    return out


def best_by_enumeration(log_probs, tokens, blank):
    num_frames, vocab = log_probs.shape
    best = float("-inf")
    for path in itertools.product(range(vocab), repeat=num_frames):
        if collapse(path, blank) == list(tokens):
            best = max(best, sum(float(log_probs[t, label]) for t, label in enumerate(path)))
    return best


@pytest.mark.parametrize("tokens, blank", [([1, 2], 0), ([1, 1], 0), ([2, 1, 2], 0), ([1], 0), ([0, 1], 2), ([], 0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_path_is_the_best_of_all_labellings_that_collapse_to_the_tokens(tokens, blank, seed):
    generator = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(6, 3, generator=generator, dtype=torch.float64).log_softmax(-1)
    path = ctc_forced_alignment(log_probs, tokens, blank)
    assert len(path) == 6
    assert collapse(path, blank) == tokens
    score = sum(float(log_probs[t, label]) for t, label in enumerate(path))
    assert score == pytest.approx(best_by_enumeration(log_probs, tokens, blank), abs=1e-12)


def test_a_path_that_must_use_every_frame():
    log_probs = torch.randn(3, 3, dtype=torch.float64).log_softmax(-1)
    assert ctc_forced_alignment(log_probs, [1, 1]) == [1, 0, 1]


def test_token_frames_splits_runs_and_repeats():
    assert token_frames([0, 3, 3, 0, 3, 5, 5, 0, 0]) == [(1, 2), (4, 4), (5, 6)]
    assert token_frames([]) == []
    assert token_frames([2, 2, 1], blank_id=2) == [(2, 2)]


def test_bad_inputs_are_named():
    log_probs = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="need at least 3 frames"):
        ctc_forced_alignment(log_probs, [1, 1])
    with pytest.raises(ValueError, match="not the blank 0"):
        ctc_forced_alignment(log_probs, [0])
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        ctc_forced_alignment(log_probs, [7])
    with pytest.raises(ValueError, match=r"\(T, V\)"):
        ctc_forced_alignment(torch.zeros(4), [1])
    impossible = torch.full((2, 3), float("-inf"))
    impossible[:, 0] = 0.0
    with pytest.raises(ValueError, match="finite score"):
        ctc_forced_alignment(impossible, [1])
