"""The CTC alignment lattice on the K selected columns: exact and finite-beam.

States s = 0..2U_n of utterance n walk the extended label sequence
(blank, y1, blank, ..., yU, blank). An alignment is a state sequence s_1..s_T that starts
in {0, 1}, ends in {2U-1, 2U} and moves by +0, +1 or +2 (the +2 skip only onto a label
that differs from the label two back). An arc (t, s_{t-1} -> s_t) emits the label of s_t
at frame t; the first frame's arcs leave a virtual start that sits in state 0.

Finite beam (paper Sec. 3.3, App. B.3, the semantics of k2's dense intersection with
``output_beam``): an arc is kept when the best complete alignment through it scores
within ``beam`` of the best alignment, i.e. F[t-1, s'] + e[t, s] + B[t, s] >= best - beam
with max-semiring forward scores F and backward scores B. The loss is minus the
log-semiring total over alignments made only of kept arcs (these may recombine into
alignments below best - beam), and the gradient is minus the occupancy over them.

Every pass runs forward over the N lattices and their N reversals at once (2N
utterances): a backward quantity of a lattice is a forward quantity of its reversal.
Passes (all FP64, vectorized over utterances and states, one frame at a time; see
semirings.py for the per-frame recursions):
1. max-plus forward in the log domain (no transcendental functions): the best score,
   the kept arcs of both halves, and the support (states on some retained alignment);
2. sum-product forward in the probability domain with per-frame rescaling over the kept
   arcs; the support tells exactly whether rescaling underflowed (a supported state
   whose scaled score is 0), in which case the sums are redone in the log domain.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from .semirings import LOG_MAX, LOG_SUM, SCALED_SUM, Semiring

# Arc kinds, the first axis of arc masks: stay in s, come from s - 1, skip from s - 2.
NUM_ARC_KINDS = 3


@dataclass
class Lattice:
    """The CTC lattices of a batch (N utterances, L = 2 max_n U_n + 1 states).

    emissions: (T, N, L) float64, e[t, n, s] = S[row of frame t of n, class of state s];
        -inf on states beyond 2U_n, 0 on frames beyond T_n.
    rows: (T, N) int64, the row of S holding frame t of utterance n (beyond T_n, its last).
    labels: (N, L) int64, the selected-class index of every state (0 = blank).
    forbidden_skips: (N, L) bool, skips into s from s - 2 that the CTC topology forbids.
        The topology's other forbidden arcs (into states 0 and 1 from before state 0)
        read the two padding columns of a history, which hold the semiring's zero.
    final_states: (N, L) bool.
    frame_counts, target_lengths: (N,) int64.
    """

    emissions: torch.Tensor
    rows: torch.Tensor
    labels: torch.Tensor
    forbidden_skips: torch.Tensor
    final_states: torch.Tensor
    frame_counts: torch.Tensor
    target_lengths: torch.Tensor

    @property
    def valid_frames(self) -> torch.Tensor:
        """(T, N) bool, t < T_n."""
        max_frames = self.emissions.shape[0]
        frames = torch.arange(max_frames, device=self.emissions.device).unsqueeze(1)
        return frames < self.frame_counts.unsqueeze(0)


def build_lattice_and_reversal(
    selected_log_probs: torch.Tensor,
    frame_offsets: torch.Tensor,
    frame_counts: torch.Tensor,
    relabeled_targets: torch.Tensor,
    target_lengths: torch.Tensor,
) -> Lattice:
    """The N lattices followed by their N reversals (2N utterances), emissions from S (M, K).

    Reversing the frames and the target of an utterance reverses its lattice: state s at
    frame t becomes state 2U_n - s at frame T_n - 1 - t, and every backward quantity of
    the original is a forward quantity of the reversal. One forward pass over both halves
    thus gives forward and backward scores with half the number of tensor operations.
    """
    device = selected_log_probs.device
    num_utterances, max_length = relabeled_targets.shape
    num_states = 2 * max_length + 1
    max_frames = int(frame_counts.max())
    frames = torch.arange(max_frames, device=device).unsqueeze(1)  # (T, 1)
    last = frame_counts.unsqueeze(0) - 1
    rows = frame_offsets.unsqueeze(0) + torch.minimum(frames, last)
    reversed_rows = frame_offsets.unsqueeze(0) + (last - frames).clamp(min=0)

    positions = torch.arange(max_length, device=device).unsqueeze(0)
    source = (target_lengths.unsqueeze(1) - 1 - positions).clamp(min=0)
    reversed_targets = relabeled_targets.gather(1, source)
    reversed_targets.masked_fill_(positions >= target_lengths.unsqueeze(1), 0)
    frame_counts = torch.cat([frame_counts, frame_counts])
    target_lengths = torch.cat([target_lengths, target_lengths])

    labels = torch.zeros(2 * num_utterances, num_states, dtype=torch.int64, device=device)
    labels[:, 1::2] = torch.cat([relabeled_targets, reversed_targets])
    state_index = torch.arange(num_states, device=device)
    valid_states = state_index.unsqueeze(0) < (2 * target_lengths + 1).unsqueeze(1)
    valid_frames = frames < frame_counts.unsqueeze(0)  # (T, 2N)

    # Row-wise gathers are several times faster than flat or 2-D advanced indexing on
    # CPU: from every row of S, the classes of both lattices' states of its utterance
    # (rows of S outside every utterance read utterance 0's), then the rows in
    # (frame, utterance) order: row 2m of `both` is m's original, 2m + 1 its reversal.
    utterance_of_row = torch.zeros(selected_log_probs.shape[0], dtype=torch.int64,
                                   device=device).scatter_(
        0, rows.reshape(-1), torch.arange(num_utterances, device=device).repeat(max_frames))
    labels_of_utterance = labels.view(2, num_utterances, num_states).transpose(0, 1)
    both = selected_log_probs.gather(
        1, labels_of_utterance.reshape(num_utterances, 2 * num_states)[utterance_of_row])
    both = both.to(torch.float64).view(-1, num_states)
    source_rows = torch.cat([2 * rows, 2 * reversed_rows + 1], dim=1)
    emissions = both.index_select(0, source_rows.view(-1)).view(
        max_frames, 2 * num_utterances, num_states)
    emissions.masked_fill_(~valid_frames.unsqueeze(2), 0.0)
    emissions.masked_fill_(~valid_states.unsqueeze(0), float("-inf"))

    forbidden_skips = torch.ones(2 * num_utterances, num_states, dtype=torch.bool,
                                 device=device)
    if num_states > 2:
        forbidden_skips[:, 2:] = (labels[:, 2:] == 0) | (labels[:, 2:] == labels[:, :-2])

    last_state = 2 * target_lengths
    final_states = (state_index.unsqueeze(0) == last_state.unsqueeze(1)) | (
        (state_index.unsqueeze(0) == (last_state - 1).unsqueeze(1)) & (last_state > 0).unsqueeze(1)
    )
    return Lattice(emissions, torch.cat([rows, reversed_rows], dim=1), labels,
                   forbidden_skips, final_states, frame_counts, target_lengths)


def partner_positions(lattice: Lattice) -> tuple[torch.Tensor, torch.Tensor]:
    """Where e[t, s] + B[t, s] of each utterance n sits in a forward history
    (T + 1, 2N, L + 2) of the lattices and their reversals: in the partner (n's reversal,
    or the original of a reversal) at frame T_n - 1 - t, state 2U_n - s. Returns the
    history rows (T, 2N) of the flattened (T + 1) x 2N rows and the columns (2N, L)."""
    max_frames, double_utterances, num_states = lattice.emissions.shape
    device = lattice.emissions.device
    frames = torch.arange(max_frames, device=device).unsqueeze(1)
    history_frame = (lattice.frame_counts.unsqueeze(0) - frames).clamp(1, max_frames)
    partners = torch.arange(double_utterances, device=device).roll(double_utterances // 2)
    states = torch.arange(num_states, device=device).unsqueeze(0)
    columns = (2 * lattice.target_lengths.unsqueeze(1) + 2 - states).clamp(2, num_states + 1)
    return history_frame * double_utterances + partners, columns


def partner_scores(history: torch.Tensor, positions: tuple[torch.Tensor, torch.Tensor],
                   utterances: slice) -> torch.Tensor:
    """(T, n, L) e + B of the selected utterances from a contiguous forward history of all
    2N (meaningless beyond T_n or 2U_n)."""
    rows, columns = positions[0][:, utterances], positions[1][utterances]
    max_frames, num_selected = rows.shape
    padded_states = history.shape[2]
    selected_rows = history.view(-1, padded_states).index_select(0, rows.reshape(-1))
    return selected_rows.view(max_frames, num_selected, padded_states).gather(
        2, columns.unsqueeze(0).expand(max_frames, -1, -1))


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


def forward_pass(semiring: Semiring, emissions: torch.Tensor, forbidden_skips: torch.Tensor,
                 kept_arcs: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward scores of every state at every frame.

    Args:
        emissions: (T, N, L) in the semiring's domain.
        forbidden_skips: (N, L) bool, the topology's forbidden skips.
        kept_arcs: (3, T, N, L) bool, the arcs into each frame that are kept (already
            without forbidden ones), or None for every arc of the topology.
    Returns:
        history (T + 1, N, L + 2): ``history[t + 1, :, 2:]`` is the (scaled) score of
        reaching each state at frame t with its emission; ``history[0]`` is the virtual
        start; two leading padding columns.
        log_scales (T, N) float64: log of the factor each frame was divided by.
    """
    max_frames, num_utterances, num_states = emissions.shape
    shape = (max_frames + 1, num_utterances, num_states + 2)
    history = out if out is not None else emissions.new_empty(shape)
    # Rows 1..T of the states are all written by the recursion.
    history[:, :, :2].fill_(semiring.zero)
    history[0].fill_(semiring.zero)
    history[0, :, 2] = semiring.one
    if kept_arcs is None:
        skip = emissions.masked_fill(forbidden_skips, semiring.zero)
        weights = (emissions, emissions, skip)
    else:
        weights = torch.where(kept_arcs, emissions, semiring.zero).unbind(0)
    log_scales = semiring.recurse(history, *weights)
    return history, log_scales


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


