"""The chunk schedule of bounded-history streaming encoders (paper Sec. 4.3, App. D.4),
shared by every family that streams.

An utterance's features (100 frames per second) are cut into chunks of ``chunk_seconds``;
for chunk b the encoder reads one window: the h seconds of features before the chunk
(fewer at the start) and the chunk itself, never later audio, and only the chunk's
outputs are kept. Training draws one h per update (App. D.4: ``max_history`` seconds
with probability 1/2, each shorter whole second equally often) as a function of a seed
and the update number, so a resumed run draws the same h for the same update.

Which encoder outputs belong to a chunk depends on the encoder's frame rate: the
Zipformer's in :mod:`zipformer.windows`, Qwen3-ASR's in ``llm_ctc.streaming.encoder``.
"""

from __future__ import annotations

import random
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from asr.constants import FRAMES_PER_SECOND


def feature_chunk_frames(num_frames: int, chunk_seconds: int = 2) -> List[int]:
    """F_b per nonempty chunk of ``num_frames`` feature frames at 100 per second."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if chunk_seconds < 1:
        raise ValueError(f"chunk_seconds must be >= 1, got {chunk_seconds}")
    per_chunk = chunk_seconds * FRAMES_PER_SECOND
    return [min(per_chunk, num_frames - start) for start in range(0, num_frames, per_chunk)]


def chunk_windows(features: Tensor, chunk_seconds: int, history_seconds: int) -> List[Tuple[Tensor, Tensor]]:
    """(history features, chunk features) per chunk of one utterance's (T, F) features:
    the history is the ``history_seconds`` before the chunk's start (fewer at the start)."""
    if history_seconds < 0:
        raise ValueError(f"history_seconds must be >= 0, got {history_seconds}")
    full, keep = chunk_seconds * FRAMES_PER_SECOND, history_seconds * FRAMES_PER_SECOND
    windows = []
    for b, frames in enumerate(feature_chunk_frames(features.shape[0], chunk_seconds)):
        start = b * full
        windows.append((features[max(0, start - keep):start], features[start:start + frames]))
    return windows


def history_weights(max_history: int = 8) -> Tuple[float, ...]:
    """P(h) for h = 1 .. max_history (App. D.4 with max_history = 8: 8 s with probability
    1/2, each of 1-7 s with 1/14): the longest history half the time, the rest uniform."""
    if max_history < 1:
        raise ValueError(f"max_history must be >= 1, got {max_history}")
    if max_history == 1:
        return (1.0,)
    return (1 / (2 * (max_history - 1)),) * (max_history - 1) + (1 / 2,)


def sample_history(generator: torch.Generator, max_history: int = 8) -> int:
    """h in seconds for one microbatch (App. D.4): ``max_history`` (8) with probability
    1/2, each of 1 .. max_history - 1 equally often."""
    weights = torch.tensor(history_weights(max_history), dtype=torch.float64)
    return int(torch.multinomial(weights, 1, generator=generator)) + 1


def history_for_step(seed: int, step: int, max_history: int = 8) -> int:
    """The history of training step ``step``, a function of (seed, step) only: a resumed
    run draws the same h for the same step whatever else consumed random numbers."""
    if not 0 <= step < 2 ** 32 or seed < 0:
        raise ValueError(f"step must be in [0, 2**32) and seed >= 0, got step {step} and seed {seed}")
    # Python's generator takes every bit of the seed (torch's CPU generator keeps 32).
    rng = random.Random((seed << 32) + step)
    return rng.choices(range(1, max_history + 1), weights=history_weights(max_history))[0]


def padded_batch(sequences: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """(M, L max, F) zero-padded batch of (L_m, F) sequences and their lengths (M,)."""
    lens = torch.tensor([sequence.shape[0] for sequence in sequences])
    batch = sequences[0].new_zeros(len(sequences), int(lens.max()), sequences[0].shape[1])
    for m, sequence in enumerate(sequences):
        batch[m, :sequence.shape[0]] = sequence
    return batch, lens
