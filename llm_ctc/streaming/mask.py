"""The streaming attention mask V_n(i) of App. E ("Streaming attention"), as the 4-D
additive float mask the LLM takes: 0 where key k is visible to position i, the dtype's
most negative finite value elsewhere. (Not boolean: transformers' eager attention adds
the mask to the scores, so a boolean mask would be silently wrong there.)

Position i of chunk b sees: the prompt; the speech and query positions k of earlier
chunks with a_b - h <= tau(k) < a_b (the cutoff is fixed at the chunk start for all of
its positions); positions k <= i of its own chunk. A prompt position sees the prompt up
to itself. Batch padding is never visible; a padding row sees position 0 only (its
output is ignored, and a row with no visible key is avoided).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from llm_ctc.streaming.layout import TICKS_PER_SECOND, UtteranceLayout


def visibility(chunk: Tensor, tau: Tensor, chunk_start: Tensor, history_seconds: int) -> Tensor:
    """(L, L) boolean: row i (query) sees column k (key), from per-position chunk ids
    (-1 for the prompt), tau (ticks; any value at the prompt) and the start a of each
    position's chunk."""
    query_chunk, key_chunk = chunk[:, None], chunk[None, :]
    index = torch.arange(chunk.shape[0], device=chunk.device)
    causal_in_chunk = (query_chunk == key_chunk) & (index[None, :] <= index[:, None])
    prompt_key = (key_chunk < 0) & (query_chunk >= 0)
    start = chunk_start[:, None]
    history = (key_chunk >= 0) & (key_chunk < query_chunk) & \
        (tau[None, :] >= start - TICKS_PER_SECOND * history_seconds) & (tau[None, :] < start)
    return causal_in_chunk | prompt_key | history


def layout_tensors(layout: UtteranceLayout, device=None):
    """(chunk ids, tau, chunk start) per position as long tensors (prompt: -1, 0, 0)."""
    chunk = torch.tensor(layout.chunk, dtype=torch.long, device=device)
    tau = torch.tensor([0 if t is None else t for t in layout.tau], dtype=torch.long, device=device)
    starts = torch.tensor([0] + layout.chunk_starts, dtype=torch.long, device=device)
    return chunk, tau, starts[chunk + 1]


def additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where visible, finfo(dtype).min elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def streaming_mask(layouts: Sequence[UtteranceLayout], history_seconds: int, dtype: torch.dtype,
                   width: int = None, device=None) -> Tensor:
    """(N, 1, L, L) additive mask of a right-padded batch (L = the longest sequence or
    ``width``)."""
    if history_seconds < 0:
        raise ValueError(f"history_seconds must be >= 0, got {history_seconds}")
    width = max(layout.length for layout in layouts) if width is None else width
    visible = torch.zeros(len(layouts), width, width, dtype=torch.bool, device=device)
    visible[:, :, 0] = True  # padding rows (overwritten below for real rows)
    for n, layout in enumerate(layouts):
        length = layout.length
        if length > width:
            raise ValueError(f"width {width} is shorter than utterance {n}'s {length} positions")
        chunk, tau, start = layout_tensors(layout, device)
        visible[n, :length, :length] = visibility(chunk, tau, start, history_seconds)
    return additive(visible, dtype)[:, None]
