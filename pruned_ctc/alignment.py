"""The CTC alignment lattice on the K selected columns: exact and finite-beam.

States s = 0..2U_n of utterance n walk the extended label sequence
(blank, y1, blank, ..., yU, blank). An alignment is a state sequence s_1..s_T that starts
in {0, 1}, ends in {2U-1, 2U} and moves by +0, +1 or +2 (the +2 skip only onto a label
that differs from the label two back). An arc (t, s_{t-1} -> s_t) emits the label of s_t
at frame t; the first frame's arcs leave a virtual start that sits in state 0.

Finite beam (paper Sec. 3.3, App. C.3, the semantics of k2's dense intersection with
``output_beam``): an arc is kept when the best complete alignment through it scores
within ``beam`` of the best alignment, i.e. F[t-1, s'] + e[t, s] + B[t, s] >= best - beam
with max-semiring forward scores F and backward scores B. The loss is minus the
log-semiring total over alignments made only of kept arcs (these may recombine into
alignments below best - beam), and the gradient is minus the occupancy over them.

Passes (all FP64, vectorized over utterances and states, one frame at a time):
1. max-plus forward and backward in the log domain (no transcendental functions): the
   best score, the kept arcs, and the support (states on some retained alignment);
2. sum-product forward and backward in the probability domain with per-frame rescaling;
   the support tells exactly whether rescaling underflowed (a supported state whose
   scaled score is 0), in which case the sums are redone in the log domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .semirings import LOG_MAX, LOG_SUM, SCALED_SUM, Semiring

# Arc kinds, the last axis of arc masks: stay in s, come from s - 1, skip from s - 2.
NUM_ARC_KINDS = 3
# Frames per block when the kept-arc test is vectorized over time (bounds temporaries).
FRAMES_PER_BLOCK = 64


@dataclass
class Lattice:
    """The CTC lattices of a batch (N utterances, L = 2 max_n U_n + 1 states).

    emissions: (T, N, L) float64, e[t, n, s] = S[row of frame t of n, class of state s];
        -inf on states beyond 2U_n, 0 on frames beyond T_n.
    labels: (N, L) int64, the selected-class index of every state (0 = blank).
    invalid_arcs: (N, L, 3) bool, arcs that the CTC topology forbids.
    final_states: (N, L) bool.
    frame_counts: (N,) int64.
    """

    emissions: torch.Tensor
    labels: torch.Tensor
    invalid_arcs: torch.Tensor
    final_states: torch.Tensor
    frame_counts: torch.Tensor

    @property
    def valid_frames(self) -> torch.Tensor:
        """(T, N) bool, t < T_n."""
        max_frames = self.emissions.shape[0]
        frames = torch.arange(max_frames, device=self.emissions.device).unsqueeze(1)
        return frames < self.frame_counts.unsqueeze(0)


def build_lattice(
    selected_log_probs: torch.Tensor,
    frame_offsets: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
) -> Lattice:
    """Gathers the emissions of every (frame, state) pair from S (M, K)."""
    device = selected_log_probs.device
    num_utterances, max_length = relabeled_targets.shape
    num_states = 2 * max_length + 1
    max_frames = int(frame_counts.max())

    labels = torch.zeros(num_utterances, num_states, dtype=torch.int64, device=device)
    labels[:, 1::2] = relabeled_targets
    state_index = torch.arange(num_states, device=device)
    valid_states = state_index.unsqueeze(0) < (2 * target_lengths + 1).unsqueeze(1)

    frame_index = torch.arange(max_frames, device=device).unsqueeze(1)  # (T, 1)
    valid_frames = frame_index < frame_counts.unsqueeze(0)  # (T, N)
    rows = frame_offsets.unsqueeze(0) + torch.minimum(frame_index, frame_counts.unsqueeze(0) - 1)
    emissions = selected_log_probs.to(torch.float64)[rows.unsqueeze(2), labels.unsqueeze(0)]
    emissions.masked_fill_(~valid_frames.unsqueeze(2), 0.0)
    emissions.masked_fill_(~valid_states.unsqueeze(0), float("-inf"))

    invalid_arcs = torch.zeros(num_utterances, num_states, NUM_ARC_KINDS, dtype=torch.bool,
                               device=device)
    invalid_arcs[:, 0, 1] = True
    invalid_arcs[:, :2, 2] = True
    if num_states > 2:
        invalid_arcs[:, 2:, 2] = (labels[:, 2:] == 0) | (labels[:, 2:] == labels[:, :-2])

    last_state = 2 * target_lengths
    final_states = (state_index.unsqueeze(0) == last_state.unsqueeze(1)) | (
        (state_index.unsqueeze(0) == (last_state - 1).unsqueeze(1)) & (last_state > 0).unsqueeze(1)
    )
    return Lattice(emissions, labels, invalid_arcs, final_states, frame_counts)


def _incoming(previous: torch.Tensor) -> torch.Tensor:
    """(..., L + 2) scores with two leading padding columns -> (..., L, 3) arc sources."""
    return torch.stack((previous[..., 2:], previous[..., 1:-1], previous[..., :-2]), dim=-1)


def forward_pass(semiring: Semiring, emissions: torch.Tensor,
                 arc_mask_at: Callable[[int], torch.Tensor],
                 out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward scores of every state at every frame.

    Args:
        emissions: (T, N, L) in the semiring's domain.
        arc_mask_at(t): (N, L, 3) bool, arcs into frame t that are removed.
    Returns:
        history (T + 1, N, L + 2): ``history[t + 1, :, 2:]`` is the (scaled) score of
        reaching each state at frame t with its emission; ``history[0]`` is the virtual
        start; two leading padding columns.
        log_scales (T, N) float64: log of the factor each frame was divided by.
    """
    max_frames, num_utterances, num_states = emissions.shape
    shape = (max_frames + 1, num_utterances, num_states + 2)
    history = out if out is not None else emissions.new_empty(shape)
    history.fill_(semiring.zero)
    history[0, :, 2] = semiring.one
    scales = emissions.new_ones(max_frames, num_utterances)
    for t in range(max_frames):
        candidates = _incoming(history[t]).masked_fill_(arc_mask_at(t), semiring.zero)
        scores = semiring.times(semiring.plus(candidates), emissions[t])
        semiring.rescale(scores, out=history[t + 1, :, 2:], scales=scales[t])
    return history, semiring.log_of_scales(scales)


