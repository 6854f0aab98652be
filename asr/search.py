"""CTC search on batches of full-vocabulary log-probabilities: greedy and prefix beam.

Both functions take ``log_probs`` of shape (N, T, V) (log-softmax outputs of the CTC
head, any float dtype, any device) and ``lengths`` of shape (N,) (valid frames per
utterance), and return one list of token ids per utterance, blanks removed and
repeats collapsed (the CTC collapse B of the paper, Section 2).

Prefix beam search
------------------
A hypothesis is a label prefix with two scores, the log-probability of all alignments
of the frames seen so far that collapse to the prefix and end in blank
(``log_p_blank``) or in the prefix's last token (``log_p_token``). Per frame, every
hypothesis of the beam is (a) kept with the same prefix (a blank, or a repeat of its
last token) and (b) extended by one token; equal prefixes are merged by adding their
probabilities; the ``beam`` best prefixes survive. Ranking score = log P(prefix) +
``token_penalty`` * len(prefix), so a positive ``token_penalty`` is a per-token bonus
that lengthens the output and a negative one shortens it (the paper's LLM-CTC runs
use 0.3 and 0.7).

Blank penalty
-------------
Both searches take ``blank_penalty`` (icefall's ``--blank-penalty``): subtracted from
the blank's log-probability at every frame before the search (no renormalization), so a
positive value lets a token that falls just short of blank at its frames be emitted.
Greedy search then takes each frame's argmax of the penalized scores; prefix beam search
scores every blank step with it.

The search is compiled with numba (``_search_utterance``): a frame of one utterance
is one pass over its V log-probabilities (to find the most probable tokens) plus
about beam * (beam + 1) scalar candidates, so the cost no longer has the fixed
per-frame overhead of launching tensor operations that a vectorized search pays
(measured in benchmarks/decoding: decoding one utterance at a time is about as fast
per frame as decoding 64 at once). The log-probabilities are read on the CPU in their
own precision (float32 or float64; other dtypes are converted to float32) and all
scores are accumulated in float64. Equal prefixes are found without comparing token
sequences: each hypothesis carries a 64-bit polynomial hash of its prefix and of its
parent prefix (the prefix minus its last token). (Two different prefixes would have
to collide modulo 2**64 while sharing one utterance's beam in the same frame for this
to go wrong.) Token sequences are recovered at the end from per-frame back-pointers.

What is pruned per frame, and why it does not change the result: an extension
h + c (token c appended to hypothesis h) is computed only for the K = beam + 1 most
probable non-blank tokens c of the frame. The two other kinds of contributions are
always computed exactly: staying on a prefix (blank or repeat of its last token,
whatever their probability) and extending a beam member h into a prefix g = h + c
that is already in the beam (whatever the probability of c). So every candidate
that is already in the beam gets its exact score, and only *new* prefixes h + c
with c outside the top K are never scored. Such a prefix cannot reach the top
``beam``: every top-K token c' != last(h) (at least K - 1 = beam of them) gives a
distinct candidate h + c' of the same length whose score is at least
log P(h) + log p(c') >= log P(h) + log p(c) >= score(h + c) (if h + c' is already
in the beam its merged score is larger still). Hence the pruned search returns the
same beam as one that expands every vocabulary token, up to the order of exactly
tied scores. This is also why the result equals the exact maximum of P(labels)
(brute-force sum over alignments) when ``beam`` exceeds the number of distinct
prefixes. No other pruning is applied: no log-probability cutoff on tokens, no
pruning of hypotheses by score distance and no skipping of blank frames (unlike
pyctcdecode's defaults, ``token_min_logp=-5`` and ``beam_prune_logp=-10``), so
speed costs no accuracy. (A search that only expands the top tokens of a frame
*including* blank and the repeated token, as icefall's does, drops the blank and
repeat paths whenever they fall outside that top; here they are always kept.)
"""

from __future__ import annotations

import math
from typing import List, NamedTuple

import numba
import numpy as np
import torch

