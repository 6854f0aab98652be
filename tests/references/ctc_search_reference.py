"""References for the CTC search tests (tests/asr/test_search.py, test_blank_penalty.py):
brute-force enumeration of every alignment (exact label posteriors), a plain-Python
prefix beam search that expands every vocabulary token (no pruning), and posteriors
shaped like a trained model's."""

from __future__ import annotations

import itertools
import math
from typing import Dict, List, Tuple

import torch


def collapse(alignment: Tuple[int, ...], blank_id: int) -> Tuple[int, ...]:
    labels, previous = [], None
    for token in alignment:
        if token != previous and token != blank_id:
            labels.append(token)
        previous = token
    return tuple(labels)


def brute_force_label_log_probs(log_probs: torch.Tensor, blank_id: int) -> Dict[Tuple[int, ...], float]:
    """log P(labels) for every label sequence, summing exp over all V**T alignments."""
    num_frames, vocab_size = log_probs.shape
    table = log_probs.double().tolist()
    probabilities: Dict[Tuple[int, ...], float] = {}
    for alignment in itertools.product(range(vocab_size), repeat=num_frames):
        probability = math.exp(sum(table[t][token] for t, token in enumerate(alignment)))
        labels = collapse(alignment, blank_id)
        probabilities[labels] = probabilities.get(labels, 0.0) + probability
    return {labels: math.log(p) for labels, p in probabilities.items()}


def reference_prefix_beam_search(
    log_probs: torch.Tensor, beam: int, blank_id: int, token_penalty: float
) -> List[Tuple[Tuple[int, ...], float]]:
    """Textbook prefix beam search expanding every token of every frame; (prefix, log P)."""
    table = log_probs.double().tolist()
    beams: Dict[Tuple[int, ...], Tuple[float, float]] = {(): (0.0, -math.inf)}

    def add(a: float, b: float) -> float:
        if a == -math.inf or b == -math.inf:
            return max(a, b)
        return max(a, b) + math.log1p(math.exp(-abs(a - b)))

    for frame in table:
        next_beams: Dict[Tuple[int, ...], Tuple[float, float]] = {}

        def accumulate(prefix, blank_part, token_part):
            old_blank, old_token = next_beams.get(prefix, (-math.inf, -math.inf))
            next_beams[prefix] = (add(old_blank, blank_part), add(old_token, token_part))

        for prefix, (p_blank, p_token) in beams.items():
            total = add(p_blank, p_token)
            accumulate(prefix, total + frame[blank_id], -math.inf)
            if prefix:
                accumulate(prefix, -math.inf, p_token + frame[prefix[-1]])
            for token, token_log_prob in enumerate(frame):
                if token == blank_id:
                    continue
                base = p_blank if prefix and prefix[-1] == token else total
                accumulate(prefix + (token,), -math.inf, base + token_log_prob)
        ranked = sorted(
            next_beams.items(),
            key=lambda item: add(*item[1]) + token_penalty * len(item[0]),
            reverse=True,
        )
        beams = dict(ranked[:beam])
    return [(prefix, add(*scores)) for prefix, scores in beams.items()]


def peaky_log_probs(
    num_utterances: int, num_frames: int, vocab_size: int, seed: int, min_boost: float, max_boost: float
) -> torch.Tensor:
    """Posteriors shaped like a trained CTC model's: one dominant token per frame (blank on
    half the frames), unit-variance noise elsewhere; the dominant logit's margin is drawn
    from [min_boost, max_boost], so some frames are uncertain."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_utterances, num_frames, vocab_size, generator=generator)
    dominant = torch.where(
        torch.rand(num_utterances, num_frames, generator=generator) < 0.5,
        0,
        torch.randint(1, vocab_size, (num_utterances, num_frames), generator=generator),
    )
    boost = min_boost + (max_boost - min_boost) * torch.rand(num_utterances, num_frames, generator=generator)
    logits.scatter_add_(2, dominant.unsqueeze(-1), boost.unsqueeze(-1))
    return logits.log_softmax(-1)