def _kept_arcs(best_history: torch.Tensor, best_after: torch.Tensor,
               forbidden_skips: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Kept arcs (3, T, 2N, L) bool: F[t-1, s-k] + e[t, s] + B[t, s] >= best - beam, for
    the lattices and their reversals alike.

    best_history: (T + 1, 2N, L + 2) max-plus forward history; best_after: (T, 2N, L),
    e[t, s] + B[t, s] (the best way to finish from state s, frame t included);
    threshold: (2N,), best - beam of each original for itself and its reversal.

    A reversed arc's test adds the same two numbers as its original's (the reversal's F
    is the original's e + B and vice versa), so the halves keep exactly mirrored arcs.
    Arcs from the padding columns (-inf sums) fail the test unless the threshold is -inf
    (an empty lattice), where their sources keep the sums at zero anyway; NaN sums always
    fail it, and forbidden skips are given NaN."""
    max_frames, _, num_states = best_after.shape
    threshold = threshold.view(1, -1, 1)
    kept = torch.empty((NUM_ARC_KINDS,) + tuple(best_after.shape), dtype=torch.bool,
                       device=best_after.device)
    through = torch.empty_like(best_after)
    skip_after = best_after.masked_fill(forbidden_skips, float("nan"))
    for kind, after in enumerate((best_after, best_after, skip_after)):
        source = best_history[:max_frames, :, 2 - kind:2 - kind + num_states]
        torch.add(source, after, out=through)
        torch.ge(through, threshold, out=kept[kind])
    return kept


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
    occupancy_dtype: Optional[torch.dtype] = None,
) -> AlignmentResult:
    """Per-utterance retained losses and (optionally) occupancies from S (M, K), the
    latter in ``occupancy_dtype`` (default: S's)."""
    with _one_cpu_thread(selected_log_probs.device):
        return _align(selected_log_probs, frame_offsets, frame_counts, relabeled_targets,
                      target_lengths, alignable, beam, need_occupancy, force_log_domain,
                      occupancy_dtype or selected_log_probs.dtype)


def _align(selected_log_probs, frame_offsets, frame_counts, relabeled_targets,
           target_lengths, alignable, beam, need_occupancy, force_log_domain,
           occupancy_dtype):
    num_utterances = frame_counts.numel()
    original = slice(0, num_utterances)
    lattice = build_lattice_and_reversal(selected_log_probs, frame_offsets, frame_counts,
                                         relabeled_targets, target_lengths)
    valid_frames = lattice.valid_frames[:, original]
    positions = partner_positions(lattice)

    # Max-plus over both halves: forward scores F and, through the partners, e + B.
    best_history, _ = forward_pass(LOG_MAX, lattice.emissions, lattice.forbidden_skips)
    best = _final_total(LOG_MAX, best_history, best_history.new_zeros(valid_frames.shape),
                        lattice, original)
    best_after = partner_scores(best_history, positions, slice(None))
    if beam is None:
        kept = None
        support = (torch.isfinite(best_history[1:, original, 2:])
                   & torch.isfinite(best_after[:, original]))
    else:
        kept = _kept_arcs(best_history, best_after, lattice.forbidden_skips,
                          (best - beam).repeat(2))
        support = kept[0, :, original] | kept[1, :, original]
        support |= kept[2, :, original]
    support &= valid_frames.unsqueeze(2)
    del best_after

    # Sum-product over the retained arcs; the reversal is needed only for occupancies.
    halves = slice(None) if need_occupancy else original
    semiring = LOG_SUM if force_log_domain else SCALED_SUM
    while True:
        emissions, shift = semiring.from_log_emissions(lattice.emissions[:, halves])
        history, log_scales = forward_pass(
            semiring, emissions, lattice.forbidden_skips[halves],
            None if kept is None else kept[:, :, halves], out=best_history[:, halves])
        if shift is not None:
            log_scales = log_scales + shift
        forward = history[1:, original, 2:]
        after = partner_scores(history, positions, original) if need_occupancy else None
        if semiring is LOG_SUM:
            break
        # Scaling underflowed where a state on a retained alignment scores exactly zero.
        lowest = forward if after is None else torch.minimum(forward, after)
        if not bool(((lowest <= SCALED_SUM.tiny) & support).any()):
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
        contributes = valid_frames & ~excluded.unsqueeze(0)
        state_occupancy = semiring.posterior(forward, after, emissions[:, original],
                                             contributes)
        # (M, K) in S's dtype, the gradient dL/dS is formed in it; frames beyond T_n and
        # excluded utterances add zeros.
        num_classes = selected_log_probs.shape[1]
        index = lattice.rows[:, original].unsqueeze(2) * num_classes + lattice.labels[original]
        occupancy = torch.zeros(selected_log_probs.shape, dtype=occupancy_dtype,
                                device=selected_log_probs.device)
        occupancy.view(-1).scatter_add_(0, index.view(-1),
                                        state_occupancy.to(occupancy_dtype).view(-1))
    return AlignmentResult(losses, occupancy, excluded, empty_lattice, nonfinite,
                           used_log_domain=semiring is LOG_SUM)