__all__ = ["Hypothesis", "ctc_collapse", "ctc_greedy_search", "ctc_prefix_beam_search"]

_NO_TOKEN = -1
# Odd 64-bit multiplier (2**64 / golden ratio) of the prefix hash
# h(prefix + c) = h(prefix) * M + c + 1, wrapping modulo 2**64; h(empty prefix) = 0.
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class Hypothesis(NamedTuple):
    """One entry of an n-best list.

    ``score`` is the ranking score, ``log_prob + token_penalty * len(tokens)``;
    ``log_prob`` is the total log-probability of the label sequence over the alignments
    the search kept.
    """

    tokens: List[int]
    score: float
    log_prob: float


def _check_inputs(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> None:
    if not isinstance(log_probs, torch.Tensor):
        raise TypeError(f"log_probs must be a torch.Tensor, got {type(log_probs).__name__}")
    if log_probs.dim() != 3:
        raise ValueError(f"log_probs must have shape (N, T, V), got shape {tuple(log_probs.shape)}")
    if not log_probs.is_floating_point():
        raise TypeError(f"log_probs must be a floating tensor, got dtype {log_probs.dtype}")
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dim() != 1 or lengths.numel() != log_probs.size(0):
        raise ValueError(
            f"lengths must have shape (N,) = ({log_probs.size(0)},), got shape {tuple(lengths.shape)}"
        )
    if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
    if lengths.numel() > 0 and (int(lengths.min()) < 0 or int(lengths.max()) > log_probs.size(1)):
        raise ValueError(
            f"lengths must lie in [0, T={log_probs.size(1)}], got min {int(lengths.min())}, "
            f"max {int(lengths.max())}"
        )
    if isinstance(blank_id, bool) or not isinstance(blank_id, int):
        raise TypeError(f"blank_id must be an int, got {blank_id!r}")
    if not 0 <= blank_id < log_probs.size(2):
        raise ValueError(f"blank_id must lie in [0, V={log_probs.size(2)}), got {blank_id}")


def ctc_greedy_search(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int = 0, blank_penalty: float = 0.0
) -> List[List[int]]:
    """Best token per frame, then collapse repeats and drop blanks.

    Args:
      log_probs: (N, T, V) log-probabilities (or any scores: only the argmax matters).
      lengths: (N,) number of valid frames of each utterance, in [0, T].
      blank_id: index of the CTC blank in [0, V).
      blank_penalty: subtracted from the blank's score at every frame before the argmax.
    Returns:
      N lists of token ids.
    """
    _check_inputs(log_probs, lengths, blank_id)
    _check_penalty("blank_penalty", blank_penalty)
    return ctc_collapse(penalized_argmax(log_probs, blank_id, blank_penalty), lengths, blank_id=blank_id)


def penalized_argmax(scores: torch.Tensor, blank_id: int, blank_penalty: float = 0.0) -> torch.Tensor:
    """Argmax over the last axis of ``scores`` (..., V) after ``blank_penalty`` is
    subtracted from the blank's score, without a modified copy of ``scores`` (at V =
    151,936 that would be as large as the log-probabilities); a tie goes to blank."""
    if not blank_penalty or scores.shape[-1] < 2:
        return scores.argmax(dim=-1)
    top_values, top_tokens = scores.topk(2, dim=-1)
    first_is_blank = top_tokens[..., 0] == blank_id
    token = torch.where(first_is_blank, top_tokens[..., 1], top_tokens[..., 0])
    token_score = torch.where(first_is_blank, top_values[..., 1], top_values[..., 0])
    blank_wins = scores[..., blank_id] - blank_penalty >= token_score
    return torch.where(blank_wins, torch.full_like(token, blank_id), token)


def ctc_collapse(best_tokens: torch.Tensor, lengths: torch.Tensor, blank_id: int = 0) -> List[List[int]]:
    """Greedy search's second half: the best token of each frame (N, T), repeats
    collapsed and blanks dropped over the first ``lengths`` (N,) frames."""
    if best_tokens.dim() != 2 or best_tokens.is_floating_point():
        raise ValueError(f"best_tokens must be (N, T) integer token ids, got shape {tuple(best_tokens.shape)}, "
                         f"dtype {best_tokens.dtype}")
    if lengths.dim() != 1 or lengths.numel() != best_tokens.size(0):
        raise ValueError(f"lengths must have shape (N,) = ({best_tokens.size(0)},), got shape {tuple(lengths.shape)}")
    num_frames = best_tokens.size(1)
    previous = torch.full_like(best_tokens, _NO_TOKEN)
    previous[:, 1:] = best_tokens[:, :-1]
    frame_index = torch.arange(num_frames, device=best_tokens.device)
    valid = frame_index.unsqueeze(0) < lengths.to(best_tokens.device).unsqueeze(1)
    emitted = valid & (best_tokens != blank_id) & (best_tokens != previous)
    counts = emitted.sum(dim=1).tolist()
    flat = best_tokens[emitted].tolist()
    outputs, start = [], 0
    for count in counts:
        outputs.append(flat[start : start + count])
        start += count
    return outputs


def _check_penalty(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")


def _check_search_options(beam: int, token_penalty: float, blank_penalty: float = 0.0) -> None:
    if isinstance(beam, bool) or not isinstance(beam, int):
        raise TypeError(f"beam must be an int, got {beam!r}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    _check_penalty("token_penalty", token_penalty)
    _check_penalty("blank_penalty", blank_penalty)


def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam: int = 4,
    blank_id: int = 0,
    token_penalty: float = 0.0,
    return_nbest: bool = False,
    blank_penalty: float = 0.0,
) -> List[List[int]] | List[List[Hypothesis]]:
    """CTC prefix beam search on a batch (see the module docstring for the algorithm).

    Args:
      log_probs: (N, T, V) log-probabilities of the full vocabulary. They are read on
        the CPU (a CUDA tensor is copied there).
      lengths: (N,) number of valid frames of each utterance, in [0, T].
      beam: number of prefixes kept after each frame.
      blank_id: index of the CTC blank in [0, V).
      token_penalty: added to the ranking score once per emitted token (positive
        values favor longer outputs).
      return_nbest: if True, return for each utterance up to ``beam`` hypotheses,
        best first, instead of the best token sequence.
      blank_penalty: subtracted from the blank's log-probability at every frame (the
        hypotheses' ``log_prob`` is then that of the penalized scores).
    Returns:
      N lists of token ids, or N lists of :class:`Hypothesis` if ``return_nbest``.
    """
    _check_inputs(log_probs, lengths, blank_id)
    _check_search_options(beam, token_penalty, blank_penalty)
    scores = log_probs.detach()
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    # No copy of the batch: each utterance's (T, V) view is made contiguous on its own
    # (a no-op unless the vocabulary axis is strided).
    scores = scores.cpu().numpy()
    frames = lengths.detach().cpu().numpy().astype(np.int64)
    num_extensions = min(beam + 1, scores.shape[2] - 1)
    outputs: list = []
    for utterance in range(scores.shape[0]):
        tokens, counts, ranks, totals = _search_utterance(
            np.ascontiguousarray(scores[utterance]), int(frames[utterance]),
            beam, blank_id, num_extensions, float(token_penalty), float(blank_penalty),
        )
        sequences = [tokens[slot, : counts[slot]].tolist() for slot in range(len(counts))]
        if return_nbest:
            hypotheses = [Hypothesis(*entry) for entry in zip(sequences, ranks.tolist(), totals.tolist())]
            # Only if every path has probability 0 can a hypothesis score -inf.
            outputs.append(hypotheses[:1] + [h for h in hypotheses[1:] if h.log_prob > -math.inf])
        else:
            outputs.append(sequences[0])
    return outputs


@numba.njit(cache=True)
def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)), exact for -inf operands."""
    if a < b:
        a, b = b, a
    if b == -np.inf:
        return a
    return a + math.log1p(math.exp(b - a))


@numba.njit(cache=True)
def _insert_sorted(value, item, values, items, filled):
    """Insert (value, item) into the first ``filled`` entries of values/items, kept
    sorted best first and cut to their capacity; return the new fill. A value of -inf
    (probability 0) is dropped; ties keep the earlier item first."""
    capacity = values.shape[0]
    if not (filled < capacity or value > values[capacity - 1]) or value == -np.inf:
        return filled
    position = min(filled, capacity - 1)
    while position > 0 and values[position - 1] < value:
        values[position] = values[position - 1]
        items[position] = items[position - 1]
        position -= 1
    values[position] = value
    items[position] = item
    return min(filled + 1, capacity)


@numba.njit(cache=True)
def _search_utterance(log_probs, num_frames, beam, blank_id, num_extensions, token_penalty, blank_penalty):
    """Prefix beam search of one (T, V) utterance over its first num_frames frames.

    Returns (tokens, counts, ranks, log_probs) of the L <= beam live hypotheses, best
    first: tokens (L, num_frames) whose row l holds counts[l] token ids, ranking
    scores (L,) and total log-probabilities (L,).
    """
    log_p_blank = np.full(beam, -np.inf)
    log_p_token = np.full(beam, -np.inf)
    length = np.zeros(beam, np.int64)
    last = np.full(beam, _NO_TOKEN, np.int64)
    prefix_hash = np.zeros(beam, np.uint64)
    parent_hash = np.zeros(beam, np.uint64)
    log_p_blank[0] = 0.0
    size, source, emitted = _advance_frames(log_probs[:num_frames], beam, blank_id, num_extensions, token_penalty,
                                            blank_penalty, 1, log_p_blank, log_p_token, length, last, prefix_hash, parent_hash)
    totals = np.empty(size)
    for s in range(size):
        totals[s] = _log_add(log_p_blank[s], log_p_token[s])
    ranks = totals + token_penalty * length[:size]
    order = np.argsort(-ranks, kind="mergesort")
    tokens = _backtrack(source, emitted, order, length[order])
    return tokens, length[order], ranks[order], totals[order]


@numba.njit(cache=True)
def _advance_frames(log_probs, beam, blank_id, num_extensions, token_penalty, blank_penalty, size,
                    log_p_blank, log_p_token, length, last, prefix_hash, parent_hash):
    """Prefix beam search over the frames of ``log_probs`` (T, V), applied to the beam state
    (updated in place; the streaming search carries it across chunks); returns the new
    size and per-frame back-pointers: hypothesis s after frame t came from hypothesis
    source[t, s] of the previous frame and appended emitted[t, s] (or _NO_TOKEN).

    Beam: hypothesis s < size has scores log_p_blank[s], log_p_token[s], the prefix's
    length, last token (_NO_TOKEN for the empty prefix), hash and its parent's hash.
    Candidates of a frame: id g < beam stays on hypothesis g; id beam + h * K + k appends
    the k-th top token to hypothesis h, with log_p_token extension_score[id].
    """
    num_frames = log_probs.shape[0]
    source = np.zeros((num_frames, beam), np.int64)
    emitted = np.full((num_frames, beam), _NO_TOKEN, np.int64)
    total = np.empty(beam)
    stay_blank = np.empty(beam)
    stay_token = np.empty(beam)
    top_values = np.empty(max(num_extensions, 1))
    top_tokens = np.empty(max(num_extensions, 1), np.int64)
    extension_score = np.empty(beam * (num_extensions + 1))
    best_rank = np.empty(beam)
    best_candidate = np.empty(beam, np.int64)
    new_blank, new_token = np.empty(beam), np.empty(beam)
    new_length, new_last = np.empty(beam, np.int64), np.empty(beam, np.int64)
    new_hash, new_parent = np.empty(beam, np.uint64), np.empty(beam, np.uint64)

    for frame in range(num_frames):
        row = log_probs[frame]
        # One pass over the vocabulary for the top-K non-blank tokens; `threshold` (the
        # K-th best so far) lets all but a few tokens be skipped with one comparison.
        num_top = 0
        threshold = -np.inf
        for token in range(row.shape[0] if num_extensions > 0 else 0):
            if row[token] > threshold and token != blank_id:
                num_top = _insert_sorted(row[token], token, top_values, top_tokens, num_top)
                if num_top == num_extensions:
                    threshold = top_values[num_top - 1]
        for s in range(size):
            total[s] = _log_add(log_p_blank[s], log_p_token[s])
        selected = 0
        # Stay on each prefix g: a blank, a repeat of last(g), or (exactly, whatever the
        # token's rank) the extension of g's parent h, if h is in the beam, by last(g).
        for g in range(size):
            from_parent = -np.inf
            repeat = -np.inf
            if length[g] > 0:
                repeat = row[last[g]]
                for h in range(size):
                    if prefix_hash[h] == parent_hash[g] and length[h] == length[g] - 1:
                        from_parent = log_p_blank[h] if last[h] == last[g] else total[h]
                        break
            stay_blank[g] = total[g] + (row[blank_id] - blank_penalty)
            stay_token[g] = _log_add(log_p_token[g], from_parent) + repeat
            rank = _log_add(stay_blank[g], stay_token[g]) + token_penalty * length[g]
            selected = _insert_sorted(rank, g, best_rank, best_candidate, selected)
        # New prefixes h + c for the top-K tokens c not already in the beam.
        for h in range(size):
            for k in range(num_top):
                token = top_tokens[k]
                extension_hash = prefix_hash[h] * _HASH_MULTIPLIER + np.uint64(token + 1)
                in_beam = False
                for g in range(size):
                    in_beam |= prefix_hash[g] == extension_hash and length[g] == length[h] + 1
                if in_beam:
                    continue
                candidate = beam + h * num_extensions + k
                score = (log_p_blank[h] if token == last[h] else total[h]) + top_values[k]
                extension_score[candidate] = score
                rank = score + token_penalty * (length[h] + 1)
                selected = _insert_sorted(rank, candidate, best_rank, best_candidate, selected)

        if selected == 0:  # every path has probability 0: keep the prefixes, scored -inf
            for s in range(size):
                source[frame, s] = s
                log_p_blank[s], log_p_token[s] = stay_blank[s], stay_token[s]
            continue
        for s in range(selected):
            candidate = best_candidate[s]
            if candidate < beam:
                h = candidate
                new_blank[s], new_token[s] = stay_blank[h], stay_token[h]
                new_length[s], new_last[s] = length[h], last[h]
                new_hash[s], new_parent[s] = prefix_hash[h], parent_hash[h]
            else:
                h, k = divmod(candidate - beam, num_extensions)
                token = top_tokens[k]
                new_blank[s], new_token[s] = -np.inf, extension_score[candidate]
                new_length[s], new_last[s] = length[h] + 1, token
                new_hash[s] = prefix_hash[h] * _HASH_MULTIPLIER + np.uint64(token + 1)
                new_parent[s] = prefix_hash[h]
                emitted[frame, s] = token
            source[frame, s] = h
        size = selected
        log_p_blank[:size], log_p_token[:size] = new_blank[:size], new_token[:size]
        length[:size], last[:size] = new_length[:size], new_last[:size]
        prefix_hash[:size], parent_hash[:size] = new_hash[:size], new_parent[:size]
    return size, source, emitted


@numba.njit(cache=True)
def _backtrack(source, emitted, final_slots, counts):
    """(L, T) tokens of the final hypotheses final_slots, row l holding counts[l] ids
    (the rest _NO_TOKEN), followed back through the per-frame back-pointers."""
    num_frames = source.shape[0]
    tokens = np.full((final_slots.shape[0], num_frames), _NO_TOKEN, np.int64)
    for row in range(final_slots.shape[0]):
        slot = final_slots[row]
        position = counts[row]
        for frame in range(num_frames - 1, -1, -1):
            if emitted[frame, slot] != _NO_TOKEN:
                position -= 1
                tokens[row, position] = emitted[frame, slot]
            slot = source[frame, slot]
    return tokens
