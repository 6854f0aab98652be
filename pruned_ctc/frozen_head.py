"""The two-product schedule for a frozen head (no weight or bias gradient), reductions
"sum" and "mean" (paper eq. 9).

With L = sum_n w_n L_n, the head input's gradient is
    dX[m] = w_n(m) (sum_v p_v(m) W_v - sum_{u in U} gamma_u(m) W_u).
The dense sum needs no weights and no normalizer while it is formed: one pass over
column chunks of all M rows computes, per chunk, the logits (product 1), the online
log-sum-exp of Alg. 1 with the selected columns copied out (S), and adds
exp(Z - running max) W_chunk (product 2) to an (M, D) sum that is rescaled whenever a
row's running maximum grows (the online softmax). At the end the sum is divided by the
row's total and scaled by w; after the DP the K selected columns add w (p_U - gamma)
through (M, K) products (fused_head.add_selected_term).

Why columns and not the row blocks of the trainable schedule (fused_head.py): a row
block spanning the vocabulary reads the whole (V, D) head once per block (37 times at
M = 4,000, V = 151,936), a column chunk reads its rows of the head once per pass; the
trainable schedule needs the row's normalizer before its weight-gradient product, the
frozen one does not. Each chunk of the head is converted to the compute dtype once, so a
head stored in bf16 (an LLM's) costs no copy of the head.

The row weights only scale rows at the end: utterances the DP excludes need no second
pass.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fused_head import FusedPass
from .normalizer import block_view, columns_by_chunk, finite_or_zero, sum_in_float64
from .vocab_chunks import Precision


class FrozenHeadPass:
    """One pass over the vocabulary's column chunks; then :meth:`weighted` forms the dense
    part of the gradient for the row weights the DP leaves.

    frames (M, D) finite, in the compute dtype; weight (V, D) and bias (V,) or None in
    any float dtype; blank_offset: a scalar added to the blank logit (blank is
    ``selected_classes[0]``) or None.
    """

    def __init__(self, frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 blank_offset: Optional[torch.Tensor], selected_classes: torch.Tensor,
                 chunk_size: int, precision: Precision, need_frames: bool) -> None:
        num_frames, dim = frames.shape
        vocab_size = weight.shape[0]
        device, dtype = frames.device, frames.dtype
        normalizer_dtype = torch.float64 if precision.float64_normalizer else dtype
        blank = int(selected_classes[0])
        offset = None if blank_offset is None else blank_offset.detach().to(dtype)
        running_max = torch.full((num_frames,), float("-inf"), dtype=dtype, device=device)
        running_sum = torch.zeros(num_frames, dtype=normalizer_dtype, device=device)
        selected_logits = frames.new_empty(num_frames, selected_classes.numel())
        expected = frames.new_zeros(num_frames, dim) if need_frames else None
        buffer = frames.new_empty(num_frames * min(chunk_size, vocab_size))
        for start, stop, positions, columns in columns_by_chunk(selected_classes, vocab_size,
                                                                chunk_size):
            weight_chunk = weight[start:stop].to(dtype)
            logits = block_view(buffer, num_frames, stop - start)
            if bias is None:
                torch.mm(frames, weight_chunk.t(), out=logits)
            else:
                torch.addmm(bias[start:stop].to(dtype), frames, weight_chunk.t(), out=logits)
            if offset is not None and start <= blank < stop:
                logits[:, blank - start] += offset
            if positions.numel():
                selected_logits.index_copy_(1, positions, logits.index_select(1, columns))
            chunk_max, where = logits.max(dim=1, keepdim=True)
            new_max = torch.maximum(running_max, chunk_max.squeeze(1))
            # exp(old max - new max) in the normalizer's dtype: the maxima are FP32 values,
            # their FP64 difference is exact.
            rescale = torch.exp(finite_or_zero(running_max).to(normalizer_dtype)
                                - finite_or_zero(new_max).to(normalizer_dtype))
            # exp(Z - new running max) in [0, 1]: the terms of the sum and of product 2.
            logits.sub_(finite_or_zero(new_max).unsqueeze(1)).exp_()
            running_sum = running_sum * rescale + _row_sums(
                logits, where, normalizer_dtype)
            running_max = new_max
            if expected is not None:
                if positions.numel():
                    logits.index_fill_(1, columns, 0.0)  # U's columns come after the DP
                expected.mul_(rescale.to(dtype).unsqueeze(1)).addmm_(logits, weight_chunk)
        self.total = running_sum
        self.expected = expected
        normalizer = torch.log(running_sum) + finite_or_zero(running_max).to(normalizer_dtype)
        # Subtract in FP64, round once (App. B.2).
        self.selected_log_probs = (selected_logits.to(normalizer_dtype)
                                   - normalizer.unsqueeze(1)).to(dtype)
        self.selected_probs = None
        if not precision.reuse_selected:
            # Table 6's "recomputed": the normalizer in the compute dtype.
            self.selected_probs = (selected_logits - normalizer.to(dtype).unsqueeze(1)).exp_()

    def weighted(self, row_weights: torch.Tensor) -> FusedPass:
        """The pass's gradients for rows weighted by ``row_weights`` (M,) (0: excluded);
        the dense sum is scaled in place (call once)."""
        grad_frames, self.expected = self.expected, None
        if grad_frames is not None:
            total = self.total.to(torch.float64)
            scale = torch.where(row_weights != 0,
                                row_weights.to(torch.float64) / total, 0.0).to(grad_frames.dtype)
            grad_frames.mul_(scale.unsqueeze(1))
        return FusedPass(self.selected_log_probs, self.selected_probs, grad_frames, None, None)


def _row_sums(terms: torch.Tensor, where: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row sums of a block of terms in [0, 1] in ``dtype``; in FP64 the chunk's largest
    term is kept out of the FP32 group sums (normalizer.shifted_exp_sums says why)."""
    if dtype != torch.float64:
        return terms.sum(dim=1, dtype=dtype)
    top = terms.gather(1, where)
    terms.scatter_(1, where, 0.0)
    total = sum_in_float64(terms) + top.squeeze(1).to(torch.float64)
    terms.scatter_(1, where, top)
    return total
