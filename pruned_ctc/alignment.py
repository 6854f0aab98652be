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

import contextlib
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
    rows: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
) -> Lattice:
    """Gathers the emissions of every (frame, state) pair from S (M, K).

    rows: (T, N) int64, the row of S holding frame t of utterance n (any row beyond T_n).
    """
    device = selected_log_probs.device
    num_utterances, max_length = relabeled_targets.shape
    num_states = 2 * max_length + 1

    labels = torch.zeros(num_utterances, num_states, dtype=torch.int64, device=device)
    labels[:, 1::2] = relabeled_targets
    state_index = torch.arange(num_states, device=device)
    valid_states = state_index.unsqueeze(0) < (2 * target_lengths + 1).unsqueeze(1)

    frame_index = torch.arange(rows.shape[0], device=device).unsqueeze(1)  # (T, 1)
    valid_frames = frame_index < frame_counts.unsqueeze(0)  # (T, N)
    # torch.take on flat indices is several times faster than 2-D advanced indexing on CPU.
    flat_index = rows.unsqueeze(2) * selected_log_probs.shape[1] + labels.unsqueeze(0)
    emissions = torch.take(selected_log_probs, flat_index).to(torch.float64)
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


def build_lattice_and_reversal(
    selected_log_probs: torch.Tensor,
    frame_offsets: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
) -> Lattice:
    """The N lattices followed by their N reversals (2N utterances).

    Reversing the frames and the target of an utterance reverses its lattice: state s at
    frame t becomes state 2U_n - s at frame T_n - 1 - t, and every backward quantity of
    the original is a forward quantity of the reversal. One forward pass over both halves
    thus gives forward and backward scores with half the number of tensor operations.
    """
    device = selected_log_probs.device
    max_frames = int(frame_counts.max())
    frames = torch.arange(max_frames, device=device).unsqueeze(1)  # (T, 1)
    last = frame_counts.unsqueeze(0) - 1
    rows = frame_offsets.unsqueeze(0) + torch.minimum(frames, last)
    reversed_rows = frame_offsets.unsqueeze(0) + (last - frames).clamp(min=0)

    positions = torch.arange(relabeled_targets.shape[1], device=device).unsqueeze(0)
    source = (target_lengths.unsqueeze(1) - 1 - positions).clamp(min=0)
    reversed_targets = relabeled_targets.gather(1, source)
    reversed_targets.masked_fill_(positions >= target_lengths.unsqueeze(1), 0)

    return build_lattice(
        selected_log_probs, torch.cat([rows, reversed_rows], dim=1),
        torch.cat([frame_counts, frame_counts]),
        torch.cat([relabeled_targets, reversed_targets]),
        torch.cat([target_lengths, target_lengths]))


def unreverse_states(history: torch.Tensor, frame_counts: torch.Tensor,
                     target_lengths: torch.Tensor) -> torch.Tensor:
    """Forward history (T + 1, 2N, L + 2) of the lattices and their reversals -> (T, N, L)
    of the reversals indexed by the original frames and states: value[t, n, s] = reversed
    score at frame T_n - 1 - t, state 2U_n - s (meaningless beyond T_n or 2U_n)."""
    history_rows, double_utterances, padded_states = history.shape
    max_frames, num_states = history_rows - 1, padded_states - 2
    num_utterances = frame_counts.numel()
    device = history.device
    frames = torch.arange(max_frames, device=device).unsqueeze(1)
    frame_index = (frame_counts.unsqueeze(0) - frames).clamp(1, max_frames)  # history row
    states = torch.arange(num_states, device=device).unsqueeze(0)
    state_index = (2 * target_lengths.unsqueeze(1) + 2 - states).clamp(2, num_states + 1)
    utterance_index = torch.arange(num_utterances, num_utterances * 2, device=device)
    flat_index = ((frame_index * double_utterances + utterance_index).unsqueeze(2) * padded_states
                  + state_index.unsqueeze(0))
    return torch.take(history, flat_index)


