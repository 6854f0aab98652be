"""The CTC blank on a frozen LLM head (Sec. 4.2, App. D.2).

Blank is an output class unused by the tokenizer, so the text vocabulary is kept:
the first head row beyond the tokenizer (Qwen3: tokenizer size 151,669 of 151,936
rows). A head whose rows are all tokens (SmolLM2: 49,152 of 49,152) gets one appended
zero row. The learned blank offset eta starts at log c_bl, c_bl = the number of head
rows whose cosine to the blank row exceeds 0.999, the blank row included (App. D.2,
"Blank initialization").
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Tuple

import torch
from torch import Tensor


def choose_blank_row(num_head_rows: int, tokenizer_size: int, blank_id: Optional[int] = None) -> Tuple[int, bool]:
    """(blank row, whether a zero row must be appended to the head).

    With ``blank_id`` given it must be an unused row (>= ``tokenizer_size``) or the
    appended one (== ``num_head_rows``).
    """
    if tokenizer_size < 1 or num_head_rows < 1:
        raise ValueError(f"need a non-empty head and tokenizer, got {num_head_rows} head rows and "
                         f"tokenizer size {tokenizer_size}")
    if tokenizer_size > num_head_rows:
        raise ValueError(f"the tokenizer has {tokenizer_size} tokens but the LLM head only "
                         f"{num_head_rows} rows: tokenizer and LLM do not belong together")
    if blank_id is None:
        blank_id = tokenizer_size
    if not tokenizer_size <= blank_id <= num_head_rows:
        raise ValueError(f"model.blank_id {blank_id} must be a head row unused by the tokenizer "
                         f"(in [{tokenizer_size}, {num_head_rows}], {num_head_rows} meaning an "
                         "appended zero row)")
    return blank_id, blank_id == num_head_rows


def count_similar_rows(weight: Tensor, row: int, threshold: float = 0.999,
                       rows_per_chunk: int = 16384) -> int:
    """c_bl: rows v with cos(W_v, W_row) > threshold, ``row`` itself counted once.

    Cosines in float64, ``rows_per_chunk`` rows at a time (no V x D float64 copy).
    A zero row has no direction: only itself is counted.
    """
    reference = weight[row].to(torch.float64)
    reference_norm = reference.norm()
    if reference_norm == 0:
        return 1
    count = 0
    for start in range(0, weight.shape[0], rows_per_chunk):
        block = weight[start:start + rows_per_chunk].to(torch.float64)
        norms = block.norm(dim=1)
        cosine = (block @ reference) / (norms * reference_norm).clamp(min=torch.finfo(torch.float64).tiny)
        similar = cosine > threshold
        if start <= row < start + block.shape[0]:
            similar[row - start] = True  # the blank row itself, whatever rounding says
        count += int(similar.sum())
    return count


def initial_blank_offset(weight: Tensor, blank_row: int, threshold: float = 0.999) -> float:
    """eta_0 = log c_bl (App. D.2)."""
    return math.log(count_similar_rows(weight, blank_row, threshold))


def head_with_blank(weight: Tensor, bias: Optional[Tensor], tokenizer_size: int,
                    blank_id: Optional[int] = None) -> Tuple[Tensor, Tensor, int]:
    """(frozen weight, pretrained bias (zeros when the head has none), blank row).

    The weight is the LLM's own tensor (shared, not copied) unless a zero row has to be
    appended; the result never requires grad.
    """
    blank, append = choose_blank_row(weight.shape[0], tokenizer_size, blank_id)
    weight = weight.detach()
    if bias is None:
        bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    bias = bias.detach()
    if append:
        logging.info("the tokenizer uses all %d rows of the LLM head: blank is an appended zero row %d "
                     "(the head is copied once with one more row)", weight.shape[0], blank)
        weight = torch.cat([weight, weight.new_zeros(1, weight.shape[1])])
        bias = torch.cat([bias, bias.new_zeros(1)])
    else:
        logging.info("blank is head row %d, the first beyond the tokenizer's %d tokens (%d rows)",
                     blank, tokenizer_size, weight.shape[0])
    return weight, bias, blank
