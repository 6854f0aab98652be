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

The search runs on the whole batch and beam at once: each frame is a fixed number of
tensor operations on (N, beam) and (N, beam, K) tensors, with no Python loop over
utterances or hypotheses. A frame costs about 50 small tensor operations whatever the
batch size, so decoding many utterances at once is what makes it fast (measured on a
shared 2-core machine: about 0.15 ms of CPU per frame for 1 or 16 utterances, 0.3 ms
for 64; see benchmarks/decoding). Equal prefixes are found without comparing token
sequences: each slot carries a 64-bit polynomial hash of its prefix and of its parent
prefix (the prefix minus its last token), so "h + c is already in the beam" and "the
parent of g is in the beam" are tensor comparisons. (Two different prefixes would
have to collide modulo 2**64 while sharing one utterance's beam in the same frame for
this to go wrong.) Token sequences are recovered at the end from per-frame
back-pointers.

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
prefixes. (A search that only expands the top tokens of a frame *including* blank
and the repeated token, as icefall's does, drops the blank and repeat paths whenever
they fall outside that top; here they are always kept.)
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Tuple

import torch

__all__ = ["Hypothesis", "ctc_greedy_search", "ctc_prefix_beam_search"]

_NO_TOKEN = -1
_NEG_INF = float("-inf")
# Odd 64-bit multiplier (2**64 / golden ratio, as a signed int64) of the prefix hash
# h(prefix + c) = h(prefix) * M + c + 1, wrapping modulo 2**64.
_HASH_MULTIPLIER = 0x9E3779B97F4A7C15 - 2**64
# Hashes of dead slots (probability 0) and of the parent of the empty prefix or of a
# dead slot: arbitrary constants that a real prefix hash matches with probability 2**-64,
# so dead slots never merge with, nor act as parents of, live prefixes.
_DEAD = 0x2545F4914F6CDD1D
_NO_PARENT = 0x5851F42D4C957F2D


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
    log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int = 0
) -> List[List[int]]:
    """Best token per frame, then collapse repeats and drop blanks.

    Args:
      log_probs: (N, T, V) log-probabilities (or any scores: only the argmax matters).
      lengths: (N,) number of valid frames of each utterance, in [0, T].
      blank_id: index of the CTC blank in [0, V).
    Returns:
      N lists of token ids.
    """
    _check_inputs(log_probs, lengths, blank_id)
    num_frames = log_probs.size(1)
    best_tokens = log_probs.argmax(dim=-1)  # (N, T)
    previous = torch.full_like(best_tokens, _NO_TOKEN)
    previous[:, 1:] = best_tokens[:, :-1]
    frame_index = torch.arange(num_frames, device=log_probs.device)
    valid = frame_index.unsqueeze(0) < lengths.to(log_probs.device).unsqueeze(1)
    emitted = valid & (best_tokens != blank_id) & (best_tokens != previous)
    counts = emitted.sum(dim=1).tolist()
    flat = best_tokens[emitted].tolist()
    outputs, start = [], 0
    for count in counts:
        outputs.append(flat[start : start + count])
        start += count
    return outputs


