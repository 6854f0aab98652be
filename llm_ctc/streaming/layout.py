"""Chunk layout and time coordinates of streaming Query-readout LLM-CTC (Sec. 4.3,
Fig. 2, eq. 11; App. E "Streaming time coordinates").

Utterance n is cut into chunks of ``chunk_seconds`` (2 s in App. D.4); chunk b starts at
a_b = chunk_seconds * b (b from 0 here) and its F_b feature frames (100 per second) give
T_b speech embeddings. The LLM input is [P, E_1, Q_1, E_2, Q_2, ...]; speech position j
of chunk b and its query position share the time coordinate tau.

Times are integer ticks of 10 ms (one feature hop), so every comparison of the mask and
of cache eviction is exact: tau in ticks, a_b = 100 * chunk_seconds * b, the history h
as 100 h ticks and 0.01 F_b seconds as F_b ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from asr.constants import FRAMES_PER_SECOND, SAMPLE_RATE

TICKS_PER_SECOND = FRAMES_PER_SECOND  # one tick per 10 ms feature hop
WINDOW_SAMPLES, HOP_SAMPLES = 400, 160


class TimeGrid:
    """How a chunk's F feature frames become speech embeddings, and their times."""

    def count(self, frames: int) -> int:
        raise NotImplementedError

    def offsets(self, count: int) -> List[int]:
        """Ticks of embedding j = 0 .. count-1 after the chunk start."""
        raise NotImplementedError


class Qwen3ASRGrid(TimeGrid):
    """Qwen3-ASR frontend (App. E): windows of 100 mel frames give 13 embeddings each, a
    partial window ceil(r / 8); embedding j sits at floor(j/13) s + 0.08 (j mod 13) s."""

    def count(self, frames: int) -> int:
        return 13 * (frames // 100) + -(-(frames % 100) // 8)

    def offsets(self, count: int) -> List[int]:
        return [TICKS_PER_SECOND * (j // 13) + 8 * (j % 13) for j in range(count)]


@dataclass(frozen=True)
class FrameRateGrid(TimeGrid):
    """The same rule from a constant rate: ``frames_per_embedding`` feature frames per
    embedding (the Zipformer: T' = ((T - 7) // 2 + 1) // 2, 4 feature frames per encoder
    frame, times the projector's stack), T_b = ceil(F_b / frames_per_embedding),
    embedding j at j * frames_per_embedding ticks. A final 10 ms chunk gives one."""

    frames_per_embedding: int

    def count(self, frames: int) -> int:
        return -(-frames // self.frames_per_embedding)

    def offsets(self, count: int) -> List[int]:
        return [j * self.frames_per_embedding for j in range(count)]


def qwen3_asr_chunk_frames(num_samples: int, chunk_seconds: int = 2) -> List[int]:
    """F_b per nonempty chunk of a 16 kHz waveform: ceil(max(s_b, 400) / 160) (App. E)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    per_chunk = chunk_seconds * SAMPLE_RATE
    sizes = [min(per_chunk, num_samples - start) for start in range(0, num_samples, per_chunk)]
    return [-(-max(size, WINDOW_SAMPLES) // HOP_SAMPLES) for size in sizes]


@dataclass
class UtteranceLayout:
    """One utterance's streaming LLM sequence (positions 0-based, prompt first).

    chunk_frames / chunk_lens / chunk_starts: F_b, T_b, a_b (ticks) per chunk.
    chunk[k]: chunk of position k (-1 for the prompt); tau[k]: its time in ticks (None
    for the prompt); speech_index[k]: the row of the concatenated speech embeddings at a
    speech position, -1 elsewhere; query_positions: the CTC readout positions in chunk
    order (eq. 11).
    """

    prompt_len: int
    chunk_frames: List[int]
    chunk_lens: List[int]
    chunk_starts: List[int]
    chunk: List[int]
    tau: List[int]
    is_query: List[bool]
    speech_index: List[int]
    query_positions: List[int]

    @property
    def length(self) -> int:
        return len(self.chunk)

    @property
    def num_frames(self) -> int:
        return sum(self.chunk_lens)

    def chunk_offset(self, b: int) -> int:
        """o_b: the first position of chunk b (P + 2 sum_{c<b} T_c)."""
        return self.prompt_len + 2 * sum(self.chunk_lens[:b])


def utterance_layout(prompt_len: int, chunk_frames: Sequence[int], grid: TimeGrid,
                     chunk_seconds: int = 2) -> UtteranceLayout:
    """The layout of one utterance with F_b = ``chunk_frames`` (every chunk but the last
    full: ``chunk_seconds`` * 100 frames)."""
    full = chunk_seconds * TICKS_PER_SECOND
    if not chunk_frames or any(not 1 <= f <= full for f in chunk_frames) or \
            any(f != full for f in list(chunk_frames)[:-1]):
        raise ValueError(f"chunk_frames must be full chunks of {full} frames and a last one of 1..{full}, "
                         f"got {list(chunk_frames)}")
    chunk, tau, is_query, speech_index = [-1] * prompt_len, [None] * prompt_len, [False] * prompt_len, \
        [-1] * prompt_len
    lens, starts, queries, row = [], [], [], 0
    for b, frames in enumerate(chunk_frames):
        count, start = grid.count(frames), b * full
        times = [start + offset for offset in grid.offsets(count)]
        lens.append(count)
        starts.append(start)
        for query in (False, True):
            if query:
                queries.extend(range(len(chunk), len(chunk) + count))
            chunk += [b] * count
            tau += times
            is_query += [query] * count
            speech_index += [-1] * count if query else list(range(row, row + count))
        row += count
    return UtteranceLayout(prompt_len, list(chunk_frames), lens, starts, chunk, tau, is_query, speech_index,
                           queries)


def evictable(tau: int, chunk_start: int, chunk_frames: int, history_seconds: int) -> bool:
    """After chunk b, a non-prompt cache entry is dropped when tau < a_b + 0.01 F_b - h
    (App. E): for a full chunk exactly the entries the next chunk cannot see."""
    return tau < chunk_start + chunk_frames - TICKS_PER_SECOND * history_seconds


def streaming_frame_count(grid: TimeGrid, frames, chunk_seconds: int = 2):
    """T_n = sum_b T_b of ``frames`` feature frames cut into chunks (an int or a long
    tensor of them): the CTC frames of the concatenated query outputs (eq. 11)."""
    full = chunk_seconds * TICKS_PER_SECOND
    return (frames // full) * grid.count(full) + grid.count(frames % full)


def cache_bound(prompt_len: int, grid: TimeGrid, history_seconds: int, chunk_seconds: int = 2) -> int:
    """P + 2A + J (App. E): the most KV-cache positions of one utterance. A = T_b of a full
    chunk; J = the speech and query positions whose tau lies in the last h seconds before
    a full chunk's end, which eviction keeps (for the Qwen3-ASR grid, 2 s chunks and
    h = 8 s: A = 26, J = 208). A short last chunk adds fewer than 2A and its eviction
    cutoff only matters for chunks that do not come."""
    full = chunk_seconds * TICKS_PER_SECOND
    history = TICKS_PER_SECOND * history_seconds
    offsets = grid.offsets(grid.count(full))
    chunks = -(-history // full) + 1  # enough full chunks before the end to fill h
    end = chunks * full
    retained = sum(1 for c in range(chunks) for offset in offsets if c * full + offset >= end - history)
    return prompt_len + 2 * len(offsets) + 2 * retained
