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

All recurrences run in FP64, vectorized over utterances and states, one frame at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

NEG_INF = float("-inf")
# Arc kinds, the last axis of arc masks: stay in s, come from s - 1, skip from s - 2.
NUM_ARC_KINDS = 3


@dataclass
class Lattice:
    """The CTC lattices of a batch (N utterances, L = 2 max_n U_n + 1 states).

    emissions: (T, N, L) float64, e[t, n, s] = S[row of frame t of n, class of state s];
        -inf on states beyond 2U_n, finite filler on frames beyond T_n.
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
    emissions.masked_fill_(~valid_states.unsqueeze(0), NEG_INF)

    invalid_arcs = torch.zeros(num_utterances, num_states, NUM_ARC_KINDS, dtype=torch.bool,
                               device=device)
    invalid_arcs[:, 0, 1] = True
    invalid_arcs[:, :2, 2] = True
    if num_states > 2:
        skip_forbidden = (labels[:, 2:] == 0) | (labels[:, 2:] == labels[:, :-2])
        invalid_arcs[:, 2:, 2] = skip_forbidden

    last_state = 2 * target_lengths
    final_states = (state_index.unsqueeze(0) == last_state.unsqueeze(1)) | (
        (state_index.unsqueeze(0) == (last_state - 1).unsqueeze(1)) & (last_state > 0).unsqueeze(1)
    )
    return Lattice(emissions, labels, invalid_arcs, final_states, frame_counts)


Reduce = Callable[[torch.Tensor], torch.Tensor]


def _log_sum(candidates: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(candidates, dim=-1)


def _max(candidates: torch.Tensor) -> torch.Tensor:
    return candidates.amax(dim=-1)


def _incoming(previous: torch.Tensor) -> torch.Tensor:
    """(N, L + 2) scores padded with two leading -inf columns -> (N, L, 3) arc sources."""
    return torch.stack((previous[:, 2:], previous[:, 1:-1], previous[:, :-2]), dim=-1)


def forward_scores(lattice: Lattice, arc_mask_at: Callable[[int], torch.Tensor],
                   reduce: Reduce) -> torch.Tensor:
    """Forward scores over all frames.

    Returns history (T + 1, N, L + 2): ``history[t + 1, :, 2:]`` holds the score of
    reaching each state at frame t (0-based) with its emission; ``history[0]`` is the
    virtual start (0 in state 0). The two leading columns are -inf padding.
    """
    max_frames, num_utterances, num_states = lattice.emissions.shape
    history = torch.full((max_frames + 1, num_utterances, num_states + 2), NEG_INF,
                         dtype=torch.float64, device=lattice.emissions.device)
    history[0, :, 2] = 0.0
    for t in range(max_frames):
        candidates = _incoming(history[t]).masked_fill_(arc_mask_at(t), NEG_INF)
        torch.add(reduce(candidates), lattice.emissions[t], out=history[t + 1, :, 2:])
    return history


def backward_scores(lattice: Lattice, arc_mask_at: Callable[[int], torch.Tensor],
                    reduce: Reduce, consume: Callable[[int, torch.Tensor], None]) -> None:
    """Backward scores B[t, s] (excluding e[t, s]), handed to ``consume(t, B_t)`` from the
    last frame down to frame 0. B at an utterance's last frame is 0 on final states."""
    max_frames, num_utterances, num_states = lattice.emissions.shape
    device = lattice.emissions.device
    start = torch.where(lattice.final_states, 0.0, NEG_INF).to(torch.float64)
    last_frame = lattice.frame_counts - 1
    padded = torch.full((num_utterances, num_states + 2, NUM_ARC_KINDS), NEG_INF,
                        dtype=torch.float64, device=device)
    is_last = (last_frame == max_frames - 1).unsqueeze(1)
    scores = torch.where(is_last, start, torch.full_like(start, NEG_INF))
    consume(max_frames - 1, scores)
    for t in range(max_frames - 2, -1, -1):
        # Arcs of frame t + 1 leave state s towards s + k with emission e[t + 1, s + k].
        continuing = (scores + lattice.emissions[t + 1]).unsqueeze(2).expand(
            num_utterances, num_states, NUM_ARC_KINDS)
        padded[:, :num_states] = continuing.masked_fill(arc_mask_at(t + 1), NEG_INF)
        candidates = torch.stack(
            (padded[:, :num_states, 0], padded[:, 1:num_states + 1, 1],
             padded[:, 2:num_states + 2, 2]), dim=-1)
        scores = torch.where((last_frame == t).unsqueeze(1), start, reduce(candidates))
        consume(t, scores)


