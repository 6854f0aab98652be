"""Streaming layout and mask against App. E's definitions, computed position by
position in seconds (1-based positions as the paper numbers them)."""

import math

import pytest
import torch

from llm_ctc.streaming.layout import (FrameRateGrid, Qwen3ASRGrid, evictable, qwen3_asr_chunk_frames,
                                      utterance_layout)
from llm_ctc.streaming.mask import streaming_mask


def paper_positions(prompt_len, frames, seconds_per_chunk=2):
    """{1-based position: (chunk b (1-based), tau in seconds)} for the Qwen3-ASR frontend."""
    table, offset = {}, prompt_len
    for b, f in enumerate(frames, start=1):
        count = 13 * math.floor(f / 100) + math.ceil((f % 100) / 8)
        a = seconds_per_chunk * (b - 1)
        for j in range(1, count + 1):
            tau = a + math.floor((j - 1) / 13) + 0.08 * ((j - 1) % 13)
            table[offset + j] = (b, tau)
            table[offset + count + j] = (b, tau)
        offset += 2 * count
    return table


def paper_visible(prompt_len, frames, h):
    """V(i) for every position i from the definition."""
    table = paper_positions(prompt_len, frames)
    length = prompt_len + len(table)
    visible = torch.zeros(length, length, dtype=torch.bool)
    for i in range(1, length + 1):
        if i <= prompt_len:
            keys = set(range(1, i + 1))
        else:
            b = table[i][0]
            a_b = 2 * (b - 1)
            keys = set(range(1, prompt_len + 1))
            keys |= {k for k, (c, tau) in table.items() if c < b and a_b - h <= tau < a_b}
            keys |= {k for k, (c, _) in table.items() if c == b and k <= i}
        for k in keys:
            visible[i - 1, k - 1] = True
    return visible


LAYOUTS = [([200, 200, 37], 1), ([200, 200, 200, 3], 1), ([200, 200, 200, 150], 3),
           ([200] * 5, 8), ([200, 200, 200, 120], 2), ([64], 4)]


@pytest.mark.parametrize("frames, h", LAYOUTS)
def test_mask_is_the_visible_set_of_app_e(frames, h):
    layout = utterance_layout(5, frames, Qwen3ASRGrid())
    mask = streaming_mask([layout], h, torch.float32)
    expected = paper_visible(5, frames, h)
    assert mask.shape == (1, 1, layout.length, layout.length)
    assert torch.equal(mask[0, 0] == 0, expected)
    assert torch.all((mask == 0) | (mask == torch.finfo(torch.float32).min))


def test_batched_mask_excludes_padding():
    short, long = utterance_layout(3, [200, 90], Qwen3ASRGrid()), utterance_layout(3, [200, 200, 50], Qwen3ASRGrid())
    mask = streaming_mask([short, long], 1, torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and mask.shape == (2, 1, long.length, long.length)
    length = short.length
    assert torch.equal(mask[0, 0, :length, :length] == 0, paper_visible(3, [200, 90], 1))
    assert torch.all(mask[0, 0, :, length:] != 0)  # padding keys never visible
    assert torch.equal(mask[1, 0] == 0, paper_visible(3, [200, 200, 50], 1))


def test_layout_positions_and_query_rows_follow_eq_11():
    layout = utterance_layout(4, [200, 200, 3], Qwen3ASRGrid())
    assert layout.chunk_lens == [26, 26, 1]
    assert layout.length == 4 + 2 * 53
    table = paper_positions(4, [200, 200, 3])
    # Query rows: o_b + T_b + j in chunk order (0-based here).
    expected_queries = []
    offset = 4
    for count in (26, 26, 1):
        expected_queries += [offset + count + j for j in range(count)]
        offset += 2 * count
    assert layout.query_positions == expected_queries
    for k in range(4, layout.length):
        assert layout.tau[k] / 100 == pytest.approx(table[k + 1][1], abs=1e-9)
        assert layout.chunk[k] == table[k + 1][0] - 1
    # Speech rows are the concatenated embeddings in order.
    assert [r for r in layout.speech_index if r >= 0] == list(range(53))


def test_qwen3_asr_frames_of_a_waveform():
    # Two full chunks and a final 10 ms (160 samples): 3 mel frames after padding, one frame.
    assert qwen3_asr_chunk_frames(2 * 32000 + 160) == [200, 200, 3]
    assert Qwen3ASRGrid().count(3) == 1
    assert qwen3_asr_chunk_frames(32000 + 1000) == [200, 7]
    assert [Qwen3ASRGrid().count(f) for f in (200, 100, 99, 8, 9)] == [26, 13, 13, 1, 2]


def test_frame_rate_grid_for_the_zipformer():
    grid = FrameRateGrid(frames_per_embedding=8)  # 25 frames/s, stack 2
    assert [grid.count(f) for f in (200, 1, 8, 9)] == [25, 1, 1, 2]
    assert grid.offsets(3) == [0, 8, 16]


def test_eviction_rule_keeps_the_next_chunks_history():
    layout = utterance_layout(2, [200, 200, 200], Qwen3ASRGrid())
    for h in (1, 2, 3):
        for b in range(2):
            kept = [k for k in range(2, layout.length) if layout.chunk[k] <= b and
                    not evictable(layout.tau[k], layout.chunk_starts[b], 200, h)]
            # Exactly the earlier positions chunk b + 1 sees (besides the prompt).
            visible = paper_visible(2, [200, 200, 200], h)
            first_next = layout.chunk_offset(b + 1)
            assert kept == [k for k in range(2, first_next) if visible[first_next, k]]


def test_bad_chunking_is_refused():
    with pytest.raises(ValueError, match="chunk_frames must be full chunks of 200"):
        utterance_layout(2, [100, 200], Qwen3ASRGrid())
