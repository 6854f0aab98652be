"""References for cases given as logits (N, T, V), the way other CTC libraries test theirs.

- ``head_for_logits``: a head (encoder_out, weight) whose FP32 product is exactly the given
  logits, so that a loss that takes a head can be run on them.
- ``logit_reference``: per-utterance losses and d(sum_n w_n L_n)/d logits in float64 from
  log_softmax and torch's CTC over the full vocabulary (finite logits only).
- ``brute_force_logit_reference``: the same for one utterance by enumerating all V^T label
  sequences; -inf logits allowed (tiny inputs only).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from references.ctc_reference import brute_force_loss_and_occupancy, is_alignable

# An FP32 product 1e30 * -1e30 overflows to -inf; 1e30 * 0 is exactly 0.
_MASK_SCALE = 1e30


def head_for_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder_out (N, T, D), weight (V, D)) with encoder_out @ weight.T == logits in FP32.

    Finite logits go through an identity head (D = V; products with 0 and 1 are exact). A
    -inf logit (t, v) adds nothing to the first V columns and instead sets a mask column of
    class v to 1e30 at frame t, whose weight -1e30 makes that product overflow to -inf;
    other classes meet the mask column with weight 0. NaN logits (padding) stay NaN. The
    gradient with respect to the logits is then ``encoder_out.grad[..., :V]``.
    """
    num_utterances, max_frames, vocab_size = logits.shape
    masked = torch.isneginf(logits)
    if not bool(masked.any()):
        return logits.clone(), torch.eye(vocab_size, dtype=logits.dtype)
    encoder_out = torch.cat([logits.masked_fill(masked, 0.0),
                             masked.to(logits.dtype) * _MASK_SCALE], dim=2)
    weight = torch.cat([torch.eye(vocab_size), -_MASK_SCALE * torch.eye(vocab_size)], dim=1)
    return encoder_out, weight.to(logits.dtype)


def logit_reference(logits: torch.Tensor, targets: Sequence[Sequence[int]],
                    frame_counts: Sequence[int], blank_id: int,
                    weights: Optional[Sequence[float]] = None):
    """(losses (N,), gradient (N, T, V)) in float64; frames beyond the counts are ignored
    (gradient 0) and an utterance that cannot be aligned has loss 0 and gradient 0."""
    num_utterances, max_frames, _ = logits.shape
    valid = torch.arange(max_frames).unsqueeze(0) < torch.as_tensor(frame_counts).unsqueeze(1)
    x = torch.where(valid.unsqueeze(2), logits.double(), torch.zeros((), dtype=torch.float64))
    assert bool(torch.isfinite(x).all()), "logit_reference takes finite logits on valid frames"
    x.requires_grad_(True)
    flat = torch.tensor([c for t in targets for c in t], dtype=torch.int64)
    target_lengths = torch.tensor([len(t) for t in targets], dtype=torch.int64)
    losses = F.ctc_loss(x.log_softmax(-1).transpose(0, 1), flat, torch.as_tensor(frame_counts),
                        target_lengths, blank=blank_id, reduction="none", zero_infinity=True)
    keep = torch.tensor([is_alignable(t, n) for t, n in zip(targets, frame_counts)])
    losses = torch.where(keep, losses, torch.zeros_like(losses))
    scale = torch.ones(num_utterances, dtype=torch.float64) if weights is None else \
        torch.as_tensor(weights, dtype=torch.float64)
    (losses * scale).sum().backward()
    return losses.detach(), x.grad


def brute_force_logit_reference(logits: torch.Tensor, target: Sequence[int], blank_id: int):
    """(loss, gradient (T, V)) of one utterance's valid frames, float64, by enumeration:
    loss = -log sum over label sequences collapsing to ``target`` of prod_t p_t(c_t) (inf if
    none has a nonzero probability), gradient = softmax - occupancy (0 if the loss is inf)."""
    vocab_size = logits.shape[1]
    order = [blank_id] + [c for c in range(vocab_size) if c != blank_id]  # blank first
    position = {c: i for i, c in enumerate(order)}
    log_probs = logits.double().log_softmax(-1)
    loss, occupancy, _ = brute_force_loss_and_occupancy(
        log_probs[:, order], [position[c] for c in target], None)
    if loss == float("inf"):
        return loss, torch.zeros_like(log_probs)
    occupancy_by_class = torch.zeros_like(log_probs)
    occupancy_by_class[:, order] = occupancy
    return loss, log_probs.exp() - occupancy_by_class