@dataclass
class AlignmentResult:
    """losses: (N,) float64, minus the retained total log-likelihood (0 where excluded).
    occupancy: (M, K) float64 or None, posterior occupancy of each selected class at each
        frame over the retained alignments (0 on excluded utterances).
    excluded: (N,) bool. empty_lattice, nonfinite: (N,) bool, why (among alignable ones).
    """

    losses: torch.Tensor
    occupancy: Optional[torch.Tensor]
    excluded: torch.Tensor
    empty_lattice: torch.Tensor
    nonfinite: torch.Tensor


def _final_total(history: torch.Tensor, lattice: Lattice, reduce: Reduce) -> torch.Tensor:
    utterances = torch.arange(lattice.frame_counts.numel(), device=history.device)
    at_end = history[lattice.frame_counts, utterances, 2:]
    return reduce(at_end.masked_fill(~lattice.final_states, NEG_INF))


def kept_arc_mask(lattice: Lattice, beam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Max-semiring passes: returns (pruned arcs (T, N, L, 3) bool, best score (N,))."""
    structural = lattice.invalid_arcs
    best_history = forward_scores(lattice, lambda t: structural, _max)
    best = _final_total(best_history, lattice, _max)
    threshold = (best - beam).view(-1, 1, 1)
    max_frames = lattice.emissions.shape[0]
    pruned = torch.empty((max_frames,) + tuple(structural.shape), dtype=torch.bool,
                         device=structural.device)

    def mark(t: int, best_after: torch.Tensor) -> None:
        through = _incoming(best_history[t]) + (lattice.emissions[t] + best_after).unsqueeze(2)
        torch.logical_or(structural, ~(through >= threshold), out=pruned[t])

    backward_scores(lattice, lambda t: structural, _max, mark)
    return pruned, best


def align(
    selected_log_probs: torch.Tensor,
    frame_offsets: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
    alignable: torch.Tensor,
    beam: Optional[float],
    need_occupancy: bool,
) -> AlignmentResult:
    """Per-utterance retained losses and (optionally) occupancies from S (M, K)."""
    device = selected_log_probs.device
    lattice = build_lattice(selected_log_probs, frame_offsets, frame_counts,
                            relabeled_targets, target_lengths)
    if beam is None:
        pruned, best = None, None
        mask_at = lambda t: lattice.invalid_arcs  # noqa: E731
    else:
        pruned, best = kept_arc_mask(lattice, beam)
        mask_at = pruned.__getitem__

    history = forward_scores(lattice, mask_at, _log_sum)
    total = _final_total(history, lattice, _log_sum)
    losses = -total
    finite = torch.isfinite(losses)
    empty_lattice = alignable & ~finite
    if best is not None:
        empty_lattice &= torch.isneginf(best)
    else:
        empty_lattice &= False
    nonfinite = alignable & ~finite & ~empty_lattice
    excluded = ~alignable | ~finite
    losses = torch.where(excluded, torch.zeros_like(losses), losses)

    occupancy = None
    if need_occupancy:
        log_total = torch.where(excluded, torch.zeros_like(total), total)

        def occupy(t: int, after: torch.Tensor) -> None:
            state_scores = history[t + 1, :, 2:]
            torch.exp(state_scores + after - log_total.unsqueeze(1), out=state_scores)

        backward_scores(lattice, mask_at, _log_sum, occupy)
        state_occupancy = history[1:, :, 2:].transpose(0, 1)  # (N, T, L)
        state_occupancy = state_occupancy.masked_fill(
            excluded.view(-1, 1, 1) | torch.isnan(state_occupancy), 0.0)
        max_frames = state_occupancy.shape[1]
        valid_frames = torch.arange(max_frames, device=device).unsqueeze(0) < frame_counts.unsqueeze(1)
        per_frame = state_occupancy[valid_frames]  # (M, L), rows in frame order
        labels = lattice.labels.unsqueeze(1).expand(-1, max_frames, -1)[valid_frames]
        occupancy = torch.zeros(per_frame.shape[0], selected_log_probs.shape[1],
                                dtype=torch.float64, device=device)
        occupancy.scatter_add_(1, labels, per_frame)
    return AlignmentResult(losses, occupancy, excluded, empty_lattice, nonfinite)
