"""The public two stages: vocabulary reduction, then the alignment loss for a beam."""

import pytest
import torch

from pruned_ctc import (DEFAULT_BEAM, DEFAULT_CHUNK_SIZE, Precision, alignment_loss,
                        pruned_ctc_loss, reduce_vocabulary)
from references.ctc_reference import dense_reference, relative_error


def make_batch(dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    encoder_out = torch.randn(3, 25, 12, generator=generator, dtype=dtype)
    weight = torch.randn(80, 12, generator=generator, dtype=dtype) / 12 ** 0.5
    bias = torch.randn(80, generator=generator, dtype=dtype) * 0.2
    targets = [[9, 4, 4, 70], [33], [70, 2]]
    return encoder_out, weight, bias, targets, [25, 18, 11]


def test_defaults_are_the_papers_chunk_width_and_beam():
    assert (DEFAULT_CHUNK_SIZE, DEFAULT_BEAM) == (4096, 100.0)  # Sec. 3.2 and 3.3


def test_reduction_gives_log_softmax_at_blank_then_the_sorted_labels():
    encoder_out, weight, bias, targets, lengths = make_batch()
    reduced = reduce_vocabulary(encoder_out, weight, bias, targets, lengths, chunk_size=16)
    assert reduced.selected_classes.tolist() == [0, 2, 4, 9, 33, 70]
    log_probs = (encoder_out @ weight.t() + bias).log_softmax(-1)
    rows = torch.cat([log_probs[n, :t] for n, t in enumerate(lengths)])
    expected = rows[:, reduced.selected_classes]
    torch.testing.assert_close(reduced.selected_log_probs, expected, rtol=1e-13, atol=1e-13)


def test_alignment_loss_and_its_gradient_match_the_dense_reference():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=1)
    tensors = [t.clone().requires_grad_(True) for t in (encoder_out, weight, bias)]
    reduced = reduce_vocabulary(*tensors, targets, lengths, chunk_size=16)
    losses = alignment_loss(reduced, beam=None, reduction="none")
    losses.sum().backward()
    reference = dense_reference(encoder_out, weight, bias, targets, lengths)
    assert relative_error(losses, reference[0]) < 1e-12
    for tensor, expected in zip(tensors, reference[1:]):
        assert relative_error(tensor.grad, expected) < 1e-11


@pytest.mark.parametrize("beam", [None, 3.0, 100.0])
def test_one_reduction_serves_every_beam_as_the_one_call_loss(beam):
    encoder_out, weight, bias, targets, lengths = make_batch(seed=2)
    with torch.no_grad():
        reduced = reduce_vocabulary(encoder_out, weight, bias, targets, lengths)
        staged = alignment_loss(reduced, beam=beam, reduction="none")
    direct = pruned_ctc_loss(encoder_out, weight, bias, targets, lengths, beam=beam,
                             reduction="none")
    torch.testing.assert_close(staged, direct, rtol=0, atol=0)


def test_precision_choice_reaches_the_reduction():
    encoder_out, weight, bias, targets, lengths = make_batch(dtype=torch.float32, seed=3)
    exact = reduce_vocabulary(encoder_out.double(), weight.double(), bias.double(), targets,
                              lengths).selected_log_probs
    default = reduce_vocabulary(encoder_out, weight, bias, targets, lengths).selected_log_probs
    float32 = reduce_vocabulary(encoder_out, weight, bias, targets, lengths,
                                precision=Precision(float64_normalizer=False)).selected_log_probs
    assert not torch.equal(default, float32)
    # Both within FP32 rounding of the exact values; the FP64 normalizer the closer.
    assert relative_error(default, exact) <= relative_error(float32, exact) < 1e-6
