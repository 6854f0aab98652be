"""Temporary memory of the loss: one (M, C) block of logits at a time (paper Sec. 3.2),
measured with the profiler's allocation events."""

import torch

from pruned_ctc import pruned_ctc_loss
from references.memory_probe import peak_allocated_bytes


def make_inputs(num_utterances=20, frames=100, dim=32, vocab_size=8192, seed=0):
    generator = torch.Generator().manual_seed(seed)
    encoder_out = torch.randn(num_utterances, frames, dim, generator=generator)
    weight = torch.randn(vocab_size, dim, generator=generator) / dim ** 0.5
    bias = torch.randn(vocab_size, generator=generator) * 0.1
    targets = torch.randint(1, vocab_size, (num_utterances, 2), generator=generator)
    lengths = torch.full((num_utterances,), frames)
    return encoder_out, weight, bias, targets, lengths


def test_forward_holds_one_block_of_logits_at_a_time():
    encoder_out, weight, bias, targets, lengths = make_inputs()
    chunk_size = 4096
    block_bytes = encoder_out.shape[0] * encoder_out.shape[1] * chunk_size * 4
    with torch.no_grad():
        peak = peak_allocated_bytes(lambda: pruned_ctc_loss(
            encoder_out, weight, bias, targets, lengths,
            target_lengths=torch.full((20,), 2), chunk_size=chunk_size))
    # Besides the block: (M, K) and (M,) vectors and the DP on 5 states, well under a
    # quarter of a block here; a second live block would double the peak.
    assert peak < 1.25 * block_bytes, f"peak {peak / 2**20:.1f} MiB, block {block_bytes / 2**20:.1f} MiB"


def test_forward_and_backward_of_sum_hold_the_gradients_and_one_block():
    encoder_out, weight, bias, targets, lengths = make_inputs()
    chunk_size = 4096
    block_bytes = encoder_out.shape[0] * encoder_out.shape[1] * chunk_size * 4
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    gradient_bytes = sum(t.numel() * 4 for t in tensors)

    def step():
        pruned_ctc_loss(*tensors, targets, lengths, target_lengths=torch.full((20,), 2),
                        chunk_size=chunk_size).backward()

    peak = peak_allocated_bytes(step)
    # The gradients are handed to autograd without a copy; besides them one (r, V) block
    # of about M C values and vectors (M, K) and (M,).
    assert peak < gradient_bytes + 1.15 * block_bytes, (
        f"peak {peak / 2**20:.1f} MiB, gradients {gradient_bytes / 2**20:.1f} MiB, "
        f"block {block_bytes / 2**20:.1f} MiB")