def backward_pass(semiring: Semiring, emissions: torch.Tensor, final_states: torch.Tensor,
                  frame_counts: torch.Tensor, arc_mask_at: Callable[[int], torch.Tensor],
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Backward scores B[t, s] (excluding e[t, s]), as (T, N, L). B at an utterance's last
    frame is ``one`` on final states; frames beyond it hold meaningless values."""
    max_frames, num_utterances, num_states = emissions.shape
    history = out if out is not None else emissions.new_empty(max_frames, num_utterances,
                                                              num_states)
    final = torch.where(final_states, semiring.one, semiring.zero).to(emissions.dtype)
    last_frame = (frame_counts - 1).unsqueeze(1)
    padded = emissions.new_full((num_utterances, num_states + 2, NUM_ARC_KINDS), semiring.zero)
    unused_scale = emissions.new_ones(num_utterances)
    history[max_frames - 1] = torch.where(last_frame == max_frames - 1, final, semiring.zero)
    for t in range(max_frames - 2, -1, -1):
        # Arcs of frame t + 1 leave state s towards s + k with emission e[t + 1, s + k].
        continuing = semiring.times(history[t + 1], emissions[t + 1])
        padded[:, :num_states] = continuing.unsqueeze(2).masked_fill(arc_mask_at(t + 1),
                                                                     semiring.zero)
        candidates = torch.stack((padded[:, :num_states, 0], padded[:, 1:num_states + 1, 1],
                                  padded[:, 2:num_states + 2, 2]), dim=-1)
        scores = torch.where(last_frame == t, final, semiring.plus(candidates))
        semiring.rescale(scores, out=history[t], scales=unused_scale)
    return history


def _final_total(semiring: Semiring, history: torch.Tensor, log_scales: torch.Tensor,
                 lattice: Lattice) -> torch.Tensor:
    """Log total (N,) of each utterance's lattice: final states at its last frame."""
    utterances = torch.arange(lattice.frame_counts.numel(), device=history.device)
    at_end = history[lattice.frame_counts, utterances, 2:]
    total = semiring.to_log(semiring.plus_all(at_end.masked_fill(~lattice.final_states,
                                                             semiring.zero)))
    cumulative = log_scales.masked_fill(~lattice.valid_frames, 0.0).sum(dim=0)
    return total + cumulative


def _kept_arcs(lattice: Lattice, best_forward: torch.Tensor, best_backward: torch.Tensor,
               best: torch.Tensor, beam: float) -> torch.Tensor:
    """Pruned arcs (T, N, L, 3) bool: F[t-1, s-k] + e[t, s] + B[t, s] < best - beam."""
    max_frames = lattice.emissions.shape[0]
    threshold = (best - beam).view(1, -1, 1, 1)
    pruned = torch.empty((max_frames,) + tuple(lattice.invalid_arcs.shape), dtype=torch.bool,
                         device=lattice.emissions.device)
    for start in range(0, max_frames, FRAMES_PER_BLOCK):
        stop = min(start + FRAMES_PER_BLOCK, max_frames)
        through = _incoming(best_forward[start:stop]) + (
            lattice.emissions[start:stop] + best_backward[start:stop]).unsqueeze(3)
        torch.logical_or(lattice.invalid_arcs, ~(through >= threshold), out=pruned[start:stop])
    return pruned


@dataclass
class AlignmentResult:
    """losses: (N,) float64, minus the retained total log-likelihood (0 where excluded).
    occupancy: (M, K) float64 or None, posterior occupancy of each selected class at each
        frame over the retained alignments (0 on excluded utterances).
    excluded: (N,) bool. empty_lattice, nonfinite: (N,) bool, why (among alignable ones).
    used_log_domain: whether the sums were computed in the log domain (underflow fallback).
    """

    losses: torch.Tensor
    occupancy: Optional[torch.Tensor]
    excluded: torch.Tensor
    empty_lattice: torch.Tensor
    nonfinite: torch.Tensor
    used_log_domain: bool = False


def _sum_passes(semiring: Semiring, lattice: Lattice, mask_at, need_occupancy: bool,
                forward_buffer: torch.Tensor, backward_buffer: torch.Tensor):
    emissions, shift = semiring.from_log_emissions(lattice.emissions)
    history, log_scales = forward_pass(semiring, emissions, mask_at, out=forward_buffer)
    if shift is not None:
        log_scales = log_scales + shift
    total = _final_total(semiring, history, log_scales, lattice)
    if not need_occupancy:
        return total, history, None
    after = backward_pass(semiring, emissions, lattice.final_states, lattice.frame_counts,
                          mask_at, out=backward_buffer)
    return total, history, after


def align(
    selected_log_probs: torch.Tensor,
    frame_offsets: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
    alignable: torch.Tensor,
    beam: Optional[float],
    need_occupancy: bool,
    force_log_domain: bool = False,
) -> AlignmentResult:
    """Per-utterance retained losses and (optionally) occupancies from S (M, K)."""
    lattice = build_lattice(selected_log_probs, frame_offsets, frame_counts,
                            relabeled_targets, target_lengths)
    structural = lattice.invalid_arcs
    valid_frames = lattice.valid_frames

    best_forward, _ = forward_pass(LOG_MAX, lattice.emissions, lambda t: structural)
    best_backward = backward_pass(LOG_MAX, lattice.emissions, lattice.final_states,
                                  frame_counts, lambda t: structural)
    best = _final_total(LOG_MAX, best_forward, best_forward.new_zeros(valid_frames.shape),
                        lattice)
    if beam is None:
        pruned = None
        mask_at = lambda t: structural  # noqa: E731
        support = torch.isfinite(best_forward[1:, :, 2:] + best_backward)
    else:
        pruned = _kept_arcs(lattice, best_forward, best_backward, best, beam)
        mask_at = pruned.__getitem__
        support = ~pruned.all(dim=3)
    support &= valid_frames.unsqueeze(2)

    # Reuse the max-pass buffers for the sums.
    semiring = LOG_SUM if force_log_domain else SCALED_SUM
    total, history, after = _sum_passes(semiring, lattice, mask_at, need_occupancy,
                                        best_forward, best_backward)
    if semiring is SCALED_SUM:
        underflow = support & (history[1:, :, 2:] <= SCALED_SUM.tiny)
        if after is not None:
            underflow |= support & (after <= SCALED_SUM.tiny)
        if bool(underflow.any()):
            semiring = LOG_SUM
            total, history, after = _sum_passes(semiring, lattice, mask_at, need_occupancy,
                                                history, after)

    losses = -total
    finite = torch.isfinite(losses)
    empty_lattice = alignable & ~finite & torch.isneginf(best)
    if beam is None:
        empty_lattice &= False
    nonfinite = alignable & ~finite & ~empty_lattice
    excluded = ~alignable | ~finite
    losses = torch.where(excluded, torch.zeros_like(losses), losses)

    occupancy = None
    if need_occupancy:
        # Each retained alignment sits in exactly one state per frame, so the posterior
        # over states sums to one at every frame: normalizing per frame divides by the total.
        state_occupancy = semiring.normalized_product(history[1:, :, 2:], after)
        state_occupancy = state_occupancy.transpose(0, 1)  # (N, T, L)
        state_occupancy = state_occupancy.masked_fill(
            excluded.view(-1, 1, 1) | torch.isnan(state_occupancy), 0.0)
        valid = valid_frames.t()
        per_frame = state_occupancy[valid]  # (M, L), rows in frame order
        labels = lattice.labels.unsqueeze(1).expand(-1, valid.shape[1], -1)[valid]
        occupancy = torch.zeros(per_frame.shape[0], selected_log_probs.shape[1],
                                dtype=torch.float64, device=selected_log_probs.device)
        occupancy.scatter_add_(1, labels, per_frame)
    return AlignmentResult(losses, occupancy, excluded, empty_lattice, nonfinite,
                           used_log_domain=semiring is LOG_SUM)
