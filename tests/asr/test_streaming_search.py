"""Streaming CTC search over chunks against the offline search of asr.search over the
concatenated log-probabilities (which is itself checked against brute force in
test_search.py)."""

import pytest
import torch

from asr.search import ctc_greedy_search, ctc_prefix_beam_search
from asr.streaming_search import StreamingGreedySearch, StreamingPrefixBeamSearch

CHUNKINGS = [[40], [1] * 40, [13, 13, 13, 1], [7, 0, 20, 13], [26, 14]]


def random_log_probs(seed, frames=40, vocab=7, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(frames, vocab, generator=generator, dtype=torch.float64)).log_softmax(-1)


def chunks_of(log_probs, sizes):
    assert sum(sizes) == log_probs.shape[0]
    return torch.split(log_probs, sizes)


@pytest.mark.parametrize("sizes", CHUNKINGS)
@pytest.mark.parametrize("token_penalty", [0.0, 0.7, -0.5])
def test_prefix_beam_over_chunks_equals_offline(sizes, token_penalty):
    for seed in range(6):
        log_probs = random_log_probs(seed, scale=1.0 + seed % 3)
        offline = ctc_prefix_beam_search(log_probs[None], torch.tensor([40]), beam=4, blank_id=2,
                                         token_penalty=token_penalty, return_nbest=True)[0]
        search = StreamingPrefixBeamSearch(beam=4, blank_id=2, token_penalty=token_penalty)
        for chunk in chunks_of(log_probs, sizes):
            search.advance(chunk)
        streamed = search.nbest()
        assert [h.tokens for h in streamed] == [h.tokens for h in offline]
        for mine, reference in zip(streamed, offline):
            assert mine.log_prob == pytest.approx(reference.log_prob, abs=1e-9)
            assert mine.score == pytest.approx(reference.score, abs=1e-9)


def test_prefix_beam_hypothesis_after_each_chunk_is_offline_on_the_prefix_frames():
    log_probs = random_log_probs(11, frames=30, vocab=50)
    search = StreamingPrefixBeamSearch(beam=3, blank_id=0, token_penalty=0.3)
    seen = 0
    for chunk in chunks_of(log_probs, [8, 8, 8, 6]):
        search.advance(chunk)
        seen += chunk.shape[0]
        offline = ctc_prefix_beam_search(log_probs[None, :seen], torch.tensor([seen]), beam=3,
                                         blank_id=0, token_penalty=0.3)[0]
        assert search.best() == offline


def test_prefix_beam_reset_starts_a_new_utterance():
    first, second = random_log_probs(1), random_log_probs(2)
    search = StreamingPrefixBeamSearch(beam=4, blank_id=0)
    search.advance(first)
    search.reset()
    search.advance(second)
    assert search.best() == ctc_prefix_beam_search(second[None], torch.tensor([40]), beam=4)[0]


@pytest.mark.parametrize("sizes", CHUNKINGS)
@pytest.mark.parametrize("fed", ["log_probs", "labels"])
def test_greedy_over_chunks_equals_offline(sizes, fed):
    # "labels": advance_labels takes each frame's best label (the argmax of logits, no log-softmax).
    for seed in range(6):
        # Few classes: repeats across chunk boundaries are frequent.
        log_probs = random_log_probs(seed, vocab=3, scale=0.5)
        offline = ctc_greedy_search(log_probs[None], torch.tensor([40]), blank_id=1)[0]
        search = StreamingGreedySearch(blank_id=1)
        emitted = []
        for chunk in chunks_of(log_probs, sizes):
            if fed == "labels":
                emitted += search.advance_labels(chunk.argmax(dim=1).tolist())
            else:
                emitted += search.advance(chunk)
        assert search.best() == offline == emitted


def test_greedy_collapses_a_repeat_across_the_boundary_only_without_blank():
    search = StreamingGreedySearch(blank_id=0)
    one_hot = lambda labels: torch.nn.functional.one_hot(torch.tensor(labels), 3).double()  # noqa: E731
    search.advance(one_hot([1, 1]))
    search.advance(one_hot([1, 0]))
    search.advance(one_hot([1]))
    assert search.best() == [1, 1]
    search.reset()
    search.advance(one_hot([1]))
    assert search.best() == [1]


def test_bad_chunk_is_refused_with_its_shape():
    with pytest.raises(ValueError, match="log_probs must be a floating \\(T, V\\)"):
        StreamingPrefixBeamSearch().advance(torch.zeros(1, 4, 5))
