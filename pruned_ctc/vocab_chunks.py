"""Selected-class log-probabilities with full-vocabulary normalization (paper Alg. 1),
the deferred schedule: the gradient is formed in the backward pass.

Forward: an online log-sum-exp over vocabulary chunks of at most ``chunk_size`` columns
gives the normalizer lambda_m of every frame (eq. 1) in FP64, and the selected columns
Z[:, U] are copied out of the same chunks; S = Z_U - lambda is subtracted in FP64 and
rounded once to the compute dtype (App. B.1). One product of the head.
Backward: each chunk of logits is recomputed and the dense gradient of eq. 9,
scatter_U(G) - g p, is formed and consumed chunk by chunk: three more products.
No (M, V) tensor exists at any time; the largest temporary is one (M, chunk) block.

The loss uses this schedule for reduction "none", the FP64-gradient ablation and heads
whose weight is not in the compute dtype; fused_head.py has the three-product one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .normalizer import block_logits, block_view, columns_by_chunk, full_vocabulary_normalizer


@dataclass(frozen=True)
class Precision:
    """The precision choices of App. B.2 (Table 6). The defaults are the paper's choice
    and the library's.

    float64_normalizer: online log-sum-exp and the subtraction S = Z_U - lambda in FP64
        (else FP32 throughout).
    reuse_selected: the gradient takes the selected columns' probabilities from S (else
        it recomputes them from the chunk with an FP32 normalizer).
    float64_gradient: the gradient's recomputed logits, products and sums in FP64.
    """

    float64_normalizer: bool = True
    reuse_selected: bool = True
    float64_gradient: bool = False


DEFAULT_PRECISION = Precision()


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Head products run in FP32 (FP64 when the inputs are FP64), App. B.2."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def selected_log_probs_and_normalizer(frames_c, weight, bias, selected_classes, chunk_size,
                                      precision):
    """(S (M, K) compute dtype, lambda (M,)) from one pass over the vocabulary."""
    normalizer_dtype = torch.float64 if precision.float64_normalizer else frames_c.dtype
    normalizer, selected_logits = full_vocabulary_normalizer(
        frames_c, weight, bias, chunk_size, normalizer_dtype, selected_classes)
    # Subtract in FP64, round once (App. B.2, Table 6's best setting).
    selected_log_probs = (selected_logits.to(normalizer_dtype) - normalizer.unsqueeze(1)
                          ).to(frames_c.dtype)
    return selected_log_probs, normalizer


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
        with torch.autocast(device_type=frames.device.type, enabled=False):
            frames_c = frames.to(compute_dtype_for(frames.dtype))
            selected_log_probs, normalizer = selected_log_probs_and_normalizer(
                frames_c, weight, bias, selected_classes, chunk_size, precision)
        ctx.chunk_size = chunk_size
        ctx.precision = precision
        ctx.has_bias = bias is not None
        ctx.save_for_backward(frames, weight, bias if bias is not None else weight.new_empty(0),
                              selected_classes, selected_log_probs, normalizer)
        return selected_log_probs

    @staticmethod
    def backward(ctx, grad_selected):
        # A backward inside an autocast region must not run the products in its dtype.
        with torch.autocast(device_type=grad_selected.device.type, enabled=False):
            return _backward(ctx, grad_selected)


def _backward(ctx, grad_selected):
    (frames, weight, bias, selected_classes, selected_log_probs,
     normalizer) = ctx.saved_tensors
    bias = bias if ctx.has_bias else None
    precision = ctx.precision
    gradient_dtype = torch.float64 if precision.float64_gradient else selected_log_probs.dtype
    grad_selected = grad_selected.to(gradient_dtype)
    frames_c = frames.to(gradient_dtype)
    silent_rows = (grad_selected == 0).all(dim=1)
    all_silent = bool(silent_rows.all())
    if bool(silent_rows.any()):
        # Excluded rows may hold nonfinite values: 0 * nan would leak into dX and dW.
        frames_c = frames_c.masked_fill(silent_rows.unsqueeze(1), 0.0)
        selected_log_probs = selected_log_probs.masked_fill(silent_rows.unsqueeze(1), 0.0)
        normalizer = normalizer.masked_fill(silent_rows, 0.0)
    # g_m = sum_j G[m, j] (eq. 9); the selected columns of the dense gradient are
    # G - g * exp(S), using S (Table 6: "reused").
    row_sums = grad_selected.sum(dim=1, keepdim=True)
    selected_grad = grad_selected - row_sums * selected_log_probs.to(gradient_dtype).exp()
    if not precision.float64_gradient:
        normalizer = normalizer.to(selected_log_probs.dtype)
    normalizer_c = normalizer.to(gradient_dtype).unsqueeze(1)
    minus_row_sums = -row_sums

    need_frames, need_weight, need_bias = ctx.needs_input_grad[:3]
    need_bias = need_bias and bias is not None
    num_frames, vocab_size = frames_c.shape[0], weight.shape[0]
    if all_silent:
        return (torch.zeros_like(frames) if need_frames else None,
                torch.zeros_like(weight) if need_weight else None,
                torch.zeros_like(bias) if need_bias else None, None, None, None)
    grad_frames = torch.zeros_like(frames_c) if need_frames else None
    # Every row is written by exactly one chunk: no zero fill.
    grad_weight = torch.empty_like(weight) if need_weight else None
    grad_bias = torch.empty_like(bias) if need_bias else None
    chunk_size = ctx.chunk_size
    buffer = frames_c.new_empty(num_frames * min(chunk_size, vocab_size))
    for start, stop, positions, columns in columns_by_chunk(selected_classes, vocab_size,
                                                            chunk_size):
        logits = block_logits(frames_c, weight, bias, start, stop,
                              block_view(buffer, num_frames, stop - start))
        # -g_m p_v(m) for every column of the chunk (eq. 9, second term).
        grad_logits = logits.sub_(normalizer_c).exp_().mul_(minus_row_sums)
        if positions.numel():
            if precision.reuse_selected:
                grad_logits.index_copy_(1, columns, selected_grad.index_select(1, positions))
            else:
                grad_logits.index_add_(1, columns, grad_selected.index_select(1, positions))
        weight_chunk = weight[start:stop].to(gradient_dtype)
        if grad_frames is not None:
            grad_frames.addmm_(grad_logits, weight_chunk)
        if grad_weight is not None:
            if grad_weight.dtype == gradient_dtype:
                torch.mm(grad_logits.t(), frames_c, out=grad_weight[start:stop])
            else:
                grad_weight[start:stop] = grad_logits.t() @ frames_c
        if grad_bias is not None:
            grad_bias[start:stop] = grad_logits.sum(dim=0)
    if grad_frames is not None:
        grad_frames = grad_frames.to(frames.dtype)
    return grad_frames, grad_weight, grad_bias, None, None, None