def reverse_arcs(pruned: torch.Tensor, reversed_structure: torch.Tensor,
                 frame_counts: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Pruned-arc masks (T, N, L, 3) of the original lattices -> those of the reversals.

    The reversed arc into state r from r - k at reversed frame tau is the original arc
    into 2U_n - r + k at frame T_n - tau; arcs at tau = 0 leave the virtual start (the
    original's virtual end) and are all allowed."""
    max_frames, num_utterances, num_states, _ = pruned.shape
    device = pruned.device
    frames = torch.arange(max_frames, device=device).unsqueeze(1)
    frame_index = (frame_counts.unsqueeze(0) - frames).clamp(0, max_frames - 1)  # (T, N)
    kinds = torch.arange(NUM_ARC_KINDS, device=device).view(1, 1, -1)
    states = torch.arange(num_states, device=device).view(1, -1, 1)
    state_index = (2 * target_lengths.view(-1, 1, 1) - states + kinds).clamp(0, num_states - 1)
    utterances = torch.arange(num_utterances, device=device).view(1, -1, 1, 1)
    flat_index = (((frame_index.view(max_frames, num_utterances, 1, 1) * num_utterances
                    + utterances) * num_states + state_index.unsqueeze(0)) * NUM_ARC_KINDS
                  + kinds.unsqueeze(0))
    result = torch.take(pruned, flat_index)
    result[0] = False
    return result | reversed_structure


def _incoming(previous: torch.Tensor) -> torch.Tensor:
    """(..., L + 2) scores with two leading padding columns -> (..., L, 3) arc sources."""
    return torch.stack((previous[..., 2:], previous[..., 1:-1], previous[..., :-2]), dim=-1)


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device):
    """The DP's tensors are small: on CPU, intra-op threads only add barriers, and when
    another process holds a core each barrier waits for a descheduled thread (measured
    10-15x slower with 2 threads than with 1 on a loaded 2-core machine)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
        semiring.step(candidates, emissions[t], out=history[t + 1, :, 2:], scales=scales[t])
    return history, semiring.log_of_scales(scales)


def _final_total(semiring: Semiring, history: torch.Tensor, log_scales: torch.Tensor,
                 lattice: Lattice, utterances: slice) -> torch.Tensor:
    """Log total of the selected utterances' lattices: final states at their last frame.

    history and log_scales may cover all of the lattice's utterances or just these."""
    frame_counts = lattice.frame_counts[utterances]
    if history.shape[1] != frame_counts.numel():
        history, log_scales = history[:, utterances], log_scales[:, utterances]
    index = torch.arange(frame_counts.numel(), device=history.device)
    at_end = history[frame_counts, index, 2:]
    total = semiring.to_log(semiring.plus_all(at_end.masked_fill(
        ~lattice.final_states[utterances], semiring.zero)))
    cumulative = log_scales.masked_fill(~lattice.valid_frames[:, utterances], 0.0).sum(dim=0)
    return total + cumulative


def _kept_arcs(best_forward: torch.Tensor, best_after: torch.Tensor,
               invalid_arcs: torch.Tensor, best: torch.Tensor, beam: float) -> torch.Tensor:
    """Pruned arcs (T, N, L, 3) bool: F[t-1, s-k] + e[t, s] + B[t, s] < best - beam.

    best_forward: (T + 1, N, L + 2) max-plus forward history; best_after: (T, N, L),
    e[t, s] + B[t, s] (the best way to finish from state s, frame t included)."""
    max_frames = best_after.shape[0]
    threshold = (best - beam).view(1, -1, 1, 1)
    pruned = torch.empty((max_frames,) + tuple(invalid_arcs.shape), dtype=torch.bool,
                         device=best_after.device)
    for start in range(0, max_frames, FRAMES_PER_BLOCK):
        stop = min(start + FRAMES_PER_BLOCK, max_frames)
        through = _incoming(best_forward[start:stop]) + best_after[start:stop].unsqueeze(3)
        torch.logical_or(invalid_arcs, ~(through >= threshold), out=pruned[start:stop])
    return pruned


@dataclass
class AlignmentResult:
    """losses: (N,) float64, minus the retained total log-likelihood (0 where excluded).
    occupancy: (M, K) in S's dtype or None, posterior occupancy of each selected class at
        each frame over the retained alignments (0 on excluded utterances).
    excluded: (N,) bool. empty_lattice, nonfinite: (N,) bool, why (among alignable ones).
    used_log_domain: whether the sums were computed in the log domain (underflow fallback).
    """

    losses: torch.Tensor
    occupancy: Optional[torch.Tensor]
    excluded: torch.Tensor
    empty_lattice: torch.Tensor
    nonfinite: torch.Tensor
    used_log_domain: bool = False


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
    with _one_cpu_thread(selected_log_probs.device):
        return _align(selected_log_probs, frame_offsets, frame_counts, relabeled_targets,
                      target_lengths, alignable, beam, need_occupancy, force_log_domain)


def _align(selected_log_probs, frame_offsets, frame_counts, relabeled_targets,
           target_lengths, alignable, beam, need_occupancy, force_log_domain):
    num_utterances = frame_counts.numel()
    original = slice(0, num_utterances)
    reversal = slice(num_utterances, 2 * num_utterances)
    lattice = build_lattice_and_reversal(selected_log_probs, frame_offsets, frame_counts,
                                         relabeled_targets, target_lengths)
    structure = lattice.invalid_arcs
    valid_frames = lattice.valid_frames[:, original]

    # Max-plus over both halves: forward scores F and, from the reversal, e + B.
    best_history, _ = forward_pass(LOG_MAX, lattice.emissions, lambda t: structure)
    best = _final_total(LOG_MAX, best_history, best_history.new_zeros(valid_frames.shape),
                        lattice, original)
    best_after = unreverse_states(best_history, frame_counts, target_lengths)
    if beam is None:
        mask_at = lambda t: structure  # noqa: E731
        support = torch.isfinite(best_history[1:, original, 2:]) & torch.isfinite(best_after)
    else:
        pruned = _kept_arcs(best_history[:, original], best_after, structure[original], best,
                            beam)
        support = ~pruned.all(dim=3)
        pruned = torch.cat([pruned, reverse_arcs(pruned, structure[reversal], frame_counts,
                                                 target_lengths)], dim=1)
        mask_at = pruned.__getitem__
    support &= valid_frames.unsqueeze(2)
    del best_after

    # Sum-product over the retained arcs; the reversal is needed only for occupancies.
    halves = slice(None) if need_occupancy else original
    semiring = LOG_SUM if force_log_domain else SCALED_SUM
    while True:
        emissions, shift = semiring.from_log_emissions(lattice.emissions[:, halves])
        history, log_scales = forward_pass(semiring, emissions, lambda t: mask_at(t)[halves],
                                           out=best_history[:, halves])
        if shift is not None:
            log_scales = log_scales + shift
        after = (unreverse_states(history, frame_counts, target_lengths)
                 if need_occupancy else None)
        if semiring is LOG_SUM:
            break
        # Scaling underflowed where a state on a retained alignment scores exactly zero.
        underflow = history[1:, original, 2:] <= SCALED_SUM.tiny
        if after is not None:
            underflow |= after <= SCALED_SUM.tiny
        if not bool((underflow & support).any()):
            break
        semiring = LOG_SUM

    total = _final_total(semiring, history, log_scales, lattice, original)
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
        state_occupancy = semiring.posterior(history[1:, original, 2:], after,
                                             emissions[:, original])
        state_occupancy = state_occupancy.transpose(0, 1)  # (N, T, L)
        state_occupancy = state_occupancy.masked_fill(
            excluded.view(-1, 1, 1) | torch.isnan(state_occupancy), 0.0)
        valid = valid_frames.t()
        # (M, L), rows in frame order, in S's dtype: the gradient dL/dS is formed in it.
        per_frame = state_occupancy[valid].to(selected_log_probs.dtype)
        labels = lattice.labels[original].unsqueeze(1).expand(-1, valid.shape[1], -1)[valid]
        occupancy = torch.zeros(per_frame.shape[0], selected_log_probs.shape[1],
                                dtype=per_frame.dtype, device=selected_log_probs.device)
        occupancy.scatter_add_(1, labels, per_frame)
    return AlignmentResult(losses, occupancy, excluded, empty_lattice, nonfinite,
                           used_log_domain=semiring is LOG_SUM)