def _top_nonblank_tokens(
    log_probs: torch.Tensor, blank_id: int, num_tokens: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(N, T, K) log-probs and ids of the K most probable non-blank tokens per frame."""
    values, indices = log_probs.topk(min(num_tokens + 1, log_probs.size(-1)), dim=-1)
    is_blank = indices == blank_id
    # Move the blank (if among the top K + 1) to the last column, then drop that column.
    order = torch.argsort(is_blank.to(torch.int8), dim=-1, stable=True)[..., :num_tokens]
    return values.gather(-1, order), indices.gather(-1, order)


def _check_search_options(beam: int, token_penalty: float) -> None:
    if isinstance(beam, bool) or not isinstance(beam, int):
        raise TypeError(f"beam must be an int, got {beam!r}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if isinstance(token_penalty, bool) or not isinstance(token_penalty, (int, float)):
        raise TypeError(f"token_penalty must be a float, got {token_penalty!r}")
    if not math.isfinite(token_penalty):
        raise ValueError(f"token_penalty must be finite, got {token_penalty}")


def ctc_prefix_beam_search(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    beam: int = 4,
    blank_id: int = 0,
    token_penalty: float = 0.0,
    return_nbest: bool = False,
) -> List[List[int]] | List[List[Hypothesis]]:
    """CTC prefix beam search on a batch (see the module docstring for the algorithm).

    Args:
      log_probs: (N, T, V) log-probabilities of the full vocabulary.
      lengths: (N,) number of valid frames of each utterance, in [0, T].
      beam: number of prefixes kept after each frame.
      blank_id: index of the CTC blank in [0, V).
      token_penalty: added to the ranking score once per emitted token (positive
        values favor longer outputs).
      return_nbest: if True, return for each utterance up to ``beam`` hypotheses,
        best first, instead of the best token sequence.
    Returns:
      N lists of token ids, or N lists of :class:`Hypothesis` if ``return_nbest``.
    """
    _check_inputs(log_probs, lengths, blank_id)
    _check_search_options(beam, token_penalty)
    num_utterances, num_frames, vocab_size = log_probs.shape
    num_extensions = min(beam + 1, vocab_size - 1)
    if num_extensions == 0:
        num_frames = 0  # only blanks in the vocabulary: every output is empty
    frames = _FrameScores(log_probs.detach(), lengths, blank_id, num_extensions, num_frames)
    state = _Beam.initial(num_utterances, beam, blank_id, log_probs.device)
    source_slots: List[torch.Tensor] = []
    emitted_tokens: List[torch.Tensor] = []
    for frame in range(num_frames):
        source, emitted = state.advance(frames, frame, float(token_penalty))
        source_slots.append(source)
        emitted_tokens.append(emitted)

    total = torch.logaddexp(state.log_p_blank, state.log_p_token)
    rank = total + state.bonus
    order = rank.argsort(dim=1, descending=True)
    token_table = _backtrack(source_slots, emitted_tokens, order)  # (N, B, T)
    return _hypotheses_from_table(token_table, rank.gather(1, order), total.gather(1, order), return_nbest)


class _FrameScores:
    """What the search reads of each frame, precomputed for the whole batch and split
    into per-frame views (so the loop spends no operations on slicing).

    Frames past an utterance's length are made neutral (blank has probability 1, every
    other token 0), so its beam passes through them unchanged and the loop needs no
    per-utterance masks.
    """

    def __init__(
        self,
        log_probs: torch.Tensor,
        lengths: torch.Tensor,
        blank_id: int,
        num_extensions: int,
        num_frames: int,
    ) -> None:
        device = log_probs.device
        frame_index = torch.arange(log_probs.size(1), device=device)
        padding = frame_index.unsqueeze(0) >= lengths.to(device).unsqueeze(1)  # (N, T)
        blank = log_probs[:, :, blank_id].to(torch.float64).masked_fill(padding, 0.0)
        self.blank_id = blank_id
        self.log_probs = log_probs.unbind(1)  # T x (N, V)
        self.blank = blank.unsqueeze(2).unbind(1)  # T x (N, 1)
        self.padding_offset = torch.zeros_like(blank).masked_fill(padding, _NEG_INF).unsqueeze(2).unbind(1)
        if num_frames > 0:
            values, tokens = _top_nonblank_tokens(log_probs, blank_id, num_extensions)
            values = values.to(torch.float64).masked_fill(padding.unsqueeze(-1), _NEG_INF)
            self.top_tokens = tokens.unbind(1)  # T x (N, K)
            self.token_rows = tokens.unsqueeze(2).unbind(1)  # T x (N, 1, K)
            self.token_codes = (tokens + 1).unsqueeze(2).unbind(1)  # T x (N, 1, K): hash symbols
            self.top_values = values.unsqueeze(2).unbind(1)  # T x (N, 1, K)


class _Beam:
    """(N, B) state of the beam; slot b of utterance n is one prefix.

    Prefixes are identified by a 64-bit polynomial hash (``prefix_hash``; the hash of
    the prefix minus its last token is ``parent_hash``), so finding equal prefixes and
    parents is a tensor comparison.
    """

    def __init__(
        self,
        log_p_blank: torch.Tensor,
        log_p_token: torch.Tensor,
        bonus: torch.Tensor,
        last_token: torch.Tensor,
        prefix_hash: torch.Tensor,
        parent_hash: torch.Tensor,
    ) -> None:
        self.log_p_blank = log_p_blank
        self.log_p_token = log_p_token
        self.bonus = bonus  # token_penalty * prefix length
        self.last_token = last_token
        self.prefix_hash = prefix_hash
        self.parent_hash = parent_hash

    @classmethod
    def initial(cls, num_utterances: int, beam: int, blank_id: int, device: torch.device) -> "_Beam":
        """Slot 0 holds the empty prefix, the other slots are dead (probability 0).

        The empty prefix has the blank as its "last token" (no emitted token equals it)
        and no parent.
        """
        shape = (num_utterances, beam)
        log_p_blank = torch.full(shape, _NEG_INF, dtype=torch.float64, device=device)
        log_p_blank[:, 0] = 0.0
        prefix_hash = torch.full(shape, _DEAD, dtype=torch.long, device=device)
        prefix_hash[:, 0] = 0
        return cls(
            log_p_blank,
            torch.full(shape, _NEG_INF, dtype=torch.float64, device=device),
            torch.zeros(shape, dtype=torch.float64, device=device),
            torch.full(shape, blank_id, dtype=torch.long, device=device),
            prefix_hash,
            torch.full(shape, _NO_PARENT, dtype=torch.long, device=device),
        )

    def advance(
        self, frames: _FrameScores, frame: int, token_penalty: float
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Consume one frame; return back-pointers (source slot, emitted token or -1), (N, B)."""
        num_utterances, beam = self.last_token.shape
        log_p_blank, log_p_token, last_token, prefix_hash = (
            self.log_p_blank, self.log_p_token, self.last_token, self.prefix_hash
        )
        total = torch.logaddexp(log_p_blank, log_p_token)
        # The empty prefix's repeat score multiplies its log_p_token = -inf.
        last_score = frames.log_probs[frame].gather(1, last_token).to(torch.float64)
        last_score = last_score + frames.padding_offset[frame]

        # Stay on each prefix g: a blank, a repeat of last(g), or (exactly, whatever the
        # token's rank) the extension of g's parent h, if h is in the beam, by last(g).
        is_parent = self.parent_hash.unsqueeze(2) == prefix_hash.unsqueeze(1)  # [n, g, h]
        parent_base = torch.where(
            last_token.unsqueeze(2) == last_token.unsqueeze(1), log_p_blank.unsqueeze(1), total.unsqueeze(1)
        )
        # At most one slot holds a given prefix, so the max selects the parent.
        from_parent = torch.where(is_parent, parent_base, _NEG_INF).amax(dim=2)
        stay_blank = total + frames.blank[frame]
        stay_token = torch.logaddexp(log_p_token, from_parent) + last_score

        # New prefixes h + c for the top-K tokens c, unless h + c is already a slot.
        tokens = frames.top_tokens[frame]  # (N, K)
        num_extensions = tokens.size(1)
        extension = torch.where(
            frames.token_rows[frame] == last_token.unsqueeze(2), log_p_blank.unsqueeze(2), total.unsqueeze(2)
        ) + frames.top_values[frame]  # (N, B, K)
        extension_hash = prefix_hash.unsqueeze(2) * _HASH_MULTIPLIER + frames.token_codes[frame]
        in_beam = (extension_hash.unsqueeze(3) == prefix_hash.view(num_utterances, 1, 1, beam)).any(dim=3)
        extension = extension.masked_fill(in_beam, _NEG_INF)
        extension_rank = extension + (self.bonus + token_penalty).unsqueeze(2)
        stay_rank = torch.logaddexp(stay_blank, stay_token) + self.bonus
        rank = torch.cat([stay_rank, extension_rank.flatten(1)], dim=1)

        top = rank.topk(beam, dim=1)
        best = top.indices  # (N, B)
        is_stay = best < beam
        extension_index = (best - beam).clamp(min=0)
        source = torch.where(is_stay, best, extension_index // num_extensions)
        new_token = tokens.gather(1, extension_index % num_extensions)
        source_hash = prefix_hash.gather(1, source)
        is_dead = top.values == _NEG_INF  # fewer live candidates than slots
        self.log_p_blank = torch.where(is_stay, stay_blank.gather(1, source), _NEG_INF)
        self.log_p_token = torch.where(
            is_stay, stay_token.gather(1, source), extension.flatten(1).gather(1, extension_index)
        )
        self.bonus = self.bonus.gather(1, source) + torch.where(is_stay, 0.0, token_penalty)
        self.last_token = torch.where(is_stay, last_token.gather(1, source), new_token)
        parent_hash = torch.where(is_stay, self.parent_hash.gather(1, source), source_hash)
        self.parent_hash = parent_hash.masked_fill(is_dead, _NO_PARENT)
        prefix_hash = torch.where(is_stay, source_hash, extension_hash.flatten(1).gather(1, extension_index))
        self.prefix_hash = prefix_hash.masked_fill(is_dead, _DEAD)
        return source, new_token.masked_fill(is_stay, _NO_TOKEN)


def _backtrack(
    source_slots: List[torch.Tensor], emitted_tokens: List[torch.Tensor], final_slots: torch.Tensor
) -> torch.Tensor:
    """(N, B, T) token emitted at each frame (-1 if none) on the path of each final slot."""
    num_utterances, beam = final_slots.shape
    slots = final_slots
    columns = []
    for source, emitted in zip(reversed(source_slots), reversed(emitted_tokens)):
        columns.append(emitted.gather(1, slots))
        slots = source.gather(1, slots)
    if not columns:
        return torch.empty(num_utterances, beam, 0, dtype=torch.long, device=final_slots.device)
    return torch.stack(columns[::-1], dim=2)


def _hypotheses_from_table(
    token_table: torch.Tensor,
    rank: torch.Tensor,
    total: torch.Tensor,
    return_nbest: bool,
) -> List[List[int]] | List[List[Hypothesis]]:
    table = token_table.cpu().tolist()
    rank_list, total_list = rank.cpu().tolist(), total.cpu().tolist()
    outputs: list = []
    for utterance, utterance_ranks, utterance_totals in zip(table, rank_list, total_list):
        sequences = [[token for token in row if token != _NO_TOKEN] for row in utterance]
        if not return_nbest:
            outputs.append(sequences[0])
            continue
        hypotheses = [
            Hypothesis(tokens, score, log_prob)
            for tokens, score, log_prob in zip(sequences, utterance_ranks, utterance_totals)
        ]
        # Slots still dead at the end (fewer distinct prefixes than the beam) are dropped.
        outputs.append(hypotheses[:1] + [h for h in hypotheses[1:] if h.log_prob > float("-inf")])
    return outputs
