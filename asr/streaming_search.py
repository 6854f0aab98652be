"""CTC search fed chunk by chunk (streaming, paper Sec. 4.3 and Fig. 2c): the search
state persists across chunk boundaries, so the result over chunks equals the offline
search over the concatenated log-probabilities.

* :class:`StreamingGreedySearch` keeps the previous frame's raw label (blank included):
  a token repeated across a boundary is collapsed, one separated by a blank is not.
* :class:`StreamingPrefixBeamSearch` keeps each prefix with its blank-ending and
  token-ending log-probabilities (the CTC collapse spans chunk boundaries).

Both are per utterance (the state is model-independent: it only sees (T, V)
log-probabilities); :meth:`reset` starts a new utterance. The per-frame step of the
prefix beam search is the one of :func:`asr.search.ctc_prefix_beam_search` (the same
pruning argument, the same tie order), written here over a state that is passed in and
out instead of living for one call; token sequences are kept per beam slot and extended
after each chunk from that chunk's back-pointers.
"""

from __future__ import annotations

from typing import List

import numba
import numpy as np
import torch

from asr.search import _HASH_MULTIPLIER, _NO_TOKEN, Hypothesis, _check_search_options, _insert_sorted, _log_add

__all__ = ["StreamingGreedySearch", "StreamingPrefixBeamSearch"]


def _chunk_array(log_probs: torch.Tensor, blank_id: int) -> np.ndarray:
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 2 or not log_probs.is_floating_point():
        raise ValueError("log_probs must be a floating (T, V) tensor of one chunk, got "
                         f"{getattr(log_probs, 'shape', type(log_probs).__name__)}")
    if not 0 <= blank_id < log_probs.shape[1]:
        raise ValueError(f"blank_id must lie in [0, V={log_probs.shape[1]}), got {blank_id}")
    scores = log_probs.detach()
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    return np.ascontiguousarray(scores.cpu().numpy())


class StreamingGreedySearch:
    """Best label per frame; a token is emitted when it is not blank and differs from
    the previous frame's raw label, the previous chunk's last frame included."""

    def __init__(self, blank_id: int = 0) -> None:
        self.blank_id = blank_id
        self.reset()

    def reset(self) -> None:
        self.tokens: List[int] = []
        self.previous = _NO_TOKEN

    def advance(self, log_probs: torch.Tensor) -> List[int]:
        """Feed one chunk's (T, V) log-probabilities; returns the tokens emitted by it."""
        best = _chunk_array(log_probs, self.blank_id).argmax(axis=1).tolist()
        emitted = []
        for label in best:
            if label != self.blank_id and label != self.previous:
                emitted.append(label)
            self.previous = label
        self.tokens.extend(emitted)
        return emitted

    def best(self) -> List[int]:
        return list(self.tokens)


class StreamingPrefixBeamSearch:
    """Prefix beam search over chunks (``beam``, ``token_penalty`` as in
    :func:`asr.search.ctc_prefix_beam_search`)."""

    def __init__(self, beam: int = 4, blank_id: int = 0, token_penalty: float = 0.0) -> None:
        _check_search_options(beam, token_penalty)
        self.beam, self.blank_id, self.token_penalty = beam, blank_id, float(token_penalty)
        self.reset()

    def reset(self) -> None:
        beam = self.beam
        self.log_p_blank = np.full(beam, -np.inf)
        self.log_p_token = np.full(beam, -np.inf)
        self.length = np.zeros(beam, np.int64)
        self.last = np.full(beam, _NO_TOKEN, np.int64)
        self.prefix_hash = np.zeros(beam, np.uint64)
        self.parent_hash = np.zeros(beam, np.uint64)
        self.log_p_blank[0] = 0.0
        self.size = 1
        self.tokens: List[List[int]] = [[]]

    def advance(self, log_probs: torch.Tensor) -> None:
        """Feed one chunk's (T, V) log-probabilities."""
        scores = _chunk_array(log_probs, self.blank_id)
        if scores.shape[0] == 0:
            return
        num_extensions = min(self.beam + 1, scores.shape[1] - 1)
        size, source, emitted = _advance_frames(
            scores, self.beam, self.blank_id, num_extensions, self.token_penalty, self.size,
            self.log_p_blank, self.log_p_token, self.length, self.last, self.prefix_hash, self.parent_hash)
        origins, new_tokens, counts = _backtrack_chunk(source, emitted, size)
        self.tokens = [self.tokens[origins[s]] + new_tokens[s, :counts[s]].tolist() for s in range(size)]
        self.size = size

    def nbest(self) -> List[Hypothesis]:
        """The live hypotheses, best first (the state itself is not reordered)."""
        totals = np.array([_log_add(self.log_p_blank[s], self.log_p_token[s]) for s in range(self.size)])
        ranks = totals + self.token_penalty * self.length[:self.size]
        order = np.argsort(-ranks, kind="mergesort")
        hypotheses = [Hypothesis(list(self.tokens[s]), float(ranks[s]), float(totals[s])) for s in order]
        return hypotheses[:1] + [h for h in hypotheses[1:] if h.log_prob > -np.inf]

    def best(self) -> List[int]:
        return self.nbest()[0].tokens


@numba.njit(cache=True)
def _advance_frames(log_probs, beam, blank_id, num_extensions, token_penalty, size,
                    log_p_blank, log_p_token, length, last, prefix_hash, parent_hash):
    """The frames of one chunk applied to the beam state (updated in place); returns the
    new size and per-frame back-pointers (source slot, emitted token or _NO_TOKEN)."""
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
        # Staying on prefix g (blank, repeat, or its parent extended by last(g)).
        for g in range(size):
            from_parent = -np.inf
            repeat = -np.inf
            if length[g] > 0:
                repeat = row[last[g]]
                for h in range(size):
                    if prefix_hash[h] == parent_hash[g] and length[h] == length[g] - 1:
                        from_parent = log_p_blank[h] if last[h] == last[g] else total[h]
                        break
            stay_blank[g] = total[g] + row[blank_id]
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

        if selected == 0:
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
def _backtrack_chunk(source, emitted, size):
    """For each final slot s < size: the slot it came from at the chunk start and the
    tokens it appended within the chunk (row s, counts[s] of them)."""
    num_frames = source.shape[0]
    origins = np.empty(size, np.int64)
    counts = np.zeros(size, np.int64)
    tokens = np.full((size, num_frames), _NO_TOKEN, np.int64)
    for s in range(size):
        slot = s
        for frame in range(num_frames - 1, -1, -1):
            if emitted[frame, slot] != _NO_TOKEN:
                counts[s] += 1
            slot = source[frame, slot]
        origins[s] = slot
        position = counts[s]
        slot = s
        for frame in range(num_frames - 1, -1, -1):
            if emitted[frame, slot] != _NO_TOKEN:
                position -= 1
                tokens[s, position] = emitted[frame, slot]
            slot = source[frame, slot]
    return origins, tokens, counts
