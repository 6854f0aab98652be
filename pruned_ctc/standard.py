"""The dense baseline behind the same signature: full logits, log_softmax, torch CTC.

For A/B runs and benchmarks. It materializes (M, V) logits, log-probabilities and their
gradients over the M valid frames, which is exactly what :func:`pruned_ctc.pruned_ctc_loss`
avoids; it excludes utterances and treats padding and nonfinite values as that loss does.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .inputs import (DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, PreparedBatch, Targets,
                     bias_with_blank_offset, check_blank_offset, check_head_inputs,
                     check_options, prepare_batch)
from .results import (LossStats, pack_frames, reduce_losses, warn_if_excluded,
                      zero_nonfinite_frames)
from .vocab_chunks import compute_dtype_for

# Stands in for log 0 in torch's CTC, whose backward forms exp(a + b - log p) and turns a
# log p of -inf into NaN. Any alignment through it scores below -1e30, exp() of which
# is exactly 0 next to a real alignment, so finite losses and their gradients are
# unchanged; where no alignment avoids it, the loss of the unaltered input decides.
IMPOSSIBLE_LOG_PROB = -1e30


def standard_ctc_loss(
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
    blank_offset: Optional[torch.Tensor] = None,
):
    """Same arguments and results as :func:`pruned_ctc.pruned_ctc_loss`; ``chunk_size``
    and ``beam`` are accepted for signature compatibility and ignored (every alignment
    is kept). The head and log_softmax run in FP32 (FP64 for FP64 inputs), the CTC
    recursions in FP64 as pruned_ctc_loss's. Frames beyond ``encoder_out_lens`` never
    enter (zero gradient whatever they hold); an utterance that is not alignable, has a
    nonfinite frame or no alignment of finite score (-inf logits) is excluded with
    exactly zero gradient."""
    check_head_inputs(encoder_out, weight, bias)
    check_options(chunk_size, beam, blank_id, weight.shape[0], reduction)
    check_blank_offset(blank_offset, encoder_out)
    if blank_offset is not None:
        bias = bias_with_blank_offset(bias, blank_offset, blank_id, weight)
    batch = prepare_batch(encoder_out, weight.shape[0], targets, encoder_out_lens,
                          target_lengths, blank_id)
    compute_dtype = compute_dtype_for(encoder_out.dtype)
    with torch.autocast(device_type=encoder_out.device.type, enabled=False):
        frames = pack_frames(encoder_out, batch.frame_counts).to(compute_dtype)
        frames, _, nonfinite_frames = zero_nonfinite_frames(frames, batch)
        logits = F.linear(frames, weight.to(compute_dtype),
                          None if bias is None else bias.to(compute_dtype))
        log_probs = logits.log_softmax(dim=-1)  # (M, V)
        del logits
        # Only the classes of the batch's targets (and blank) enter an alignment.
        selected = log_probs.index_select(1, batch.selected_classes).to(torch.float64)
        losses, nonfinite_loss = _selected_class_ctc(selected, batch,
                                                   batch.alignable & ~nonfinite_frames)
        nonfinite = batch.alignable & (nonfinite_frames | nonfinite_loss)
        excluded = ~batch.alignable | nonfinite
        losses = torch.where(excluded, torch.zeros_like(losses), losses).to(compute_dtype)
        loss = reduce_losses(losses, batch, excluded, reduction)
    stats = LossStats(
        num_utterances=batch.num_utterances,
        num_selected_classes=int(batch.selected_classes.numel()),
        num_not_alignable=int((~batch.alignable).sum()),
        num_empty_lattice=0,
        num_nonfinite=int(nonfinite.sum()),
        excluded=excluded,
    )
    warn_if_excluded(stats, "standard_ctc_loss")
    return (loss, stats) if return_stats else loss


def _selected_class_ctc(selected: torch.Tensor, batch: PreparedBatch,
                        contributing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses (N,) float64, nonfinite_loss (N,) bool) of torch's CTC on the selected
    columns S (M, K) float64 of the full-vocabulary log-probabilities; nonfinite_loss
    marks contributing utterances without an alignment of finite score.

    The frames of utterances that do not contribute are replaced by zeros, so that their
    gradient is exactly zero whatever they hold. torch's CTC gets each frame's S
    renormalized over the K columns (the input it expects), and the per-frame
    normalizers are added back: every alignment emits one class per frame, so they
    shift all alignments of an utterance alike. Its gradient is then exact whichever
    way torch's backward treats the normalization of its input.
    """
    frame_counts, num_utterances = batch.frame_counts, batch.num_utterances
    utterance_of_frame = torch.repeat_interleave(
        torch.arange(num_utterances, device=selected.device), frame_counts)
    nonfinite_loss = torch.zeros_like(contributing)
    if not bool(torch.isfinite(selected.detach()).all()):
        exact = _ctc(selected.detach(), batch, zero_infinity=False)
        nonfinite_loss = contributing & ~torch.isfinite(exact)
        contributing = contributing & ~nonfinite_loss
    kept_rows = contributing[utterance_of_frame].unsqueeze(1)
    safe = torch.where(kept_rows, selected.clamp(min=IMPOSSIBLE_LOG_PROB),
                       torch.zeros_like(selected))
    normalizers = safe.logsumexp(dim=1)
    alignment_losses = _ctc(safe - normalizers.unsqueeze(1), batch, zero_infinity=True)
    frame_sums = normalizers.new_zeros(num_utterances).index_add(
        0, utterance_of_frame, normalizers)
    return alignment_losses - frame_sums, nonfinite_loss


def _ctc(frame_scores: torch.Tensor, batch: PreparedBatch, zero_infinity: bool
         ) -> torch.Tensor:
    """torch's per-utterance CTC losses of packed per-frame scores (M, K), blank first."""
    num_utterances = batch.num_utterances
    max_frames = int(batch.frame_counts.max())
    valid = (torch.arange(max_frames, device=frame_scores.device).unsqueeze(0)
             < batch.frame_counts.unsqueeze(1))
    padded = frame_scores.new_zeros(num_utterances, max_frames, frame_scores.shape[1])
    padded[valid] = frame_scores
    return F.ctc_loss(padded.transpose(0, 1), batch.relabeled_targets, batch.frame_counts,
                      batch.target_lengths, blank=0, reduction="none",
                      zero_infinity=zero_infinity)
