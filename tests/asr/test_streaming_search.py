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


def merged_by_definition(tokens, places, seam_frames):
    """The seam merge as asr.streaming_search defines it, chunk pair by chunk pair: A the
    tokens of chunk b in its last S frames, B those of chunk b + 1 in its first S; the
    longest j with A[-j:] == B[:j] drops B[:j]."""
    chunks = max((c for c, _, _ in places), default=-1) + 1
    drop = set()
    for b in range(chunks - 1):
        a = [i for i, (c, f, n) in enumerate(places) if c == b and n - f <= seam_frames]
        following = [i for i, (c, f, n) in enumerate(places) if c == b + 1 and f < seam_frames]
        for j in range(min(len(a), len(following)), 0, -1):
            if [tokens[i] for i in a[-j:]] == [tokens[i] for i in following[:j]]:
                drop.update(following[:j])
                break
    return [t for i, t in enumerate(tokens) if i not in drop]


def path_log_probs(path, vocab=7, peak=12.0):
    """Log-probabilities whose every frame names its label of ``path`` by a wide margin."""
    logits = torch.zeros(len(path), vocab, dtype=torch.float64)
    logits[torch.arange(len(path)), torch.tensor(path)] = peak
    return logits.log_softmax(-1)


def greedy_places(path, sizes, blank):
    """Tokens of a frame path and where each was taken, by the collapse's definition."""
    tokens, places, previous, frame = [], [], None, 0
    for chunk, size in enumerate(sizes):
        for f in range(size):
            label = path[frame]
            if label != blank and label != previous:
                tokens.append(label)
                places.append((chunk, f, size))
            previous = label
            frame += 1
    return tokens, places


def test_seam_merge_on_hand_built_chunks():
    blank = 0
    cases = [  # (chunks of frame labels, S, tokens written)
        ([[0, 0, 0, 0, 0, 0, 0, 5, 0, 0], [0, 5, 5, 5, 5, 5, 5, 0, 6, 0]], 3, [5, 6]),   # the run past the window too
        ([[0, 0, 0, 0, 0, 0, 0, 3, 5, 0], [3, 5, 0, 0, 0, 0, 0, 0, 0, 0]], 3, [3, 5]),   # two tokens
        ([[0, 0, 0, 0, 0, 0, 0, 3, 5, 0], [5, 3, 0, 0, 0, 0, 0, 0, 0, 0]], 3, [3, 5, 3]),  # the overlap is [5]
        ([[0, 0, 0, 0, 0, 0, 5, 0, 0, 0], [0, 5, 0, 0, 0, 0, 0, 0, 0, 0]], 3, [5, 5]),   # 4 frames before the end
        ([[0, 0, 0, 0, 0, 0, 0, 0, 0, 5], [0, 0, 0, 5, 0, 0, 0, 0, 0, 0]], 3, [5, 5]),   # frame 3 of the next
        ([[0, 0, 0, 0, 0, 0, 0, 0, 5, 5], [5, 0, 0, 0, 0, 0, 0, 0, 0, 0]], 3, [5]),      # one run across: CTC's own
        ([[0, 0, 5, 0, 0, 5, 0, 0, 0, 0]], 3, [5, 5]),                                    # within a chunk: kept
    ]
    for chunks, seam_frames, expected in cases:
        search = StreamingGreedySearch(blank_id=blank, seam_frames=seam_frames)
        for labels in chunks:
            search.advance_labels(labels)
        assert search.best() == expected
        off = StreamingGreedySearch(blank_id=blank)
        for labels in chunks:
            off.advance_labels(labels)
        tokens, places = greedy_places([label for labels in chunks for label in labels], [len(c) for c in chunks],
                                       blank)
        assert off.best() == tokens and merged_by_definition(tokens, places, seam_frames) == expected


@pytest.mark.parametrize("seam_frames", [1, 3, 5])
def test_searches_with_seam_merge_write_each_seam_once(seam_frames):
    blank, sizes = 0, [10, 10, 10, 4]
    generator = torch.Generator().manual_seed(seam_frames)
    for trial in range(20):
        # Paths with a token held or repeated around the boundaries, as streaming writes them.
        path = torch.randint(0, 4, (sum(sizes),), generator=generator).tolist()
        for boundary in (10, 20, 30):
            if trial % 2:
                path[boundary - 2], path[boundary - 1], path[boundary], path[boundary + 1] = 5, blank, blank, 5
        log_probs = path_log_probs(path)
        tokens, places = greedy_places(path, sizes, blank)
        expected = merged_by_definition(tokens, places, seam_frames)
        greedy = StreamingGreedySearch(blank_id=blank, seam_frames=seam_frames)
        beam = StreamingPrefixBeamSearch(beam=4, blank_id=blank, seam_frames=seam_frames)
        for chunk in chunks_of(log_probs, sizes):
            greedy.advance(chunk)
            beam.advance(chunk)
        assert greedy.best() == expected
        assert beam.best() == expected  # the peaked path is the beam's best too
        if trial % 2:  # a token 2 frames before each boundary, again at frame 1 of the next chunk
            assert len(expected) < len(tokens) or seam_frames == 1


def test_seam_frames_are_checked():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seam_frames must be a whole number"):
            StreamingGreedySearch(seam_frames=bad)
        with pytest.raises(ValueError, match="seam_frames must be a whole number"):
            StreamingPrefixBeamSearch(seam_frames=bad)
    assert StreamingGreedySearch(seam_frames=0).seams is None


def test_beam_reads_the_merged_token_as_blank_up_to_the_next_token():
    """After the merged run, blank-argmax frames that still give the token much mass would
    let the beam write it again (three frames of 0.4: 0.78 against 0.22); they read it as
    blank too, up to the next token."""
    blank, w, x = 0, 5, 3

    def frame(probs):
        row = torch.full((7,), 1e-6, dtype=torch.float64)
        for label, p in probs.items():
            row[label] = p
        return (row / row.sum()).log()

    first = torch.stack([frame({blank: 1.0})] * 8 + [frame({w: 0.99, blank: 0.01}), frame({blank: 1.0})])
    second = torch.stack([frame({w: 0.9, blank: 0.1})] + [frame({blank: 0.6, w: 0.4})] * 3
                         + [frame({x: 0.9, blank: 0.1})] + [frame({blank: 1.0})] * 5)
    for seam_frames, expected in ((3, [w, x]), (0, [w, w, x])):
        beam = StreamingPrefixBeamSearch(beam=4, blank_id=blank, seam_frames=seam_frames)
        beam.advance(first)
        beam.advance(second)
        assert beam.best() == expected
