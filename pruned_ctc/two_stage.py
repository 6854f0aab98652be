"""Pruned CTC in two public stages (paper Alg. 1): vocabulary reduction, then the
alignment loss on the reduced problem. One reduction serves any number of beams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .alignment import align
from .inputs import (DEFAULT_CHUNK_SIZE, PreparedBatch, Targets, check_beam,
                     check_head_inputs, check_options, check_reduction, prepare_batch)
from .results import alignment_stats, pack_frames, reduce_losses, warn_if_excluded
from .vocab_chunks import DEFAULT_PRECISION, Precision, SelectedLogProbs


@dataclass
class ReducedBatch:
    """The reduced problem of one batch.

    selected_log_probs: (M, K) S, log-probabilities of the selected classes normalized
        over the full vocabulary, differentiable with respect to the head and its input.
    batch: the validated targets, lengths, selected classes U (blank first) and targets
        relabeled into [0, K).
    """

    selected_log_probs: torch.Tensor
    batch: PreparedBatch

    @property
    def selected_classes(self) -> torch.Tensor:
        return self.batch.selected_classes

    @property
    def frame_offsets(self) -> torch.Tensor:
        """(N,) the row of S where each utterance's frames start."""
        return torch.cumsum(self.batch.frame_counts, 0) - self.batch.frame_counts


def reduce_vocabulary(
    encoder_out: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: Targets,
    encoder_out_lens,
    *,
    target_lengths=None,
    blank_id: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    precision: Precision = DEFAULT_PRECISION,
) -> ReducedBatch:
    """Stage 1: S over the classes of the batch's targets (and blank), normalized over
    all V classes a chunk at a time (Sec. 3.2); arguments as :func:`pruned_ctc_loss`.
    The head runs in FP32 (FP64 for FP64 inputs) whatever autocast region is active."""
    check_head_inputs(encoder_out, weight, bias)
    check_options(chunk_size, None, blank_id, weight.shape[0], "none")
    batch = prepare_batch(encoder_out, weight.shape[0], targets, encoder_out_lens,
                          target_lengths, blank_id)
    with torch.autocast(device_type=encoder_out.device.type, enabled=False):
        frames = pack_frames(encoder_out, batch.frame_counts)
        selected_log_probs = SelectedLogProbs.apply(frames, weight, bias,
                                                    batch.selected_classes, chunk_size,
                                                    precision)
    return ReducedBatch(selected_log_probs, batch)


class _RetainedAlignmentLoss(torch.autograd.Function):
    """Per-utterance losses as a function of S; dL/dS = -occupancy (scaled per utterance)."""

    @staticmethod
    def forward(ctx, selected_log_probs, losses, occupancy, utterance_of_frame):
        ctx.save_for_backward(occupancy, utterance_of_frame)
        return losses.to(selected_log_probs.dtype)

    @staticmethod
    def backward(ctx, grad_losses):
        occupancy, utterance_of_frame = ctx.saved_tensors
        frame_weights = grad_losses.to(occupancy.dtype)[utterance_of_frame].unsqueeze(1)
        grad_selected = -(occupancy * frame_weights)
        return grad_selected, None, None, None


def alignment_loss(reduced: ReducedBatch, *, beam: Optional[float], reduction: str = "sum",
                   return_stats: bool = False, caller: str = "alignment_loss"):
    """Stage 2: minus the log total over the alignments that ``beam`` retains (Sec. 3.3;
    None keeps all: exact CTC on the reduced problem), reduced as in
    :func:`pruned_ctc_loss`, differentiable through S."""
    batch = reduced.batch
    selected_log_probs = reduced.selected_log_probs
    check_beam(beam)
    check_reduction(reduction)
    with torch.autocast(device_type=selected_log_probs.device.type, enabled=False):
        need_grad = torch.is_grad_enabled() and selected_log_probs.requires_grad
        result = align(selected_log_probs.detach(), reduced.frame_offsets, batch.frame_counts,
                       batch.relabeled_targets, batch.target_lengths, batch.alignable,
                       None if beam is None else float(beam), need_grad)
        if need_grad:
            utterance_of_frame = torch.repeat_interleave(
                torch.arange(batch.num_utterances, device=selected_log_probs.device),
                batch.frame_counts)
            losses = _RetainedAlignmentLoss.apply(selected_log_probs, result.losses,
                                                  result.occupancy, utterance_of_frame)
        else:
            losses = result.losses.to(selected_log_probs.dtype)
        loss = reduce_losses(losses, batch, result.excluded, reduction)
    stats = alignment_stats(batch, result.empty_lattice, result.nonfinite, result.excluded)
    warn_if_excluded(stats, caller)
    return (loss, stats) if return_stats else loss
