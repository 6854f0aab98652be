"""Selected-class log-probabilities with full-vocabulary normalization (paper Alg. 1).

Forward: an online log-sum-exp over vocabulary chunks of at most ``chunk_size`` columns
gives the normalizer lambda_m of every frame (eq. 1) in FP64; the selected columns are
projected once, and S = X W_U^T + b_U - lambda is subtracted in FP64 and rounded once to
the compute dtype (App. C.1). Backward: each chunk of logits is recomputed and the dense
gradient of eq. 9, scatter_U(G) - g p, is formed and consumed chunk by chunk.
No (M, V) tensor exists at any time; the largest temporary is one (M, chunk) block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Precision:
    """The precision choices of App. C.2 (Table 6). The defaults are the paper's choice
    and the library's: the others exist for ``scripts/numerical_accuracy.py``.

    float64_normalizer: online log-sum-exp and the subtraction S = Z_U - lambda in FP64
        (else FP32 throughout).
    reuse_selected: the backward pass takes the selected columns' probabilities from the
        saved S (else it recomputes them from the chunk with an FP32 normalizer).
    float64_gradient: the gradient's recomputed logits, products and sums in FP64.
    """

    float64_normalizer: bool = True
    reuse_selected: bool = True
    float64_gradient: bool = False


DEFAULT_PRECISION = Precision()


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Head products run in FP32 (FP64 when the inputs are FP64), App. C.2."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(
    frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    start: int, stop: int,
) -> torch.Tensor:
    """Logits Z[:, start:stop] of one vocabulary chunk in the frames' (compute) dtype."""
    weight_chunk = weight[start:stop].to(frames.dtype)
    if bias is None:
        return frames @ weight_chunk.t()
    return torch.addmm(bias[start:stop].to(frames.dtype), frames, weight_chunk.t())


def _finite_or_zero(values: torch.Tensor) -> torch.Tensor:
    """Replaces -inf (a row with no finite logit yet) by 0 so that shifts stay finite."""
    return torch.where(torch.isneginf(values), torch.zeros_like(values), values)


# exp(Z - max) terms are added in FP32 in groups of this many columns, and the group sums
# in FP64: about FP64 accuracy for these bounded terms (relative error ~1e-8 per row), at
# the cost of one FP32 pass. sum(dtype=float64) over the whole block would first copy the
# block to FP64, doubling its memory and time.
COLUMNS_PER_FP32_GROUP = 64


def _sum_in_float64(block: torch.Tensor) -> torch.Tensor:
    """Row sums (M,) float64 of an (M, C) block of terms in [0, 1]."""
    width = block.shape[1]
    grouped = width - width % COLUMNS_PER_FP32_GROUP
    total = block[:, :grouped].unflatten(1, (-1, COLUMNS_PER_FP32_GROUP)).sum(dim=2).sum(
        dim=1, dtype=torch.float64)
    if grouped < width:
        total += block[:, grouped:].sum(dim=1, dtype=torch.float64)
    return total


def full_vocabulary_normalizer(
    frames: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], chunk_size: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """lambda_m = log sum_v exp Z[m, v] (eq. 1), one chunk of columns at a time.

    Args:
        frames: (M, D) in the compute dtype.
        weight: (V, D); bias: (V,) or None.
        dtype: the accumulation dtype (FP64; FP32 only for the precision ablation).
    Returns:
        (M,) in ``dtype``.
    """
    num_frames = frames.shape[0]
    running_max = torch.full((num_frames,), float("-inf"), dtype=dtype, device=frames.device)
    running_sum = torch.zeros(num_frames, dtype=dtype, device=frames.device)
    vocab_size = weight.shape[0]
    for start in range(0, vocab_size, chunk_size):
        logits = _chunk_logits(frames, weight, bias, start, min(start + chunk_size, vocab_size))
        chunk_max = logits.amax(dim=1).to(dtype)
        shift = _finite_or_zero(chunk_max)
        # exp(Z - chunk max) lies in [0, 1]; its terms are summed in FP64.
        terms = logits.sub_(shift.to(logits.dtype).unsqueeze(1)).exp_()
        chunk_sum = (_sum_in_float64(terms) if dtype == torch.float64
                     else terms.sum(dim=1, dtype=dtype))
        new_max = torch.maximum(running_max, chunk_max)
        reference = _finite_or_zero(new_max)
        running_sum = running_sum * torch.exp(running_max - reference) + torch.where(
            chunk_sum > 0, chunk_sum * torch.exp(shift - reference), torch.zeros_like(chunk_sum))
        running_max = new_max
        del logits  # free this block before the next one is allocated
    safe_max = _finite_or_zero(running_max)
    return torch.log(running_sum) + safe_max


