"""Autoregressive generation for LLM-CE: greedy and beam search with a KV cache.

Both start from one utterance's prefill embeddings (1, L, D) (chat template + speech)
and stop at EOS or after ``config.max_new_tokens`` tokens (App. D.2: 200). Only the
last position's head logits are formed per step; greedy search takes their argmax block by
block without the log-softmax (:func:`llm_ctc.head_argmax.head_argmax`, as LLM-CTC's
greedy search), ``config.screened_argmax`` through a BF16 product first.

Beam search keeps ``beam`` live hypotheses. Per step the 2 * beam best extensions of
the live ones are ranked by summed log-probability; an EOS extension ranked within the
first ``beam`` finishes its hypothesis, the best non-EOS extensions (up to ``beam``)
stay live. The search ends once ``beam`` hypotheses have finished (or at the length
limit), and the finished hypothesis with the best summed log-probability divided by
(its length including EOS) ** length_penalty wins. These are the semantics of
transformers' beam search with ``early_stopping=True``. With beam 1 the search makes
exactly greedy's choices.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from llm_ctc.head_argmax import head_argmax
from llm_ctc.language_model import backbone_states


def _positions(start: int, count: int, rows: int, device) -> Tensor:
    return torch.arange(start, start + count, device=device).unsqueeze(0).expand(rows, count)


def _last_log_probs(model, hidden: Tensor) -> Tensor:
    return model.head_logits(hidden[:, -1]).log_softmax(dim=-1)


def _last_argmax(model, hidden: Tensor) -> int:
    """The most probable next token: the argmax of the last position's float32 head logits
    (the log-softmax's normalizer does not move it), block by block as LLM-CTC's frames."""
    head = model.lm_head
    return int(head_argmax(hidden[:, -1], head.weight, head.bias, model.config.head_chunk_size,
                           screen=model.config.screened_argmax)[0])


def _prefill(model, prefill: Tensor):
    length = prefill.shape[1]
    mask = torch.ones(1, length, dtype=torch.long, device=prefill.device)
    return backbone_states(model.llm, prefill, mask, _positions(0, length, 1, prefill.device), use_cache=True)


def _step(model, tokens: Tensor, position: int, cache) -> Tuple[Tensor, object]:
    """Feed one token per row at ``position`` (all earlier positions are in the cache)."""
    rows = tokens.shape[0]
    mask = torch.ones(rows, position + 1, dtype=torch.long, device=tokens.device)
    embeds = model.embed_tokens(tokens.view(rows, 1))
    return backbone_states(model.llm, embeds, mask, _positions(position, 1, rows, tokens.device),
                           cache=cache, use_cache=True)


def greedy_search(model, prefill: Tensor, use_cache: bool = True) -> List[int]:
    """Most probable token at each step. ``use_cache=False`` reruns the whole sequence
    every step (the reference the cached path must agree with)."""
    eos, limit, length = model.eos_id, model.config.max_new_tokens, prefill.shape[1]
    tokens: List[int] = []
    if use_cache:
        hidden, cache = _prefill(model, prefill)
    for step in range(limit):
        if not use_cache:
            generated = model.embed_tokens(torch.tensor([tokens], dtype=torch.long, device=prefill.device))
            sequence = torch.cat([prefill, generated.to(prefill.dtype)], dim=1)
            total = sequence.shape[1]
            hidden = backbone_states(model.llm, sequence, torch.ones(1, total, dtype=torch.long,
                                                                     device=prefill.device),
                                     _positions(0, total, 1, prefill.device))
        token = _last_argmax(model, hidden)
        if token == eos:
            break
        tokens.append(token)
        if use_cache and step + 1 < limit:
            hidden, cache = _step(model, torch.tensor([token], device=prefill.device), length + step, cache)
    return tokens


def beam_search(model, prefill: Tensor, beam: int) -> List[int]:
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    eos, limit, length = model.eos_id, model.config.max_new_tokens, prefill.shape[1]
    penalty = model.config.length_penalty
    device = prefill.device
    hidden, cache = _prefill(model, prefill)
    log_probs = _last_log_probs(model, hidden)  # (1, V): every live beam starts here
    cache.batch_repeat_interleave(beam)
    log_probs = log_probs.expand(beam, -1)
    # Only the first copy may extend at step 0, so the beam does not fill with duplicates.
    scores = torch.full((beam,), float("-inf"), dtype=torch.float64, device=device)
    scores[0] = 0.0
    sequences: List[List[int]] = [[] for _ in range(beam)]
    finished: List[Tuple[float, List[int]]] = []
    for step in range(limit):
        candidates = (scores[:, None] + log_probs.double()).view(-1)
        best_scores, best_indices = candidates.topk(min(2 * beam, candidates.numel()))
        vocab = log_probs.shape[1]
        parents, tokens, new_scores = [], [], []
        for rank, (score, index) in enumerate(zip(best_scores.tolist(), best_indices.tolist())):
            parent, token = divmod(index, vocab)
            if token == eos:
                if rank < beam and score > float("-inf"):
                    hypothesis = sequences[parent]
                    finished.append((score / (len(hypothesis) + 1) ** penalty, hypothesis))
                continue
            parents.append(parent)
            tokens.append(token)
            new_scores.append(score)
            if len(parents) == beam:
                break
        if len(finished) >= beam:
            break
        if step + 1 == limit or not parents:
            # The length limit: live hypotheses compete too, normalized by their length.
            finished += [(s / (len(sequences[p]) + 1) ** penalty, sequences[p] + [t])
                         for s, p, t in zip(new_scores, parents, tokens)]
            break
        sequences = [sequences[p] + [t] for p, t in zip(parents, tokens)]
        scores = torch.tensor(new_scores, dtype=torch.float64, device=device)
        cache.reorder_cache(torch.tensor(parents, device=device))
        hidden, cache = _step(model, torch.tensor(tokens, device=device), length + step, cache)
        log_probs = _last_log_probs(model, hidden)
    return max(finished, key=lambda item: item[0])[1]
