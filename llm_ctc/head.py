"""Logits of the frozen LLM head for a few rows, in float32 (the paper times LLM-CTC
with an FP32 head over BF16 weights, App. D.3).

The head is converted to float32 one block of rows at a time: a bf16 head of 151,936 x
4,096 would otherwise be copied whole (2.5 GB) for every decoding step.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor


def head_logits(states: Tensor, weight: Tensor, bias: Optional[Tensor], rows_per_block: int = 4096) -> Tensor:
    """states (..., D), weight (V, D), bias (V,) or None -> float32 logits (..., V)."""
    vocab = weight.shape[0]
    inputs = states.float()
    logits = inputs.new_empty(*states.shape[:-1], vocab)
    for start in range(0, vocab, rows_per_block):
        stop = min(start + rows_per_block, vocab)
        block = inputs @ weight[start:stop].float().t()
        if bias is not None:
            block = block + bias[start:stop].float()
        logits[..., start:stop] = block
    return logits
