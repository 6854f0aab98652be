"""benchmarks.support.batch_windows, the batches of the chunk_windows and swoosh programs:
a batch's windows are, for each 2 s chunk of utterances that fill at most max_duration
seconds, the h seconds of history, the chunk and ten copies of its last frame."""

import random

import torch

from benchmarks.support import batch_windows


def expected_lengths(kind: str, max_duration: float, history: int, seed: int):
    """Window lengths from the definition, for the utterance durations the same draws give."""
    generator, low_high = random.Random(seed), (2.0, 4.0) if kind == "sentences" else (8.0, 10.0)
    lengths, total = [], 0.0
    while True:
        seconds = generator.uniform(*low_high)
        if total + seconds > max_duration:
            return lengths, total
        total += seconds
        frames = int(seconds * 100)
        for start in range(0, frames, 200):
            lengths.append(min(start, 100 * history) + min(200, frames - start) + 10)


def test_windows_follow_the_chunk_schedule_within_the_batch_duration():
    for kind, history in (("sentences", 2), ("sentences", 8), ("joined", 1), ("joined", 8)):
        torch.manual_seed(0)
        windows = batch_windows(kind, 40.0, history, random.Random(5))
        lengths, total = expected_lengths(kind, 40.0, history, 5)
        assert [window.shape[0] for window in windows] == lengths
        assert 0 < total <= 40.0
        for window in windows:
            assert torch.equal(window[-10:], window[-11:-10].expand(10, -1))
