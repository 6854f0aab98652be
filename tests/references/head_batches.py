"""Small head-and-target batches for the loss tests."""

import torch


def make_batch(vocab_size=300, dim=16, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    encoder_out = torch.randn(4, 30, dim, generator=generator, dtype=dtype)
    weight = torch.randn(vocab_size, dim, generator=generator, dtype=dtype) / dim ** 0.5
    bias = torch.randn(vocab_size, generator=generator, dtype=dtype) * 0.3
    targets = [[5, 5, 17, 260], [7, 3, 99], [], [250] * 3]
    return encoder_out, weight, bias, targets, [30, 22, 9, 17]


def peaky_rows(num_frames, vocab_size, seed):
    """Rows with one large logit; their products with an identity head are exact, so the
    FP64 log-sum-exp of the FP32 rows is the exact normalizer of the library's logits."""
    generator = torch.Generator().manual_seed(seed)
    frames = torch.randn(num_frames, vocab_size, generator=generator)
    peaks = torch.randint(vocab_size, (num_frames,), generator=generator)
    frames[torch.arange(num_frames), peaks] = 12.0 + torch.rand(num_frames, generator=generator)
    return frames, peaks
