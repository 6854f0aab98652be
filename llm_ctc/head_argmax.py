"""The best class of each row of ``states`` under the frozen LLM head's float32 logits
(``states @ weight.T + bias``, as :func:`llm_ctc.head.head_logits` computes them), without
the (rows, V) logits or their log-softmax: greedy search needs only the argmax, since the
log-softmax subtracts one normalizer per row (App. D.3 times framewise greedy decoding).

Two ways, with the same result:

* exact: float32 products one block of head rows at a time, keeping the running best.
* screened: a BF16 product over the whole head first (about 2.3x the float32 GEMM's
  throughput on a CPU with AVX512-BF16, and half the bytes per matrix-vector step), then
  the float32 products of only the blocks that can hold the float32 maximum. A block is
  kept for a row when its BF16 maximum is within ``margin`` of the row's BF16 maximum,
  where ``margin`` is twice a bound on |BF16 logit - float32 logit|:

      2^-8 |logit| (one rounding of the FP32-accumulated product to BF16)
      + eps_in ||x|| max_v ||w_v||  (eps_in = 2^-7 when x or W is not exactly BF16, else 0)
      + D 2^-23 ||x|| max_v ||w_v|| (the two float32 summation orders)

  so the float32 argmax v* (whose BF16 logit is at least the BF16 maximum minus the two
  errors) is always in a kept block, and the kept blocks' float32 products choose it,
  the first of equal maxima as ``torch.argmax``. The bound assumes BF16 matrix products
  accumulate in float32 and round once (oneDNN's and ATen's CPU kernels do).
"""

from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

_SCREENS: Dict[int, Tuple[weakref.ref, int, Tensor, float, bool]] = {}


def bfloat16_screen(weight: Tensor) -> Tuple[Tensor, float, bool]:
    """(BF16 copy of ``weight`` (the tensor itself when already BF16), max row norm, whether
    the copy is exact), made once per weight tensor and kept while the weight lives."""
    entry = _SCREENS.get(id(weight))
    if entry is not None and entry[0]() is weight and entry[1] == weight._version:
        return entry[2], entry[3], entry[4]
    with torch.no_grad():
        screen = weight if weight.dtype == torch.bfloat16 else weight.to(torch.bfloat16)
        max_norm, exact = 0.0, True
        for start in range(0, weight.shape[0], 8192):
            block = weight[start:start + 8192].float()
            max_norm = max(max_norm, float(block.norm(dim=1).max()))
            exact = exact and bool(torch.equal(screen[start:start + 8192].float(), block))
    for key in [k for k, value in _SCREENS.items() if value[0]() is None]:
        del _SCREENS[key]
    _SCREENS[id(weight)] = (weakref.ref(weight), weight._version, screen, max_norm, exact)
    return screen, max_norm, exact


def _exact_block_best(inputs: Tensor, weight: Tensor, bias: Optional[Tensor], start: int, stop: int):
    block = inputs @ weight[start:stop].float().t()
    if bias is not None:
        block = block + bias[start:stop].float()
    value, index = block.max(dim=-1)
    return value, index + start


def head_argmax(states: Tensor, weight: Tensor, bias: Optional[Tensor], rows_per_block: int = 4096,
                screen: bool = False) -> Tensor:
    """states (..., D), weight (V, D), bias (V,) or None -> int64 (...): the argmax over V
    of the float32 logits (the first of equal maxima). ``screen``: find it through a BF16
    product first (the same result, see the module's note)."""
    vocab = weight.shape[0]
    if vocab == 0:
        raise ValueError("weight has no rows: no class to choose")
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
    if states.shape[-1] != weight.shape[1]:
        raise ValueError(f"states have width {states.shape[-1]} but the head's rows {weight.shape[1]}")
    inputs = states.float().reshape(-1, weight.shape[1])
    if screen and inputs.shape[0] > 0:
        best = _screened_argmax(inputs, weight, bias, rows_per_block)
    else:
        best_value = best_index = None
        for start in range(0, vocab, rows_per_block):
            value, index = _exact_block_best(inputs, weight, bias, start, min(start + rows_per_block, vocab))
            if best_value is None:
                best_value, best_index = value, index
            else:
                better = value > best_value
                best_value = torch.where(better, value, best_value)
                best_index = torch.where(better, index, best_index)
        best = best_index
    return best.reshape(states.shape[:-1])


def _screened_argmax(inputs: Tensor, weight: Tensor, bias: Optional[Tensor], rows_per_block: int) -> Tensor:
    vocab, dim = weight.shape
    screen, max_norm, screen_exact = bfloat16_screen(weight)
    low = inputs.to(torch.bfloat16)
    bias32 = None if bias is None else bias.float()
    starts = list(range(0, vocab, rows_per_block))
    block_max = inputs.new_empty(inputs.shape[0], len(starts))
    magnitude = inputs.new_zeros(inputs.shape[0])
    for number, start in enumerate(starts):
        block = (low @ screen[start:start + rows_per_block].t()).float()
        magnitude = torch.maximum(magnitude, block.abs().amax(dim=-1))
        if bias32 is not None:
            block = block + bias32[start:start + rows_per_block]
        block_max[:, number] = block.amax(dim=-1)
    inputs_exact = bool(torch.equal(low.float(), inputs))
    relative = (0.0 if inputs_exact and screen_exact else 2.0 ** -7) + dim * 2.0 ** -23
    margin = 2 * (2.0 ** -8 * magnitude + relative * inputs.norm(dim=-1) * max_norm)
    candidates = block_max >= (block_max.amax(dim=1) - margin)[:, None]
    best_value = inputs.new_empty(inputs.shape[0])
    best_index = torch.zeros(inputs.shape[0], dtype=torch.long, device=inputs.device)
    seen = torch.zeros(inputs.shape[0], dtype=torch.bool, device=inputs.device)
    for number in torch.nonzero(candidates.any(dim=0)).flatten().tolist():
        rows = torch.nonzero(candidates[:, number]).flatten()
        start = starts[number]
        value, index = _exact_block_best(inputs[rows], weight, bias, start, min(start + rows_per_block, vocab))
        # Blocks in ascending order and a strict >: the first of equal maxima wins.
        better = ~seen[rows] | (value > best_value[rows])
        seen[rows] = True
        best_value[rows] = torch.where(better, value, best_value[rows])
        best_index[rows] = torch.where(better, index, best_index[rows])
    return best_index
