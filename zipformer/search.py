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
utterances or hypotheses. Prefixes are identified by a 62-bit polynomial hash
(two independent residues modulo the prime 2**31 - 1) so that merging is a
tensor comparison; token sequences are recovered at the end by back-pointers.

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
prefixes.
"""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

import torch

__all__ = ["Hypothesis", "ctc_greedy_search", "ctc_prefix_beam_search"]

# Two residues modulo a Mersenne prime keep every product below 2**62 (no int64
# overflow) and avoid the systematic collisions of hashing modulo 2**64.
_HASH_MODULUS = 2**31 - 1
_HASH_BASES = (1_000_003, 998_244_353 % _HASH_MODULUS)
_NO_TOKEN = -1


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
    num_utterances, num_frames, _ = log_probs.shape
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
    assert len(outputs) == num_utterances
    return outputs


def _extend_hash(prefix_hash: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Hash of prefix + token from the hash of prefix; both int64, broadcastable."""
    high = prefix_hash >> 31
    low = prefix_hash & _HASH_MODULUS
    symbol = tokens + 1
    high = (high * _HASH_BASES[0] + symbol) % _HASH_MODULUS
    low = (low * _HASH_BASES[1] + symbol) % _HASH_MODULUS
    return (high << 31) | low


def _top_nonblank_tokens(
    log_probs: torch.Tensor, blank_id: int, num_tokens: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(N, T, K) log-probs and ids of the K most probable non-blank tokens per frame."""
    values, indices = log_probs.topk(min(num_tokens + 1, log_probs.size(-1)), dim=-1)
    is_blank = indices == blank_id
    # Sort blank last, then drop the last column if it is not needed.
    order = torch.argsort(is_blank.to(torch.int8), dim=-1, stable=True)
    values = values.gather(-1, order)[..., :num_tokens]
    indices = indices.gather(-1, order)[..., :num_tokens]
    values = values.masked_fill(indices == blank_id, float("-inf"))
    return values, indices


def _check_search_options(beam: int, token_penalty: float) -> None:
    if isinstance(beam, bool) or not isinstance(beam, int):
        raise TypeError(f"beam must be an int, got {beam!r}")
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    if isinstance(token_penalty, bool) or not isinstance(token_penalty, (int, float)):
        raise TypeError(f"token_penalty must be a float, got {token_penalty!r}")
    if not torch.isfinite(torch.tensor(float(token_penalty))):
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
    device = log_probs.device
    log_probs = log_probs.detach()
    lengths = lengths.to(device)
    num_extensions = min(beam + 1, vocab_size - 1)
    neg_inf = float("-inf")

    # State of the beam, all (N, B): slot 0 holds the empty prefix, the others are dead.
    shape = (num_utterances, beam)
    log_p_blank = torch.full(shape, neg_inf, dtype=torch.float64, device=device)
    log_p_blank[:, 0] = 0.0
    log_p_token = torch.full(shape, neg_inf, dtype=torch.float64, device=device)
    prefix_length = torch.zeros(shape, dtype=torch.long, device=device)
    last_token = torch.full(shape, _NO_TOKEN, dtype=torch.long, device=device)
    prefix_hash = torch.zeros(shape, dtype=torch.long, device=device)
    parent_hash = torch.full(shape, -1, dtype=torch.long, device=device)
    # Back-pointers per frame: source slot and token emitted on entering the slot.
    source_slots: List[torch.Tensor] = []
    emitted_tokens: List[torch.Tensor] = []

    if num_extensions > 0 and num_frames > 0:
        top_values, top_tokens = _top_nonblank_tokens(log_probs, blank_id, num_extensions)
        top_values = top_values.to(torch.float64)
    batch_index = torch.arange(num_utterances, device=device).unsqueeze(1)
    slot_index = torch.arange(beam, device=device).expand(num_utterances, beam)

    for frame in range(num_frames if num_extensions > 0 else 0):
        frame_scores = log_probs[:, frame, :]  # (N, V)
        blank_score = frame_scores[:, blank_id : blank_id + 1].to(torch.float64)  # (N, 1)
        total = torch.logaddexp(log_p_blank, log_p_token)  # (N, B)
        alive = total > neg_inf
        last_score = frame_scores.gather(1, last_token.clamp(min=0)).to(torch.float64)
        last_score = last_score.masked_fill(last_token == _NO_TOKEN, neg_inf)

        # (1) stay on each prefix g; add the exact extension from its parent in the beam.
        is_parent = (parent_hash.unsqueeze(2) == prefix_hash.unsqueeze(1)) & (
            alive.unsqueeze(1) & alive.unsqueeze(2)
        )
        is_parent &= (prefix_length.unsqueeze(2) == prefix_length.unsqueeze(1) + 1)
        parent_base = torch.where(
            last_token.unsqueeze(2) == last_token.unsqueeze(1), log_p_blank.unsqueeze(1),
            total.unsqueeze(1),
        )  # [n, g, h]: score of parent h before appending last(g)
        from_parent = torch.logsumexp(parent_base.masked_fill(~is_parent, neg_inf), dim=2)
        stay_blank = total + blank_score
        stay_token = torch.logaddexp(log_p_token + last_score, from_parent + last_score)

        # (2) extend each h by the top-K tokens into prefixes not already in the beam.
        ext_tokens = top_tokens[:, frame, :].unsqueeze(1)  # (N, 1, K)
        ext_base = torch.where(
            ext_tokens == last_token.unsqueeze(2), log_p_blank.unsqueeze(2), total.unsqueeze(2)
        )
        ext_token_score = ext_base + top_values[:, frame, :].unsqueeze(1)  # (N, B, K)
        ext_hash = _extend_hash(prefix_hash.unsqueeze(2), ext_tokens)
        in_beam = (ext_hash.unsqueeze(-1) == prefix_hash.view(num_utterances, 1, 1, beam)) & (
            alive & (prefix_length > 0)
        ).view(num_utterances, 1, 1, beam)
        ext_token_score = ext_token_score.masked_fill(in_beam.any(-1), neg_inf)

        # Rank the B stays and B * K extensions together and keep the best B.
        length_bonus = token_penalty * prefix_length.to(torch.float64)
        stay_rank = torch.logaddexp(stay_blank, stay_token) + length_bonus
        ext_rank = ext_token_score + (length_bonus + token_penalty).unsqueeze(2)
        all_rank = torch.cat([stay_rank, ext_rank.flatten(1)], dim=1)
        best = all_rank.topk(beam, dim=1).indices  # (N, B)
        is_stay = best < beam
        source = torch.where(is_stay, best, (best - beam) // num_extensions)
        ext_column = (best - beam).clamp(min=0) % num_extensions
        new_token = ext_tokens.squeeze(1).gather(1, ext_column)

        def pick(stay_value: torch.Tensor, ext_value: torch.Tensor) -> torch.Tensor:
            return torch.where(is_stay, stay_value.gather(1, source), ext_value)

        zeros_ext = torch.full_like(log_p_blank, neg_inf)
        new_state = (
            pick(stay_blank, zeros_ext),
            pick(stay_token, ext_token_score.flatten(1).gather(1, (best - beam).clamp(min=0))),
            pick(prefix_length, prefix_length.gather(1, source) + 1),
            pick(last_token, new_token),
            pick(prefix_hash, _extend_hash(prefix_hash.gather(1, source), new_token)),
            pick(parent_hash, prefix_hash.gather(1, source)),
        )
        active = (frame < lengths).unsqueeze(1)  # utterances already ended keep their beam
        log_p_blank, log_p_token, prefix_length, last_token, prefix_hash, parent_hash = (
            torch.where(active, new_value, old_value)
            for new_value, old_value in zip(
                new_state,
                (log_p_blank, log_p_token, prefix_length, last_token, prefix_hash, parent_hash),
            )
        )
        source_slots.append(torch.where(active, source, slot_index))
        emitted_tokens.append(torch.where(active & ~is_stay, new_token, _NO_TOKEN))

    total = torch.logaddexp(log_p_blank, log_p_token)
    rank = total + token_penalty * prefix_length.to(torch.float64)
    order = rank.argsort(dim=1, descending=True)
    token_table = _backtrack(source_slots, emitted_tokens, order)  # (N, B, T)
    return _hypotheses_from_table(
        token_table, rank.gather(1, order), total.gather(1, order), return_nbest
    )


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
