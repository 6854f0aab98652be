"""The public Pruned CTC loss (paper Sec. 3, Alg. 1)."""

from __future__ import annotations

from typing import Optional

import torch

from .fused_loss import FROZEN_HEAD, FusedPrunedCTC, FusedProblem, fused_schedule
from .inputs import (DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, Targets, bias_with_blank_offset,
                     check_blank_offset, check_head_inputs, check_options, prepare_batch)
from .results import LossStats, alignment_stats, pack_frames, warn_if_excluded
from .two_stage import alignment_loss, reduce_vocabulary
from .vocab_chunks import DEFAULT_PRECISION, Precision


def pruned_ctc_loss(
    encoder_out: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: Targets,
    encoder_out_lens,
    *,
    target_lengths=None,
    blank_id: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    beam: Optional[float] = DEFAULT_BEAM,
    reduction: str = "sum",
    return_stats: bool = False,
    precision: Precision = DEFAULT_PRECISION,
    blank_offset: Optional[torch.Tensor] = None,
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
        chunk_size: the paper's C: vocabulary columns projected at a time, or with a scalar
            reduction, rows per block such that a block holds about M C values.
        beam: alignment beam (Sec. 3.3); None keeps every alignment (unpruned reduced
            CTC, exact).
        reduction: "sum", "mean" (divided by the target tokens of the contributing
            utterances) or "none" (per-utterance vector).
        return_stats: also return a :class:`LossStats`.
        precision: the precision choices of App. B.2 (Table 6); the default is the
            paper's choice.
        blank_offset: a scalar tensor added to the blank class's logit, e.g. LLM-CTC's
            learned offset eta on a frozen head (App. D.2); its gradient is exact and
            costs nothing, and unlike a trainable (V,) bias it keeps a frozen head on the
            two-product schedule.

    Products run in FP32 (FP64 for FP64 inputs) whatever autocast region is active; the
    normalizer and the alignment recurrences in FP64. Gradients come back in the inputs'
    dtypes. Utterances that cannot be aligned (T_n < |y_n| + r_n), whose retained lattice
    is empty or whose loss is nonfinite contribute zero loss and zero gradient, with one
    :class:`ExcludedUtteranceWarning` per call.

    Schedules: with reduction "sum" or "mean" and gradients enabled, the gradient is
    formed during the forward pass and ``backward`` can run once per call: a frozen head
    (weight and bias without gradient, any dtype) costs two products of the head, over
    column chunks (frozen_head.py); a trainable head whose weight is in the compute dtype
    three, over row blocks (fused_head.py). Otherwise the normalizer pass is one product
    and the backward recomputes the logits.
    """
    check_head_inputs(encoder_out, weight, bias)
    check_options(chunk_size, beam, blank_id, weight.shape[0], reduction)
    check_blank_offset(blank_offset, encoder_out)
    beam = None if beam is None else float(beam)
    needs_gradient = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (encoder_out, weight, bias, blank_offset))
    schedule = fused_schedule(weight, bias, encoder_out, reduction, precision)
    if blank_offset is not None and not (needs_gradient and schedule == FROZEN_HEAD):
        bias = bias_with_blank_offset(bias, blank_offset, blank_id, weight)
        blank_offset = None
        schedule = fused_schedule(weight, bias, encoder_out, reduction, precision)
    if not (needs_gradient and schedule is not None):
        reduced = reduce_vocabulary(encoder_out, weight, bias, targets, encoder_out_lens,
                                    target_lengths=target_lengths, blank_id=blank_id,
                                    chunk_size=chunk_size, precision=precision)
        return alignment_loss(reduced, beam=beam, reduction=reduction,
                              return_stats=return_stats, caller="pruned_ctc_loss")

    batch = prepare_batch(encoder_out, weight.shape[0], targets, encoder_out_lens,
                          target_lengths, blank_id)
    problem = FusedProblem(batch, beam, reduction, precision, chunk_size,
                           frozen_head=schedule == FROZEN_HEAD)
    with torch.autocast(device_type=encoder_out.device.type, enabled=False):
        frames = pack_frames(encoder_out, batch.frame_counts)
        loss = FusedPrunedCTC.apply(frames, weight, bias, blank_offset, problem)
    result = problem.result
    stats = alignment_stats(batch, result.empty_lattice, result.nonfinite, result.excluded)
    warn_if_excluded(stats, "pruned_ctc_loss")
    return (loss, stats) if return_stats else loss


class PrunedCTCLoss(torch.nn.Module):
    """:func:`pruned_ctc_loss` with its options held; ``last_stats`` keeps the latest
    call's :class:`LossStats`."""

    def __init__(self, blank_id: int = 0, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 beam: Optional[float] = DEFAULT_BEAM, reduction: str = "sum",
                 precision: Precision = DEFAULT_PRECISION) -> None:
        super().__init__()
        self.blank_id = blank_id
        self.chunk_size = chunk_size
        self.beam = beam
        self.reduction = reduction
        self.precision = precision
        self.last_stats: Optional[LossStats] = None

    def forward(self, encoder_out, weight, bias, targets, encoder_out_lens,
                target_lengths=None) -> torch.Tensor:
        loss, self.last_stats = pruned_ctc_loss(
            encoder_out, weight, bias, targets, encoder_out_lens,
            target_lengths=target_lengths, blank_id=self.blank_id,
            chunk_size=self.chunk_size, beam=self.beam, reduction=self.reduction,
            return_stats=True, precision=self.precision)
        return loss

    def extra_repr(self) -> str:
        return (f"blank_id={self.blank_id}, chunk_size={self.chunk_size}, beam={self.beam}, "
                f"reduction={self.reduction!r}")
