"""The public Pruned CTC loss (paper Sec. 3, Alg. 1)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from .alignment import align
from .inputs import PreparedBatch, Targets, check_head_inputs, check_options, prepare_batch
from .vocab_chunks import DEFAULT_PRECISION, Precision, SelectedLogProbs


class ExcludedUtteranceWarning(UserWarning):
    """Some utterances of a call contributed zero loss and zero gradient."""


@dataclass
class LossStats:
    """What a call computed and which utterances it left out (and why).

    excluded: (N,) bool; an excluded utterance has zero loss and exactly zero gradient.
    """

    num_utterances: int
    num_selected_classes: int
    num_not_alignable: int
    num_empty_lattice: int
    num_nonfinite: int
    excluded: torch.Tensor

    @property
    def num_excluded(self) -> int:
        return self.num_not_alignable + self.num_empty_lattice + self.num_nonfinite


def warn_if_excluded(stats: LossStats, caller: str) -> None:
    if stats.num_excluded:
        warnings.warn(
            f"{caller}: {stats.num_excluded} of {stats.num_utterances} utterances contribute "
            f"zero loss and zero gradient (not alignable, T_n < |y_n| + repeats: "
            f"{stats.num_not_alignable}; empty retained lattice: {stats.num_empty_lattice}; "
            f"nonfinite loss: {stats.num_nonfinite})",
            ExcludedUtteranceWarning,
            stacklevel=3,
        )


def pack_frames(encoder_out: torch.Tensor, frame_counts: torch.Tensor) -> torch.Tensor:
    """(N, T, D) padded -> (M, D), the valid frames utterance after utterance."""
    num_utterances, max_frames, dim = encoder_out.shape
    if bool((frame_counts == max_frames).all()):
        return encoder_out.reshape(num_utterances * max_frames, dim)
    valid = torch.arange(max_frames, device=encoder_out.device).unsqueeze(0) < frame_counts.unsqueeze(1)
    return encoder_out[valid]


def reduce_losses(losses: torch.Tensor, batch: PreparedBatch, excluded: torch.Tensor,
                  reduction: str) -> torch.Tensor:
    """"sum"; "mean": divided by the number of target tokens of the contributing
    utterances (at least 1); "none": the (N,) vector."""
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "mean":
        tokens = batch.target_lengths.masked_fill(excluded, 0).sum().clamp(min=1)
        total = total / tokens.to(total.dtype)
    return total


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


def pruned_ctc_loss(
    encoder_out: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: Targets,
    encoder_out_lens,
    *,
    target_lengths=None,
    blank_id: int = 0,
    chunk_size: int = 4096,
    beam: Optional[float] = 100.0,
    reduction: str = "sum",
    return_stats: bool = False,
    precision: Precision = DEFAULT_PRECISION,
):
    """CTC loss of the head ``encoder_out @ weight.T + bias`` without (N, T, V) logits.

    Args:
        encoder_out: (N, T, D) head input, float32, bfloat16, float16 or float64.
        weight: (V, D) head weight; bias: (V,) or None.
        targets: blank-free class ids: a list of N integer sequences; or a padded (N, U)
            tensor with ``target_lengths``; or a concatenated 1-D tensor with
            ``target_lengths``.
        encoder_out_lens: (N,) integers in [1, T], the valid frames T_n.
        target_lengths: (N,) integers, only with tensor targets.
        blank_id: the blank class in [0, V).
        chunk_size: vocabulary columns projected at a time (paper's C).
        beam: alignment beam (Sec. 3.3); None keeps every alignment (unpruned reduced
            CTC, exact).
        reduction: "sum", "mean" (divided by the target tokens of the contributing
            utterances) or "none" (per-utterance vector).
        return_stats: also return a :class:`LossStats`.

    Products run in FP32 (FP64 for FP64 inputs) whatever autocast region is active; the
    normalizer and the alignment recurrences in FP64. Gradients come back in the inputs'
    dtypes. Utterances that cannot be aligned (T_n < |y_n| + r_n), whose retained lattice
    is empty or whose loss is nonfinite contribute zero loss and zero gradient, with one
    :class:`ExcludedUtteranceWarning` per call.
    """
    check_head_inputs(encoder_out, weight, bias)
    check_options(chunk_size, beam, blank_id, weight.shape[0], reduction)
    batch = prepare_batch(encoder_out, weight.shape[0], targets, encoder_out_lens,
                          target_lengths, blank_id)
    device_type = encoder_out.device.type
    with torch.autocast(device_type=device_type, enabled=False):
        frames = pack_frames(encoder_out, batch.frame_counts)
        selected_log_probs = SelectedLogProbs.apply(frames, weight, bias,
                                                    batch.selected_classes, chunk_size, precision)
        need_grad = torch.is_grad_enabled() and selected_log_probs.requires_grad
        frame_offsets = torch.cumsum(batch.frame_counts, 0) - batch.frame_counts
        result = align(selected_log_probs.detach(), frame_offsets, batch.frame_counts,
                       batch.relabeled_targets, batch.target_lengths, batch.alignable,
                       None if beam is None else float(beam), need_grad)
        if need_grad:
            utterance_of_frame = torch.repeat_interleave(
                torch.arange(batch.num_utterances, device=frames.device), batch.frame_counts)
            occupancy = result.occupancy.to(selected_log_probs.dtype)
            losses = _RetainedAlignmentLoss.apply(selected_log_probs, result.losses,
                                                  occupancy, utterance_of_frame)
        else:
            losses = result.losses.to(selected_log_probs.dtype)
        loss = reduce_losses(losses, batch, result.excluded, reduction)

    stats = LossStats(
        num_utterances=batch.num_utterances,
        num_selected_classes=int(batch.selected_classes.numel()),
        num_not_alignable=int((~batch.alignable).sum()),
        num_empty_lattice=int(result.empty_lattice.sum()),
        num_nonfinite=int(result.nonfinite.sum()),
        excluded=result.excluded,
    )
    warn_if_excluded(stats, "pruned_ctc_loss")
    return (loss, stats) if return_stats else loss


class PrunedCTCLoss(torch.nn.Module):
    """:func:`pruned_ctc_loss` with its options held; ``last_stats`` keeps the latest
    call's :class:`LossStats`."""

    def __init__(self, blank_id: int = 0, chunk_size: int = 4096,
                 beam: Optional[float] = 100.0, reduction: str = "sum") -> None:
        super().__init__()
        self.blank_id = blank_id
        self.chunk_size = chunk_size
        self.beam = beam
        self.reduction = reduction
        self.last_stats: Optional[LossStats] = None

    def forward(self, encoder_out, weight, bias, targets, encoder_out_lens,
                target_lengths=None) -> torch.Tensor:
        loss, self.last_stats = pruned_ctc_loss(
            encoder_out, weight, bias, targets, encoder_out_lens,
            target_lengths=target_lengths, blank_id=self.blank_id,
            chunk_size=self.chunk_size, beam=self.beam, reduction=self.reduction,
            return_stats=True)
        return loss

    def extra_repr(self) -> str:
        return (f"blank_id={self.blank_id}, chunk_size={self.chunk_size}, beam={self.beam}, "
                f"reduction={self.reduction!r}")