class SelectedLogProbs(torch.autograd.Function):
    """S = log softmax over the full vocabulary, restricted to the selected columns U.

    forward(frames (M, D), weight (V, D), bias (V,) or None, selected_classes (K,) int64,
    chunk_size, precision=DEFAULT_PRECISION) -> S (M, K) in the compute dtype.

    Rows whose incoming gradient is entirely zero (frames of excluded utterances) get
    exactly zero gradient, even when their inputs are nonfinite.
    """

    @staticmethod
    def forward(ctx, frames, weight, bias, selected_classes, chunk_size,
                precision=DEFAULT_PRECISION):
        compute_dtype = compute_dtype_for(frames.dtype)
        normalizer_dtype = torch.float64 if precision.float64_normalizer else compute_dtype
        frames_c = frames.to(compute_dtype)
        normalizer = full_vocabulary_normalizer(frames_c, weight, bias, chunk_size,
                                                normalizer_dtype)
        selected_weight = weight.index_select(0, selected_classes).to(compute_dtype)
        selected_logits = frames_c @ selected_weight.t()
        if bias is not None:
            selected_logits += bias.index_select(0, selected_classes).to(compute_dtype)
        # Subtract in FP64, round once (App. C.1, Table 6's best setting).
        selected_log_probs = (
            selected_logits.to(normalizer_dtype) - normalizer.unsqueeze(1)
        ).to(compute_dtype)
        ctx.chunk_size = chunk_size
        ctx.precision = precision
        ctx.has_bias = bias is not None
        ctx.save_for_backward(frames, weight, bias if bias is not None else weight.new_empty(0),
                              selected_classes, selected_log_probs, normalizer)
        return selected_log_probs

    @staticmethod
    def backward(ctx, grad_selected):
        (frames, weight, bias, selected_classes, selected_log_probs,
         normalizer) = ctx.saved_tensors
        bias = bias if ctx.has_bias else None
        precision = ctx.precision
        gradient_dtype = (torch.float64 if precision.float64_gradient
                          else selected_log_probs.dtype)
        grad_selected = grad_selected.to(gradient_dtype)
        frames_c = frames.to(gradient_dtype)
        silent_rows = (grad_selected == 0).all(dim=1)
        if bool(silent_rows.any()):
            # Excluded rows may hold nonfinite values: 0 * nan would leak into dX and dW.
            frames_c = frames_c.masked_fill(silent_rows.unsqueeze(1), 0.0)
            selected_log_probs = selected_log_probs.masked_fill(silent_rows.unsqueeze(1), 0.0)
            normalizer = normalizer.masked_fill(silent_rows, 0.0)
        # g_m = sum_j G[m, j] (eq. 9); the selected columns of the dense gradient are
        # G - g * exp(S), using the saved S (Table 6: "reused").
        row_sums = grad_selected.sum(dim=1, keepdim=True)
        selected_grad = grad_selected - row_sums * selected_log_probs.to(gradient_dtype).exp()
        if not precision.float64_gradient:
            normalizer = normalizer.to(selected_log_probs.dtype)
        normalizer_c = normalizer.to(gradient_dtype).unsqueeze(1)

        need_frames, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_frames = torch.zeros_like(frames_c) if need_frames else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if (need_bias and bias is not None) else None
        vocab_size = weight.shape[0]
        chunk_size = ctx.chunk_size
        chunk_starts = range(0, vocab_size, chunk_size) if not bool(silent_rows.all()) else []
        for start in chunk_starts:
            stop = min(start + chunk_size, vocab_size)
            logits = _chunk_logits(frames_c, weight, bias, start, stop)
            # -g_m p_v(m) for every column of the chunk (eq. 9, second term).
            grad_logits = logits.sub_(normalizer_c).exp_().mul_(-row_sums)
            in_chunk = (selected_classes >= start) & (selected_classes < stop)
            if bool(in_chunk.any()):
                columns = in_chunk.nonzero().squeeze(1)
                local = selected_classes[columns] - start
                if precision.reuse_selected:
                    grad_logits[:, local] = selected_grad[:, columns]
                else:
                    grad_logits[:, local] += grad_selected[:, columns]
            if grad_frames is not None:
                grad_frames.addmm_(grad_logits, weight[start:stop].to(gradient_dtype))
            if grad_weight is not None:
                grad_weight[start:stop] = (grad_logits.t() @ frames_c).to(weight.dtype)
            if grad_bias is not None:
                grad_bias[start:stop] = grad_logits.sum(dim=0).to(bias.dtype)
            del logits, grad_logits  # free this block before the next one is allocated
        if grad_frames is not None:
            grad_frames = grad_frames.to(frames.dtype)
        return grad_frames, grad_weight, grad_bias, None, None, None
