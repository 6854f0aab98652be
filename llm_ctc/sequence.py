"""LLM input built explicitly as blocks with known positions.

Utterance n's sequence is ``[prefix (P), speech (T_n), suffix (B), tail (U_n)]``:

* LLM-CTC (Sec. 4.2): prefix = the prompt, no suffix; tail = T_n copies of the query
  vector q (query readout) or nothing (speech readout).
* LLM-CE (Sec. 4.1): prefix / suffix = the chat template around the speech; tail = the
  transcript's token embeddings (teacher forcing).

Sequences are right-padded to the longest, with an attention mask (1 = real position)
and position ids 0, 1, ... per row, so every block's positions are known without
placeholder tokens. The whole input is one gather from a table of source rows, so
gradients reach the speech embeddings, q and the tail embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass
class SequenceBatch:
    inputs_embeds: Tensor  # (N, L, D)
    attention_mask: Tensor  # (N, L) long, 1 = real position
    position_ids: Tensor  # (N, L)
    speech_start: int  # P
    speech_lens: Tensor  # (N,) T_n
    tail_start: Tensor  # (N,) P + T_n + B
    tail_lens: Tensor  # (N,) U_n
    lengths: Tensor  # (N,) P + T_n + B + U_n


def _lengths_mask(lengths: Tensor, width: int) -> Tensor:
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def build_sequences(prefix: Tensor, speech: Tensor, speech_lens: Tensor, suffix: Optional[Tensor] = None,
                    query: Optional[Tensor] = None, tail_tokens: Optional[Tensor] = None,
                    tail_token_lens: Optional[Tensor] = None) -> SequenceBatch:
    """prefix (P, D); speech (N, T, D) with speech_lens (N,); suffix (B, D) or None.
    Tail: ``query`` (D,) repeated T_n times, or ``tail_tokens`` (N, U, D) with
    ``tail_token_lens``, or neither."""
    if query is not None and tail_tokens is not None:
        raise ValueError("give either query or tail_tokens, not both")
    batch, max_speech, dim = speech.shape
    device = speech.device
    dtype = speech.dtype
    if prefix.dim() != 2 or prefix.shape[1] != dim:
        raise ValueError(f"prefix must be (P, {dim}), got {tuple(prefix.shape)}")
    suffix = speech.new_zeros(0, dim) if suffix is None else suffix
    speech_lens = speech_lens.to(device=device, dtype=torch.long)
    if query is not None:
        tail_lens = speech_lens
    elif tail_tokens is not None:
        if tail_token_lens is None:
            raise ValueError("tail_tokens needs tail_token_lens")
        tail_lens = tail_token_lens.to(device=device, dtype=torch.long)
    else:
        tail_lens = torch.zeros_like(speech_lens)
    num_prefix, num_suffix = prefix.shape[0], suffix.shape[0]
    tail_start = num_prefix + speech_lens + num_suffix
    lengths = tail_start + tail_lens
    width = int(lengths.max())

    # Source rows: [prefix | suffix | query | zero | speech (N*T) | tail tokens (N*U)].
    query_row = num_prefix + num_suffix
    zero_row = query_row + 1
    speech_base = zero_row + 1
    tail_base = speech_base + batch * max_speech
    parts = [prefix.to(dtype), suffix.to(dtype),
             (query if query is not None else speech.new_zeros(dim)).to(dtype).reshape(1, dim),
             speech.new_zeros(1, dim), speech.reshape(batch * max_speech, dim)]
    if tail_tokens is not None:
        parts.append(tail_tokens.to(dtype).reshape(-1, dim))
    sources = torch.cat(parts)

    positions = torch.arange(width, device=device)[None, :].expand(batch, width)
    utterance = torch.arange(batch, device=device)[:, None]
    index = torch.full((batch, width), zero_row, dtype=torch.long, device=device)
    index = torch.where(positions < num_prefix, positions, index)
    in_speech = (positions >= num_prefix) & (positions < num_prefix + speech_lens[:, None])
    index = torch.where(in_speech, speech_base + utterance * max_speech + positions - num_prefix, index)
    suffix_offset = positions - (num_prefix + speech_lens[:, None])
    in_suffix = (suffix_offset >= 0) & (suffix_offset < num_suffix)
    index = torch.where(in_suffix, num_prefix + suffix_offset, index)
    tail_offset = positions - tail_start[:, None]
    in_tail = (tail_offset >= 0) & (tail_offset < tail_lens[:, None])
    if query is not None:
        index = torch.where(in_tail, torch.full_like(index, query_row), index)
    elif tail_tokens is not None:
        index = torch.where(in_tail, tail_base + utterance * tail_tokens.shape[1] + tail_offset, index)
    inputs_embeds = sources[index]
    return SequenceBatch(
        inputs_embeds=inputs_embeds,
        attention_mask=_lengths_mask(lengths, width).long(),
        position_ids=positions.contiguous(),
        speech_start=num_prefix,
        speech_lens=speech_lens,
        tail_start=tail_start,
        tail_lens=tail_lens,
        lengths=lengths,
    )


def read_rows(hidden: Tensor, starts: Tensor, counts: Tensor) -> Tensor:
    """(N, max(counts), D): hidden[n, starts[n] + t] for t < counts[n], zero beyond."""
    batch, width, dim = hidden.shape
    max_count = int(counts.max())
    offsets = torch.arange(max_count, device=hidden.device)[None, :]
    index = (starts.to(hidden.device)[:, None] + offsets).clamp(max=width - 1)
    rows = torch.gather(hidden, 1, index.unsqueeze(-1).expand(batch, max_count, dim))
    valid = offsets < counts.to(hidden.device)[:, None]
    return rows * valid.unsqueeze(-1).to(rows.dtype)
