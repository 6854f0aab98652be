"""CTC forced alignment: the single most probable CTC path of a known token sequence
(Viterbi over the blank-extended labels of the CTC lattice, Sec. 3's alignments), and the
frames each token of that path occupies. Used to place reference words in time
(``local/chunk_boundary_errors.py``).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor


def ctc_forced_alignment(log_probs: Tensor, tokens: Sequence[int], blank_id: int = 0) -> List[int]:
    """One label per frame (``blank_id`` or a token) of the most probable path through
    ``log_probs`` (T, V) whose CTC collapse is ``tokens``, computed in float64.

    Raises:
        ValueError: ``log_probs`` is not 2-D, a token is out of range or is ``blank_id``, or
            T is shorter than the tokens need (one frame each, one more between repeats).
    """
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be (T, V), got shape {tuple(log_probs.shape)}")
    num_frames, vocab = log_probs.shape
    tokens = [int(t) for t in tokens]
    bad = [t for t in tokens if not 0 <= t < vocab or t == blank_id]
    if bad:
        raise ValueError(f"tokens must be in [0, {vocab}) and not the blank {blank_id}, got {bad[0]}")
    repeats = sum(a == b for a, b in zip(tokens, tokens[1:]))
    if num_frames < len(tokens) + repeats:
        raise ValueError(f"{len(tokens)} tokens ({repeats} repeats) need at least {len(tokens) + repeats} "
                         f"frames, log_probs has {num_frames}")
    if num_frames == 0:
        return []
    labels = [blank_id]
    for token in tokens:
        labels += [token, blank_id]
    states = len(labels)
    label_index = torch.tensor(labels)
    scores = log_probs.detach().to(torch.float64).cpu()[:, label_index]  # (T, S)
    # A state may come from itself, from the one before, or skip a blank between two
    # different tokens.
    skip = torch.zeros(states, dtype=torch.bool)
    for s in range(2, states):
        skip[s] = labels[s] != blank_id and labels[s] != labels[s - 2]
    minus_inf = torch.tensor(float("-inf"), dtype=torch.float64)
    alpha = torch.full((states,), float("-inf"), dtype=torch.float64)
    alpha[0] = scores[0, 0]
    if states > 1:
        alpha[1] = scores[0, 1]
    back = torch.zeros(num_frames, states, dtype=torch.long)
    for t in range(1, num_frames):
        step = torch.full_like(alpha, float("-inf"))
        step[1:] = alpha[:-1]
        jump = torch.full_like(alpha, float("-inf"))
        jump[2:] = alpha[:-2]
        jump = torch.where(skip, jump, minus_inf)
        candidates = torch.stack([alpha, step, jump])  # (3, S): stay, step, skip a blank
        best, choice = candidates.max(dim=0)
        back[t] = choice
        alpha = best + scores[t]
    ends = [states - 1] + ([states - 2] if states > 1 else [])
    state = max(ends, key=lambda s: (float(alpha[s]), s))
    if float(alpha[state]) == float("-inf"):
        raise ValueError("no CTC path of the tokens has a finite score in log_probs")
    path = [0] * num_frames
    for t in range(num_frames - 1, -1, -1):
        path[t] = labels[state]
        state -= int(back[t, state])
    return path


def token_frames(path: Sequence[int], blank_id: int = 0) -> List[Tuple[int, int]]:
    """(first frame, last frame) of each token of a CTC path, in order: a run of one
    non-blank label is one token (the same label again after a blank is the next)."""
    spans: List[Tuple[int, int]] = []
    previous = blank_id
    for t, label in enumerate(path):
        if label != blank_id and label == previous:
            spans[-1] = (spans[-1][0], t)
        elif label != blank_id:
            spans.append((t, t))
        previous = label
    return spans
