"""Pruned CTC against the dense FP64 reference (full logits, log_softmax, torch CTC)."""

import pytest
import torch

from pruned_ctc import pruned_ctc_loss
from references.ctc_reference import dense_reference, relative_error


def make_batch(vocab_size, frame_counts, target_lengths, dim=16, blank_id=0, seed=0,
               dtype=torch.float32, repeats=False, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    num_utterances, max_frames = len(frame_counts), max(frame_counts)
    encoder_out = torch.randn(num_utterances, max_frames, dim, generator=generator) * scale
    weight = torch.randn(vocab_size, dim, generator=generator) / dim ** 0.5
    bias = torch.randn(vocab_size, generator=generator) * 0.1
    non_blank = [c for c in range(vocab_size) if c != blank_id]
    targets = []
    for length in target_lengths:
        picks = torch.randint(len(non_blank), (length,), generator=generator).tolist()
        sequence = [non_blank[i] for i in picks]
        if repeats and length >= 2:
            sequence[1] = sequence[0]
        targets.append(sequence)
    return (encoder_out.to(dtype), weight.to(dtype), bias.to(dtype), targets,
            torch.tensor(frame_counts))


def run_pruned(encoder_out, weight, bias, targets, lengths, **options):
    x = encoder_out.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    losses = pruned_ctc_loss(x, w, b, targets, lengths, reduction="none", **options)
    losses.sum().backward()
    return losses.detach(), x.grad, w.grad, b.grad


def assert_close_to_reference(batch, loss_tol, dx_tol, dw_tol, **options):
    encoder_out, weight, bias, targets, lengths = batch
    blank_id = options.get("blank_id", 0)
    reference = dense_reference(encoder_out, weight, bias, targets, lengths, blank_id)
    result = run_pruned(encoder_out, weight, bias, targets, lengths, **options)
    names = ("loss", "dX", "dW", "db")
    tolerances = (loss_tol, dx_tol, dw_tol, dw_tol)
    for name, value, ref, tol in zip(names, result, reference, tolerances):
        assert value.dtype == encoder_out.dtype or name == "loss"
        error = relative_error(value, ref)
        assert error <= tol, f"{name}: relative error {error:.3e} > {tol:.0e}"


FP32_TOLERANCES = dict(loss_tol=1e-6, dx_tol=1e-5, dw_tol=1e-4)


@pytest.mark.parametrize("vocab_size,chunk_size", [
    (7, 3), (7, 4096), (100, 7), (500, 128), (2_000, 512), (20_011, 4096), (20_011, 1000),
])
def test_unpruned_matches_dense_reference_across_vocabularies(vocab_size, chunk_size):
    batch = make_batch(vocab_size, [30, 22, 17, 9], [8, 5, 4, 0], repeats=True,
                       seed=vocab_size)
    assert_close_to_reference(batch, beam=None, chunk_size=chunk_size, **FP32_TOLERANCES)


@pytest.mark.parametrize("blank_id", [3, 6])
def test_unpruned_matches_dense_reference_with_nonzero_blank(blank_id):
    batch = make_batch(7, [12, 10, 6], [4, 3, 2], blank_id=blank_id, repeats=True, seed=1)
    assert_close_to_reference(batch, beam=None, chunk_size=3, blank_id=blank_id,
                              **FP32_TOLERANCES)


def test_every_class_selected_leaves_an_empty_complement():
    targets = [[1, 2, 3], [4, 5, 6, 1], [2, 2]]
    encoder_out, weight, bias, _, lengths = make_batch(7, [9, 12, 6], [0, 0, 0], seed=2)
    batch = (encoder_out, weight, bias, targets, lengths)
    assert_close_to_reference(batch, beam=None, chunk_size=2, **FP32_TOLERANCES)


def test_float64_inputs_match_to_near_machine_precision():
    batch = make_batch(300, [25, 18, 11], [7, 4, 2], dtype=torch.float64, seed=3)
    assert_close_to_reference(batch, 1e-12, 1e-11, 1e-11, beam=None, chunk_size=64)


def test_chunk_size_larger_than_vocabulary():
    batch = make_batch(50, [15, 12], [4, 3], seed=4)
    assert_close_to_reference(batch, beam=None, chunk_size=10_000, **FP32_TOLERANCES)


def test_beam_100_equals_unpruned_on_random_inputs():
    encoder_out, weight, bias, targets, lengths = make_batch(
        1000, [60, 45, 33, 20], [15, 10, 8, 3], repeats=True, seed=5, scale=3.0)
    exact = run_pruned(encoder_out, weight, bias, targets, lengths, beam=None)
    pruned = run_pruned(encoder_out, weight, bias, targets, lengths, beam=100.0)
    for value, reference in zip(pruned, exact):
        assert relative_error(value, reference) <= 1e-6


def test_reductions_sum_mean_none_agree():
    encoder_out, weight, bias, targets, lengths = make_batch(40, [20, 15, 9], [5, 3, 0], seed=6)
    per_utterance = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths,
                                    reduction="none")
    total = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths, reduction="sum")
    mean = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths, reduction="mean")
    assert per_utterance.shape == (3,)
    torch.testing.assert_close(total, per_utterance.sum())
    torch.testing.assert_close(mean, per_utterance.sum() / 8)


def test_target_formats_give_identical_results():
    encoder_out, weight, bias, targets, lengths = make_batch(30, [14, 12, 8], [4, 0, 3], seed=7)
    as_list = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths, reduction="none")
    padded = torch.zeros(3, 4, dtype=torch.int64)
    for row, sequence in enumerate(targets):
        padded[row, :len(sequence)] = torch.tensor(sequence, dtype=torch.int64)
    target_lengths = torch.tensor([len(t) for t in targets])
    as_padded = pruned_ctc_loss(encoder_out, weight, bias, padded, lengths,
                                target_lengths=target_lengths, reduction="none")
    flat = torch.tensor([c for t in targets for c in t])
    as_flat = pruned_ctc_loss(encoder_out, weight, bias, flat, lengths,
                              target_lengths=target_lengths, reduction="none")
    torch.testing.assert_close(as_padded, as_list, rtol=0, atol=0)
    torch.testing.assert_close(as_flat, as_list, rtol=0, atol=0)


def test_no_bias():
    encoder_out, weight, _, targets, lengths = make_batch(60, [12, 9], [3, 2], seed=8)
    reference = dense_reference(encoder_out, weight, None, targets, lengths)
    x = encoder_out.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    losses = pruned_ctc_loss(x, w, None, targets, lengths, reduction="none", chunk_size=16)
    losses.sum().backward()
    assert relative_error(losses, reference[0]) <= 1e-6
    assert relative_error(x.grad, reference[1]) <= 1e-5
    assert relative_error(w.grad, reference[2]) <= 1e-4
