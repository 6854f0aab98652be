"""The dense baseline behind the same signature: full logits, log_softmax, torch CTC.

For A/B runs and benchmarks. It materializes (N, T, V) logits and their gradients, which
is exactly what :func:`pruned_ctc.pruned_ctc_loss` avoids.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .inputs import (DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, Targets, bias_with_blank_offset,
                     check_blank_offset, check_head_inputs, check_options, prepare_batch)
from .results import LossStats, reduce_losses, warn_if_excluded
from .vocab_chunks import compute_dtype_for


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
    is kept). The head and the loss run in FP32 (FP64 for FP64 inputs)."""
    check_head_inputs(encoder_out, weight, bias)
    check_options(chunk_size, beam, blank_id, weight.shape[0], reduction)
    check_blank_offset(blank_offset, encoder_out)
    if blank_offset is not None:
        bias = bias_with_blank_offset(bias, blank_offset, blank_id, weight)
    batch = prepare_batch(encoder_out, weight.shape[0], targets, encoder_out_lens,
                          target_lengths, blank_id)
    compute_dtype = compute_dtype_for(encoder_out.dtype)
    with torch.autocast(device_type=encoder_out.device.type, enabled=False):
        logits = F.linear(encoder_out.to(compute_dtype), weight.to(compute_dtype),
                          None if bias is None else bias.to(compute_dtype))
        log_probs = logits.log_softmax(dim=-1).transpose(0, 1)  # (T, N, V)
        losses = F.ctc_loss(log_probs, batch.flat_targets, batch.frame_counts,
                            batch.target_lengths, blank=blank_id, reduction="none",
                            zero_infinity=True)
        finite = torch.isfinite(losses.detach())
        excluded = ~batch.alignable | ~finite
        losses = torch.where(excluded, torch.zeros_like(losses), losses)
        loss = reduce_losses(losses, batch, excluded, reduction)
    stats = LossStats(
        num_utterances=batch.num_utterances,
        num_selected_classes=int(batch.selected_classes.numel()),
        num_not_alignable=int((~batch.alignable).sum()),
        num_empty_lattice=0,
        num_nonfinite=int((batch.alignable & ~finite).sum()),
        excluded=excluded,
    )
    warn_if_excluded(stats, "standard_ctc_loss")
    return (loss, stats) if return_stats else loss
