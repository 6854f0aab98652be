"""Independent references for the CTC loss tests.

- ``dense_reference``: full logits in float64, log_softmax, torch's CTC in float64.
- ``enumerate_alignments``: every label sequence of length T over K classes, kept when it
  collapses to the target; scores, state paths and arcs computed from first principles,
  with the finite-beam retention rule applied literally.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| (Frobenius / Euclidean), paper App. B.2."""
    value = value.detach().to(torch.float64)
    reference = reference.detach().to(torch.float64)
    denominator = reference.norm().item()
    difference = (value - reference).norm().item()
    return difference / denominator if denominator > 0 else difference


def is_alignable(target: Sequence[int], frames: int) -> bool:
    repeats = sum(1 for a, b in zip(target, target[1:]) if a == b)
    return frames >= len(target) + repeats


def dense_reference(encoder_out, weight, bias, targets: list[list[int]], lengths,
                    blank_id: int = 0):
    """Per-utterance losses and gradients (d sum(losses) / d inputs) in float64.

    Unalignable utterances get loss 0 and zero gradient, as the library promises."""
    x = encoder_out.detach().to(torch.float64).requires_grad_(True)
    w = weight.detach().to(torch.float64).requires_grad_(True)
    b = None if bias is None else bias.detach().to(torch.float64).requires_grad_(True)
    logits = x @ w.t() + (0 if b is None else b)
    log_probs = logits.log_softmax(-1).transpose(0, 1)
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    keep = torch.tensor([is_alignable(t, int(n)) for t, n in zip(targets, lengths)])
    flat = torch.tensor([c for t in targets for c in t], dtype=torch.int64)
    target_lengths = torch.tensor([len(t) for t in targets], dtype=torch.int64)
    losses = F.ctc_loss(log_probs, flat, lengths, target_lengths, blank=blank_id,
                        reduction="none", zero_infinity=True)
    losses = torch.where(keep, losses, torch.zeros_like(losses))
    losses.sum().backward()
    return losses.detach(), x.grad, w.grad, (None if b is None else b.grad)


def collapse(labels: Sequence[int], blank: int = 0) -> list[int]:
    """The CTC collapse map: merge consecutive repeats, then drop blanks."""
    merged = [c for i, c in enumerate(labels) if i == 0 or c != labels[i - 1]]
    return [c for c in merged if c != blank]


def _state_path(labels: Sequence[int], target: Sequence[int]) -> Optional[list[int]]:
    """States of an alignment in the extended sequence (blank, y1, blank, ..., yU, blank),
    or None when the label sequence does not collapse to ``target`` (blank = 0)."""
    if collapse(labels) != list(target):
        return None
    states = []
    state = -1  # the virtual start, before state 0
    previous = None
    for label in labels:
        if label == 0:
            state = state + 1 if state % 2 == 1 or state == -1 else state
        elif label != previous:
            state = 1 if state == -1 else (state + 1 if state % 2 == 0 else state + 2)
        states.append(state)
        previous = label
    return states


def enumerate_alignments(scores: torch.Tensor, target: Sequence[int]):
    """All alignments of ``target`` (relabeled, blank 0) under emission scores (T, K).

    Returns a list of (labels, states, score)."""
    frames, classes = scores.shape
    result = []
    for labels in itertools.product(range(classes), repeat=frames):
        states = _state_path(labels, target)
        if states is None:
            continue
        score = sum(float(scores[t, c]) for t, c in enumerate(labels))
        result.append((labels, states, score))
    return result


def retained_by_beam(alignments, beam: Optional[float]):
    """The retention rule, literally: an arc (t, s_{t-1} -> s_t) is kept when the best
    complete alignment through it scores >= best - beam; an alignment is retained when
    all its arcs are kept."""
    if beam is None or not alignments:
        return list(alignments)
    best = max(score for _, _, score in alignments)
    best_through_arc: dict[tuple[int, int, int], float] = {}
    for _, states, score in alignments:
        for t, arc in enumerate(zip([-1] + states[:-1], states)):
            key = (t, arc[0], arc[1])
            best_through_arc[key] = max(best_through_arc.get(key, -math.inf), score)
    kept = {arc for arc, score in best_through_arc.items() if score >= best - beam}
    return [a for a in alignments
            if all((t, s0, s1) in kept
                   for t, (s0, s1) in enumerate(zip([-1] + a[1][:-1], a[1])))]


def brute_force_loss_and_occupancy(scores: torch.Tensor, target: Sequence[int],
                                   beam: Optional[float]):
    """(loss, occupancy (T, K)) over the retained alignments; loss = inf if none."""
    frames, classes = scores.shape
    retained = retained_by_beam(enumerate_alignments(scores, target), beam)
    occupancy = torch.zeros(frames, classes, dtype=torch.float64)
    finite = [a for a in retained if a[2] > -math.inf]
    if not finite:
        return math.inf, occupancy, retained
    total = torch.logsumexp(torch.tensor([a[2] for a in finite], dtype=torch.float64), 0)
    for labels, _, score in finite:
        weight = math.exp(score - float(total))
        for t, c in enumerate(labels):
            occupancy[t, c] += weight
    return -float(total), occupancy, retained
