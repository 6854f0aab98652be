"""A batch whose posteriors agree with its targets, like a trained model's (paper App.
B.2): each frame of a fixed alignment (label runs separated by blanks) points at its
class's weight row, so p_v(m) - gamma_v(m) nearly cancels on the selected classes."""

from __future__ import annotations

import torch


def trained_like_batch(vocab_size: int, num_utterances: int, frames_per_utterance: int,
                       tokens_per_utterance: int, dim: int, bias_scale: float, seed: int):
    """(encoder_out (N, T, D), weight (V, D), bias (V,), targets (N, U), frame_counts,
    target_lengths), float32."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab_size, dim, generator=generator) * dim ** -0.5
    bias = torch.randn(vocab_size, generator=generator) * bias_scale
    targets = torch.randint(1, vocab_size, (num_utterances, tokens_per_utterance),
                            generator=generator)
    encoder_out = torch.empty(num_utterances, frames_per_utterance, dim)
    positions = torch.linspace(2, frames_per_utterance - 3,
                               tokens_per_utterance).round().long()
    for n in range(num_utterances):
        labels = torch.zeros(frames_per_utterance, dtype=torch.long)
        labels[positions] = targets[n]
        direction = weight[labels] / weight[labels].norm(dim=1, keepdim=True) ** 2
        encoder_out[n] = 12.0 * direction + 0.5 * torch.randn(
            frames_per_utterance, dim, generator=generator)
    frame_counts = torch.full((num_utterances,), frames_per_utterance, dtype=torch.int64)
    target_lengths = torch.full((num_utterances,), tokens_per_utterance, dtype=torch.int64)
    return encoder_out, weight, bias, targets, frame_counts, target_lengths
