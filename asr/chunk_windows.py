"""The chunk schedule of bounded-history streaming encoders (paper Sec. 4.3, App. D.4),
shared by every family that streams.

An utterance's features (100 frames per second) are cut into chunks of ``chunk_seconds``;
for chunk b the encoder reads one window: the h seconds of features before the chunk
(fewer at the start) and the chunk itself, never later audio, and only the chunk's
outputs are kept. A lookahead of L frames (not in the paper, default 0; :mod:`asr.lookahead`)
also gives the window the first L frames of the next chunk, as right context of the
chunk's last frames: the chunk's output then waits for L more frames of audio. Training draws one h per update (App. D.4: ``max_history`` seconds
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


def chunk_windows(features: Tensor, chunk_seconds: int, history_seconds: int,
                  lookahead_frames: int = 0) -> List[Tuple[Tensor, Tensor, Tensor]]:
    """(history, chunk, lookahead features) per chunk of one utterance's (T, F) features:
    the history is the ``history_seconds`` before the chunk's start (fewer at the start),
    the lookahead the ``lookahead_frames`` after its end (fewer or none at the end)."""
    if history_seconds < 0:
        raise ValueError(f"history_seconds must be >= 0, got {history_seconds}")
    full, keep = chunk_seconds * FRAMES_PER_SECOND, history_seconds * FRAMES_PER_SECOND
    if not 0 <= lookahead_frames <= full:
        raise ValueError(f"lookahead_frames must be between 0 and the {full} frames of a chunk, got {lookahead_frames}")
    windows = []
    for b, frames in enumerate(feature_chunk_frames(features.shape[0], chunk_seconds)):
        start = b * full
        end = start + frames
        windows.append((features[max(0, start - keep):start], features[start:end],
                        features[end:end + lookahead_frames]))
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


def length_groups(lengths: Sequence[int], min_fill: float = 0.75) -> List[List[int]]:
    """Indices of ``lengths`` in groups to be padded and run together, longest first: a
    window joins the current group while it is at least ``min_fill`` of the group's
    longest, so padding is at most 1 - min_fill of any group. The windows of one batch
    range from one chunk to h seconds plus a chunk (2-10 s at h = 8 s), and padding them
    all to the longest would run the encoder on up to twice the audio."""
    if not 0 < min_fill <= 1:
        raise ValueError(f"min_fill must be in (0, 1], got {min_fill}")
    order = sorted(range(len(lengths)), key=lambda m: -lengths[m])
    groups: List[List[int]] = []
    for m in order:
        if groups and lengths[m] >= min_fill * lengths[groups[-1][0]]:
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def encode_windows(encoder, windows: Sequence[Tensor], device=None) -> List[Tensor]:
    """Each (L_m, F) window's encoder output (L'_m, D), the windows run as independent
    sequences in :func:`length_groups` (one padded batch per group); ``encoder`` maps
    (batch (M, L, F), lengths (M,)) to (output (M, L', D), output lengths (M,))."""
    outputs: List[Tensor] = [None] * len(windows)  # type: ignore[list-item]
    for group in length_groups([window.shape[0] for window in windows]):
        batch, lens = padded_batch([windows[m] for m in group])
        if device is not None:
            batch, lens = batch.to(device), lens.to(device)
        encoded, encoded_lens = encoder(batch, lens)
        for row, m in enumerate(group):
            outputs[m] = encoded[row, :int(encoded_lens[row])]
    return outputs


def padded_batch(sequences: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """(M, L max, F) zero-padded batch of (L_m, F) sequences and their lengths (M,)."""
    lens = torch.tensor([sequence.shape[0] for sequence in sequences])
    batch = sequences[0].new_zeros(len(sequences), int(lens.max()), sequences[0].shape[1])
    for m, sequence in enumerate(sequences):
        batch[m, :sequence.shape[0]] = sequence
    return batch, lens
