"""The three-product schedule of the loss for reductions "sum" and "mean" (paper eq. 9).

With L = sum_n w_n L_n (w_n = 1 for "sum", 1 / tokens for "mean"), the gradient of the
head's logits is dL/dZ[m, v] = w_n(m) (p_v(m) - gamma_v(m)), where the occupancy gamma is
zero outside the selected classes U. The dense part, w p on the columns outside U, needs
only the frame's weight, known before the alignment DP (zero for utterances that cannot
be aligned). So one pass over row blocks that span the vocabulary computes, per block,
the logits (product 1), the normalizer, S, and the dense part's contributions to dX
(product 2) and dW (product 3); after the DP the K selected columns add
w (p_U - gamma) through (M, K) products. The backward only scales by the incoming
gradient. A frozen head (no weight gradient) costs two products, as standard CTC does.

The selected columns' term is formed elementwise before its products, as in the deferred
schedule: p_U and gamma nearly cancel on a trained model (App. B.2), and a separate
product of each would lose that difference to FP32 rounding.

Utterances that the DP excludes (empty retained lattice, nonfinite loss) but that the
pass weighted are corrected exactly: the pass is repeated with their weight set to zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .normalizer import block_logits, block_view, finite_or_zero, shifted_exp_sums
from .vocab_chunks import Precision


def rows_per_block(num_frames: int, vocab_size: int, chunk_size: int) -> int:
    """r with r V about M C: the block holds as many values as one (M, C) column chunk,
    whatever V."""
    return max(1, min(num_frames, (num_frames * chunk_size) // vocab_size))


@dataclass
class FusedPass:
    """What one pass over the row blocks produced.

    selected_log_probs: (M, K) S in the compute dtype.
    selected_probs: (M, K) p at the selected columns, or None when they are exp(S)
        (reused, Table 6).
    grad_frames (M, D), grad_weight (V, D), grad_bias (V,): the dense term of eq. 9 on
        the columns outside U, each None when not needed.
    """

    selected_log_probs: torch.Tensor
    selected_probs: Optional[torch.Tensor]
    grad_frames: Optional[torch.Tensor]
    grad_weight: Optional[torch.Tensor]
    grad_bias: Optional[torch.Tensor]


def fused_pass(frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               selected_classes: torch.Tensor, row_weights: torch.Tensor, block_rows: int,
               precision: Precision, need_frames: bool, need_weight: bool,
               need_bias: bool) -> FusedPass:
    """One pass over row blocks of ``block_rows`` frames, all in the compute dtype.

    frames (M, D) finite; weight (V, D); bias (V,) or None; row_weights (M,), w_n of each
    frame's utterance (0 for excluded ones)."""
    num_frames, dim = frames.shape
    vocab_size = weight.shape[0]
    num_selected = selected_classes.numel()
    normalizer_dtype = torch.float64 if precision.float64_normalizer else frames.dtype
    selected_log_probs = frames.new_empty(num_frames, num_selected)
    selected_probs = None if precision.reuse_selected else frames.new_empty(num_frames,
                                                                             num_selected)
    grad_frames = frames.new_empty(num_frames, dim) if need_frames else None
    grad_weight = torch.empty_like(weight) if need_weight else None
    grad_bias = torch.empty_like(bias) if need_bias else None
    buffer = frames.new_empty(block_rows * vocab_size)
    for start in range(0, num_frames, block_rows):
        stop = min(start + block_rows, num_frames)
        block_frames = frames[start:stop]
        logits = block_logits(block_frames, weight, bias, 0, vocab_size,
                              block_view(buffer, stop - start, vocab_size))
        selected_logits = logits.index_select(1, selected_classes)
        row_max, total = shifted_exp_sums(logits, normalizer_dtype)
        normalizer = torch.log(total) + finite_or_zero(row_max)
        # Subtract in FP64, round once (App. B.2); logits now hold exp(Z - row max).
        block_log_probs = (selected_logits.to(normalizer_dtype) - normalizer.unsqueeze(1)
                           ).to(frames.dtype)
        selected_log_probs[start:stop] = block_log_probs
        inverse_total = torch.where(total > 0, total.reciprocal(), torch.zeros_like(total))
        if selected_probs is not None:
            # Table 6's "recomputed": from the logits with the normalizer in the compute dtype.
            torch.sub(selected_logits, normalizer.to(frames.dtype).unsqueeze(1),
                      out=selected_probs[start:stop]).exp_()
        # w p_v on the columns outside U; U's columns are added after the DP.
        logits.index_fill_(1, selected_classes, 0.0)
        # Each row's factor w / sum is applied to the (r, D) sides of the products, not to
        # the (r, V) block: one pass over the block fewer.
        scale = (inverse_total * row_weights[start:stop].to(normalizer_dtype)).to(frames.dtype)
        terms = logits
        if grad_frames is not None:
            torch.mm(terms, weight, out=grad_frames[start:stop]).mul_(scale.unsqueeze(1))
        if grad_weight is not None:
            scaled_frames = block_frames * scale.unsqueeze(1)
            if start == 0:
                torch.mm(terms.t(), scaled_frames, out=grad_weight)
            else:
                grad_weight.addmm_(terms.t(), scaled_frames)
        if grad_bias is not None:
            if start == 0:
                torch.mv(terms.t(), scale, out=grad_bias)
            else:
                grad_bias.addmv_(terms.t(), scale)
    return FusedPass(selected_log_probs, selected_probs, grad_frames, grad_weight, grad_bias)


def add_selected_term(dense: FusedPass, frames: torch.Tensor, weight: torch.Tensor,
                      selected_classes: torch.Tensor, row_weights: torch.Tensor,
                      occupancy: torch.Tensor) -> torch.Tensor:
    """Adds w (p_U - gamma) on the K selected columns (eq. 9) to the pass's gradients and
    returns its sum over the blank column (FP64 scalar): the gradient of an offset added
    to the blank logit.

    p_U and gamma (FP64 from the DP) nearly cancel on a trained model: their difference is
    formed in FP64 and rounded once, like S (App. B.2); an (M, K) cost."""
    if dense.selected_probs is None:
        probabilities = dense.selected_log_probs.to(torch.float64).exp_()
    else:
        probabilities = dense.selected_probs.to(torch.float64)
    row_weights64 = row_weights.to(torch.float64).unsqueeze(1)
    # Rows of weight 0 (excluded utterances) may hold nonfinite S: exactly 0, not 0 * nan.
    selected_grad64 = torch.where(row_weights64 != 0,
                                  probabilities.sub_(occupancy).mul_(row_weights64), 0.0)
    selected_grad = selected_grad64.to(frames.dtype)
    if dense.grad_frames is not None:
        dense.grad_frames.addmm_(selected_grad,
                                 weight.index_select(0, selected_classes).to(frames.dtype))
    if dense.grad_weight is not None:
        dense.grad_weight.index_add_(0, selected_classes, selected_grad.t() @ frames)
    if dense.grad_bias is not None:
        # The sum over M rows of a nearly cancelling difference: in FP64 too.
        column_sums = selected_grad64.sum(dim=0).to(frames.dtype)
        dense.grad_bias.index_add_(0, selected_classes, column_sums)
    return selected_grad64[:, 0].sum()
