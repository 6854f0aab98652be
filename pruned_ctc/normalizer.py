"""The full-vocabulary normalizer lambda_m = log sum_v exp Z[m, v] (paper eq. 1), and
the selected columns of Z gathered from the very blocks it is computed from.

Both schedules of the loss share this arithmetic: ``full_vocabulary_normalizer`` walks
column chunks of all M rows with an online log-sum-exp (Alg. 1); the fused schedule
(fused_head.py) walks row blocks that span the vocabulary and calls
``shifted_exp_sums`` once per block. Blocks live in one reused buffer.
"""

from __future__ import annotations

from typing import Optional

import torch

# exp(Z - max) terms are added in FP32 in groups of this many columns, and the group sums
# in FP64: about FP64 accuracy for these bounded terms, at the cost of one FP32 pass.
# sum(dtype=float64) over the whole block would first copy it to FP64, doubling its
# memory and time.
COLUMNS_PER_FP32_GROUP = 64


def block_logits(frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
    """Z[:, start:stop] = frames W[start:stop]^T + b[start:stop] into ``out`` (compute
    dtype). The same call yields the normalizer's terms and the selected logits, so S
    and lambda come from identical roundings (paper App. B.2)."""
    weight_chunk = weight[start:stop].to(frames.dtype)
    if bias is None:
        return torch.mm(frames, weight_chunk.t(), out=out)
    return torch.addmm(bias[start:stop].to(frames.dtype), frames, weight_chunk.t(), out=out)


def block_view(buffer: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """A contiguous (rows, columns) view at the start of a flat reused buffer."""
    return buffer[:rows * columns].view(rows, columns)


def finite_or_zero(values: torch.Tensor) -> torch.Tensor:
    """Replaces -inf (a row with no finite logit yet) by 0 so that shifts stay finite."""
    return torch.where(torch.isneginf(values), torch.zeros_like(values), values)


def sum_in_float64(block: torch.Tensor) -> torch.Tensor:
    """Row sums (R,) float64 of an (R, C) block of terms in [0, 1]: FP32 groups, FP64
    group sums."""
    width = block.shape[1]
    grouped = width - width % COLUMNS_PER_FP32_GROUP
    total = block[:, :grouped].unflatten(1, (-1, COLUMNS_PER_FP32_GROUP)).sum(dim=2).sum(
        dim=1, dtype=torch.float64)
    if grouped < width:
        total += block[:, grouped:].sum(dim=1, dtype=torch.float64)
    return total


def shifted_exp_sums(block: torch.Tensor, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Overwrites the logits block (R, C) with exp(Z - row max) and returns (row max,
    row sum of the terms), both (R,) in ``dtype``.

    With an FP64 ``dtype`` each row's largest term (exactly 1) is kept out of the FP32
    group sums and added in FP64: on a peaky row the other terms are tiny, and adding
    them to 1.0 in FP32 would round away about 1e-7 of the normalizer (App. B.2)."""
    row_max, where = block.max(dim=1, keepdim=True)
    block.sub_(finite_or_zero(row_max)).exp_()
    if dtype != torch.float64:
        return row_max.squeeze(1).to(dtype), block.sum(dim=1, dtype=dtype)
    top = block.gather(1, where)
    block.scatter_(1, where, 0.0)
    total = sum_in_float64(block) + top.squeeze(1).to(torch.float64)
    block.scatter_(1, where, top)
    return row_max.squeeze(1).to(dtype), total


def columns_by_chunk(selected_classes: torch.Tensor, vocab_size: int, chunk_size: int
                     ) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """For every vocabulary chunk: (start, stop, positions in U, columns in the chunk),
    the selected classes that fall into it. One host synchronization per call (the
    counts), none per chunk."""
    chunk_of = torch.div(selected_classes, chunk_size, rounding_mode="floor")
    order = torch.argsort(chunk_of, stable=True)
    num_chunks = -(-vocab_size // chunk_size)
    counts = torch.bincount(chunk_of, minlength=num_chunks).tolist()
    chunks, offset = [], 0
    for index, count in enumerate(counts):
        start = index * chunk_size
        positions = order[offset:offset + count]
        chunks.append((start, min(start + chunk_size, vocab_size), positions,
                       selected_classes[positions] - start))
        offset += count
    return chunks


def full_vocabulary_normalizer(
    frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], chunk_size: int,
    dtype: torch.dtype = torch.float64, selected_classes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """lambda_m over column chunks of at most ``chunk_size``, and the selected logits.

    Args:
        frames: (M, D) in the compute dtype. weight: (V, D); bias: (V,) or None.
        dtype: the accumulation dtype (FP64; FP32 only for the precision ablation).
        selected_classes: (K,) int64 or None.
    Returns:
        lambda (M,) in ``dtype``; Z[:, U] (M, K) in the compute dtype (or None), copied
        out of each chunk before its exponentials overwrite it.
    """
    num_frames = frames.shape[0]
    vocab_size = weight.shape[0]
    running_max = torch.full((num_frames,), float("-inf"), dtype=dtype, device=frames.device)
    running_sum = torch.zeros(num_frames, dtype=dtype, device=frames.device)
    selected_logits = None
    if selected_classes is not None:
        selected_logits = frames.new_empty(num_frames, selected_classes.numel())
        chunks = columns_by_chunk(selected_classes, vocab_size, chunk_size)
    else:
        chunks = [(start, min(start + chunk_size, vocab_size), None, None)
                  for start in range(0, vocab_size, chunk_size)]
    # One buffer for every chunk: fresh blocks cost page faults on every chunk.
    buffer = frames.new_empty(num_frames * min(chunk_size, vocab_size))
    for start, stop, positions, columns in chunks:
        logits = block_logits(frames, weight, bias, start, stop,
                              block_view(buffer, num_frames, stop - start))
        if positions is not None and positions.numel():
            selected_logits.index_copy_(1, positions, logits.index_select(1, columns))
        chunk_max, chunk_sum = shifted_exp_sums(logits, dtype)
        new_max = torch.maximum(running_max, chunk_max)
        reference = finite_or_zero(new_max)
        shift = finite_or_zero(chunk_max)
        running_sum = running_sum * torch.exp(running_max - reference) + torch.where(
            chunk_sum > 0, chunk_sum * torch.exp(shift - reference), torch.zeros_like(chunk_sum))
        running_max = new_max
    return torch.log(running_sum) + finite_or_zero(running_max), selected_logits
