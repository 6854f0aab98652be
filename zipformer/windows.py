"""The Zipformer on chunk windows (paper Sec. 4.3, App. D.4): for each chunk the encoder
reads the h seconds before it and the chunk (:mod:`asr.chunk_windows`; with a lookahead
of L frames also the first L frames of the next chunk) as an independent sequence, and
keeps only the chunk's output frames.

The Zipformer gives 25 frames per second, T' = ((T - 7) // 2 + 1) // 2: encoder frame i
stands for feature frames [4i, 4i + 4). For a window of H history frames (a multiple of
100: chunks start on whole seconds) and the chunk's F frames, the chunk's outputs are i in
[ceil(H / 4), ceil((H + F) / 4)), ceil(F / 4) of them (a lookahead comes after them and
moves nothing). The window is extended by copies of its last frame (not by later audio)
so that the subsampling's edge loss still leaves those frames; an utterance of T frames
so gives sum_b ceil(F_b / 4) frames.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from asr.chunk_windows import chunk_windows, encode_windows, feature_chunk_frames

FRAMES_PER_OUTPUT = 4
RIGHT_PADDING = 10  # ((T + 10 - 7) // 2 + 1) // 2 >= ceil(T / 4) for every T >= 1


def chunk_output_range(history_frames: int, chunk_frames: int) -> Tuple[int, int]:
    """(first encoder frame of the chunk in its window, number of them)."""
    first = -(-history_frames // FRAMES_PER_OUTPUT)
    return first, -(-(history_frames + chunk_frames) // FRAMES_PER_OUTPUT) - first


def window_input(history: Tensor, chunk: Tensor, lookahead: Optional[Tensor] = None) -> Tuple[Tensor, int]:
    """(encoder input, history frames) of one chunk from its history's, its own and its
    lookahead's features."""
    window = torch.cat([history, chunk] + ([] if lookahead is None else [lookahead]))
    return torch.cat([window, window[-1:].expand(RIGHT_PADDING, -1)]), history.shape[0]


def windowed_output_lengths(num_frames, chunk_seconds: int):
    """Encoder frames of utterances of ``num_frames`` feature frames run as chunk windows
    (an int or a tensor): sum_b ceil(F_b / 4)."""
    if isinstance(num_frames, Tensor):
        return torch.tensor([windowed_output_lengths(int(n), chunk_seconds) for n in num_frames.reshape(-1)],
                            dtype=torch.long, device=num_frames.device).reshape(num_frames.shape)
    if num_frames < 1:
        return 0
    return sum(-(-frames // FRAMES_PER_OUTPUT) for frames in feature_chunk_frames(int(num_frames), chunk_seconds))


def windowed_encode(encoder, features: Tensor, feature_lens: Tensor, history_seconds: int,
                    chunk_seconds: int, lookahead_frames: int = 0) -> Tuple[Tensor, Tensor]:
    """The encoder's output (N, T' max, D) of a padded batch run chunk window by chunk
    window (the windows of all utterances batched by length, :func:`encode_windows`), each
    utterance's chunks' frames in chunk order, and T' (N,)."""
    windows: List[Tuple[Tensor, int]] = []
    chunk_frames: List[int] = []
    counts: List[int] = []
    for n in range(features.shape[0]):
        pieces = chunk_windows(features[n, :int(feature_lens[n])], chunk_seconds, history_seconds, lookahead_frames)
        windows += [window_input(history, chunk, lookahead) for history, chunk, lookahead in pieces]
        chunk_frames += [chunk.shape[0] for _, chunk, _ in pieces]
        counts.append(len(pieces))
    encoded = encode_windows(encoder, [window for window, _ in windows], features.device)
    parts = chunk_parts(encoded, [history for _, history in windows], chunk_frames)
    utterances, out_lens, index = [], [], 0
    for count in counts:
        utterances.append(torch.cat(parts[index:index + count]))
        index += count
        out_lens.append(utterances[-1].shape[0])
    out = parts[0].new_zeros(features.shape[0], max(out_lens), parts[0].shape[-1])
    for n, frames in enumerate(utterances):
        out[n, :frames.shape[0]] = frames
    return out, torch.tensor(out_lens, dtype=torch.long, device=features.device)


def chunk_parts(encoded: Sequence[Tensor], history_frames: Sequence[int],
                chunk_frames: Sequence[int]) -> List[Tensor]:
    """Each window's chunk frames (ceil(F / 4), D) out of the encoded windows (L'_m, D)."""
    parts = []
    for m, (history, frames) in enumerate(zip(history_frames, chunk_frames)):
        first, count = chunk_output_range(history, frames)
        if first + count > encoded[m].shape[0]:
            raise RuntimeError(f"chunk window {m} gave {encoded[m].shape[0]} encoder frames, "
                               f"fewer than the {first + count} its chunk needs")
        parts.append(encoded[m][first:first + count])
    return parts
