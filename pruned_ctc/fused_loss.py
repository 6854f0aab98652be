"""The loss of reductions "sum" and "mean" with its gradient formed in the forward pass
(the three-product schedule of fused_head.py for a trainable head, the two-product one
of frozen_head.py for a frozen head); the backward only scales it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .alignment import AlignmentResult, align
from .frozen_head import FrozenHeadPass
from .fused_head import add_selected_term, fused_pass, rows_per_block
from .inputs import PreparedBatch
from .results import reduce_losses, utterance_weights, zero_nonfinite_frames
from .vocab_chunks import Precision, compute_dtype_for


@dataclass
class FusedProblem:
    """The arguments of one call besides the tensors; ``result`` is filled in."""

    batch: PreparedBatch
    beam: Optional[float]
    reduction: str
    precision: Precision
    chunk_size: int
    frozen_head: bool
    result: Optional[AlignmentResult] = None


FROZEN_HEAD = "frozen head"
TRAINABLE_HEAD = "trainable head"


def fused_schedule(weight: torch.Tensor, bias: Optional[torch.Tensor],
                   encoder_out: torch.Tensor, reduction: str,
                   precision: Precision) -> Optional[str]:
    """Which schedule forms the gradient in the forward pass, or None (the deferred one).

    Both need a scalar reduction and compute-dtype products. A head without weight and
    bias gradients takes the two-product column schedule, in any dtype (each chunk of the
    head is converted once per pass). A trainable head takes the three-product row-block
    schedule if its weight is already in the compute dtype: converting a (V, D) head per
    row block would cost a product's worth of traffic."""
    if reduction not in ("sum", "mean") or precision.float64_gradient:
        return None
    if not weight.requires_grad and (bias is None or not bias.requires_grad):
        return FROZEN_HEAD
    if weight.dtype == compute_dtype_for(encoder_out.dtype):
        return TRAINABLE_HEAD
    return None


class FusedPrunedCTC(torch.autograd.Function):
    """forward(frames (M, D), weight (V, D), bias (V,) or None, blank_offset (scalar) or
    None, problem) -> scalar loss. A blank offset only comes with the frozen-head
    schedule (pruned_ctc_loss folds it into the bias otherwise)."""

    @staticmethod
    def forward(ctx, frames, weight, bias, blank_offset, problem):
        needs = ctx.needs_input_grad[:4]
        with torch.autocast(device_type=frames.device.type, enabled=False):
            loss, gradients = _loss_and_gradients(frames, weight, bias, blank_offset, problem,
                                                  needs)
        ctx.gradients = gradients
        ctx.dtypes = tuple(None if t is None else t.dtype
                           for t in (frames, weight, bias, blank_offset))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        gradients, ctx.gradients = ctx.gradients, None
        if gradients is None:
            raise RuntimeError(
                "pruned_ctc_loss with reduction 'sum' or 'mean' hands its gradients over on "
                "the first backward; for a second backward through the same loss use "
                "reduction='none' and sum the losses")
        # Scaled in place, handed over without a copy: the (V, D) weight gradient exists once.
        scale = grad_loss.detach()
        rescale = bool(scale != 1)
        results = []
        for gradient, dtype in zip(gradients, ctx.dtypes):
            if gradient is not None and rescale:
                gradient.mul_(scale.to(gradient.dtype))
            results.append(None if gradient is None else gradient.to(dtype))
        del gradients, gradient
        return results[0], results[1], results[2], results[3], None


def _loss_and_gradients(frames, weight, bias, blank_offset, problem: FusedProblem, needs):
    batch = problem.batch
    compute_dtype = compute_dtype_for(frames.dtype)
    frames_c = frames.to(compute_dtype)
    bias_c = None if bias is None else bias.to(compute_dtype)
    need_frames, need_weight, need_bias = needs[0], needs[1], needs[2] and bias is not None
    need_offset = needs[3] and blank_offset is not None
    num_utterances = batch.num_utterances
    utterance_of_frame = torch.repeat_interleave(
        torch.arange(num_utterances, device=frames.device), batch.frame_counts)
    # An utterance with a nonfinite frame is weighted 0 from the start.
    frames_c, finite_rows, nonfinite_utterances = zero_nonfinite_frames(frames_c, batch)
    excluded = ~batch.alignable | nonfinite_utterances
    any_nonfinite = finite_rows is not None
    frame_offsets = torch.cumsum(batch.frame_counts, 0) - batch.frame_counts

    def utterance_row_weights(excluded_utterances):
        return utterance_weights(batch, excluded_utterances, problem.reduction,
                                 compute_dtype)[utterance_of_frame]

    if problem.frozen_head:
        frozen = FrozenHeadPass(frames_c, weight, bias_c, blank_offset, batch.selected_classes,
                                problem.chunk_size, problem.precision, need_frames)
        selected_log_probs = frozen.selected_log_probs
        if any_nonfinite:
            selected_log_probs.masked_fill_(~finite_rows.unsqueeze(1), float("nan"))
        result = align(selected_log_probs, frame_offsets, batch.frame_counts,
                       batch.relabeled_targets, batch.target_lengths, batch.alignable,
                       problem.beam, True, occupancy_dtype=torch.float64)
        row_weights = utterance_row_weights(result.excluded)
        dense = frozen.weighted(row_weights)
        del frozen
    else:
        dense, result, row_weights = _trainable_head(frames_c, weight, bias_c, batch, problem,
                                                    excluded, any_nonfinite, finite_rows,
                                                    utterance_row_weights, frame_offsets,
                                                    (need_frames, need_weight, need_bias))
    problem.result = result
    blank_column_sum = add_selected_term(dense, frames_c, weight, batch.selected_classes,
                                         row_weights, result.occupancy)
    grad_offset = None
    if need_offset:
        grad_offset = blank_column_sum.to(compute_dtype).reshape(blank_offset.shape)
    losses = result.losses.to(compute_dtype)
    loss = reduce_losses(losses, batch, result.excluded, problem.reduction)
    return loss, (dense.grad_frames, dense.grad_weight, dense.grad_bias, grad_offset)


def _trainable_head(frames_c, weight, bias_c, batch, problem, excluded, any_nonfinite,
                    finite_rows, utterance_row_weights, frame_offsets, needs):
    need_frames, need_weight, need_bias = needs
    block_rows = rows_per_block(frames_c.shape[0], weight.shape[0], problem.chunk_size)

    def weighted_pass(excluded_utterances):
        row_weights = utterance_row_weights(excluded_utterances)
        dense = fused_pass(frames_c, weight, bias_c, batch.selected_classes, row_weights,
                           block_rows, problem.precision, need_frames, need_weight, need_bias)
        return row_weights, dense

    row_weights, dense = weighted_pass(excluded)
    selected_log_probs = dense.selected_log_probs
    if any_nonfinite:
        selected_log_probs.masked_fill_(~finite_rows.unsqueeze(1), float("nan"))
    result = align(selected_log_probs, frame_offsets, batch.frame_counts,
                   batch.relabeled_targets, batch.target_lengths, batch.alignable,
                   problem.beam, True, occupancy_dtype=torch.float64)
    if bool((result.excluded != excluded).any()):
        # The DP excluded utterances the pass weighted: redo the pass without them (exact).
        dense = None
        row_weights, dense = weighted_pass(result.excluded)
    return dense, result, row_weights
