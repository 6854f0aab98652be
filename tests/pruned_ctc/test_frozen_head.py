"""The two-product column schedule of a frozen head (frozen_head.py) and the blank offset,
against torch's CTC in FP64 over the full vocabulary."""

import pytest
import torch

from pruned_ctc import ExcludedUtteranceWarning, pruned_ctc_loss
from pruned_ctc.frozen_head import FrozenHeadPass
from pruned_ctc.vocab_chunks import Precision
from references.ctc_reference import dense_reference, relative_error
from references.head_batches import make_batch, peaky_rows
from references.product_counter import ProductCounter


def with_offset(bias, offset, vocab_size):
    """bias + offset on blank (class 0), for the reference."""
    base = torch.zeros(vocab_size, dtype=torch.float64) if bias is None else bias.double().clone()
    base[0] += offset
    return base


def frozen_run(encoder_out, weight, bias, targets, lengths, offset=None, **options):
    x = encoder_out.clone().requires_grad_(True)
    eta = None if offset is None else torch.tensor(offset, dtype=encoder_out.dtype,
                                                   requires_grad=True)
    loss = pruned_ctc_loss(x, weight, bias, targets, lengths, blank_offset=eta, **options)
    loss.backward()
    return loss.detach(), x.grad, None if eta is None else eta.grad


def reference(encoder_out, weight, bias, targets, lengths, reduction="sum"):
    losses, grad_input, _, grad_bias = dense_reference(
        encoder_out, weight, torch.zeros(weight.shape[0], dtype=torch.float64)
        if bias is None else bias, targets, lengths)
    scale = 1.0 if reduction == "sum" else 1.0 / sum(len(t) for t in targets)
    return losses.sum() * scale, grad_input * scale, grad_bias[0] * scale


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("beam", [None, 100.0])
@pytest.mark.parametrize("chunk_size", [7, 64, 4096])
@pytest.mark.parametrize("use_bias", [True, False])
def test_frozen_head_matches_the_dense_float64_reference(reduction, beam, chunk_size, use_bias):
    encoder_out, weight, bias, targets, lengths = make_batch(seed=11)
    bias = bias if use_bias else None
    loss, grad_input, _ = frozen_run(encoder_out, weight, bias, targets, lengths,
                                     reduction=reduction, beam=beam, chunk_size=chunk_size)
    expected = reference(encoder_out, weight, bias, targets, lengths, reduction)
    assert relative_error(loss, expected[0]) < 1e-12
    assert relative_error(grad_input, expected[1]) < 1e-11


@pytest.mark.parametrize("chunk_size", [7, 4096])
@pytest.mark.parametrize("use_bias", [True, False])
def test_blank_offset_gradient_is_the_dense_reference_blank_bias_gradient(chunk_size, use_bias):
    encoder_out, weight, bias, targets, lengths = make_batch(seed=12)
    bias = bias if use_bias else None
    loss, grad_input, grad_offset = frozen_run(encoder_out, weight, bias, targets, lengths,
                                               offset=1.7, chunk_size=chunk_size)
    expected = reference(encoder_out, weight, with_offset(bias, 1.7, weight.shape[0]), targets,
                         lengths)
    assert relative_error(loss, expected[0]) < 1e-12
    assert relative_error(grad_input, expected[1]) < 1e-11
    assert relative_error(grad_offset, expected[2]) < 1e-10


def test_blank_offset_gradient_equals_a_finite_difference():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=13)
    _, _, grad_offset = frozen_run(encoder_out, weight, bias, targets, lengths, offset=0.3)
    step = 1e-6
    with torch.no_grad():
        def loss_at(value):
            return pruned_ctc_loss(encoder_out, weight, bias, targets, lengths,
                                   blank_offset=torch.tensor(value, dtype=torch.float64))
        difference = (loss_at(0.3 + step) - loss_at(0.3 - step)) / (2 * step)
    assert abs(float(grad_offset) - float(difference)) < 1e-7 * abs(float(difference))


def test_with_a_trainable_weight_the_blank_offset_is_folded_into_the_bias_exactly():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=14)
    x = encoder_out.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    eta = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
    pruned_ctc_loss(x, w, bias, targets, lengths, blank_offset=eta).backward()
    _, expected_input, expected_weight, expected_bias = dense_reference(
        encoder_out, weight, with_offset(bias, 0.9, weight.shape[0]), targets, lengths)
    assert relative_error(x.grad, expected_input) < 1e-11
    assert relative_error(w.grad, expected_weight) < 1e-11
    assert relative_error(eta.grad, expected_bias[0]) < 1e-10


def test_a_bfloat16_head_takes_the_frozen_schedule_without_a_copy():
    encoder_out, weight, _, targets, lengths = make_batch(vocab_size=2000, dim=32, seed=15,
                                                          dtype=torch.float32)
    head = weight.to(torch.bfloat16)
    x = encoder_out.clone().requires_grad_(True)
    with ProductCounter() as counter:
        loss = pruned_ctc_loss(x, head, None, targets, lengths, chunk_size=256)
        loss.backward()
    losses, expected_input, _, _ = dense_reference(encoder_out, head.double(), None, targets,
                                                   lengths)
    one_product = sum(lengths) * head.shape[0] * head.shape[1]
    assert 2 <= counter.multiply_adds / one_product < 2.03
    assert x.grad.dtype == torch.float32
    assert relative_error(loss, losses.sum()) < 1e-6
    assert relative_error(x.grad, expected_input) < 1e-5


def test_only_a_blank_offset_to_train_costs_one_product():
    encoder_out, weight, _, targets, lengths = make_batch(vocab_size=2000, dim=32, seed=16,
                                                          dtype=torch.float32)
    eta = torch.tensor(0.5, requires_grad=True)
    with ProductCounter() as counter:
        pruned_ctc_loss(encoder_out, weight, None, targets, lengths, chunk_size=256,
                        blank_offset=eta).backward()
    one_product = sum(lengths) * weight.shape[0] * weight.shape[1]
    assert 1 <= counter.multiply_adds / one_product < 1.03
    _, _, _, expected_bias = dense_reference(encoder_out, weight,
                                             with_offset(None, 0.5, weight.shape[0]), targets,
                                             lengths)
    assert relative_error(eta.grad, expected_bias[0]) < 1e-5


@pytest.mark.filterwarnings("ignore::pruned_ctc.ExcludedUtteranceWarning")
def test_an_utterance_the_dp_excludes_leaves_exactly_the_others_input_gradients():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=17)
    bias[99] = float("-inf")  # utterance 1 needs class 99: its lattice is empty
    with pytest.warns(ExcludedUtteranceWarning):
        loss, grad_input, _ = frozen_run(encoder_out, weight, bias, targets, lengths,
                                         reduction="mean")
    keep = [0, 2, 3]
    finite_bias = bias.clone()
    finite_bias[99] = -1e4
    expected = reference(encoder_out[keep], weight, finite_bias, [targets[i] for i in keep],
                         [lengths[i] for i in keep], "mean")
    assert grad_input[1].abs().max() == 0
    assert relative_error(loss, expected[0]) < 1e-12
    assert relative_error(grad_input[keep], expected[1]) < 1e-11


def test_a_nonfinite_frame_excludes_its_utterance_only():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=18)
    encoder_out[3, 2, 0] = float("nan")
    with pytest.warns(ExcludedUtteranceWarning):
        loss, grad_input, _ = frozen_run(encoder_out, weight, bias, targets, lengths)
    keep = [0, 1, 2]
    expected = reference(encoder_out[keep], weight, bias, [targets[i] for i in keep],
                         [lengths[i] for i in keep])
    assert torch.isfinite(grad_input).all() and grad_input[3].abs().max() == 0
    assert relative_error(loss, expected[0]) < 1e-12
    assert relative_error(grad_input[keep], expected[1]) < 1e-11


@pytest.mark.parametrize("chunk_size", [64, 300])
def test_the_normalizer_of_peaky_rows_is_float64_accurate(chunk_size):
    vocab_size = 300
    frames, peaks = peaky_rows(400, vocab_size, seed=1)
    selected = torch.unique(torch.cat([torch.zeros(1, dtype=torch.long), peaks[:20]]))
    frozen = FrozenHeadPass(frames, torch.eye(vocab_size), None, None, selected, chunk_size,
                            Precision(), need_frames=True)
    expected = frames.double()[:, selected] - torch.logsumexp(frames.double(), dim=1,
                                                              keepdim=True)
    # S is rounded once to FP32 from a difference accurate to about 1e-9 (an FP32 sum of
    # the peak's 1.0 with the small terms would be off by about 1e-7): within half an ulp
    # of the exact value, up to that 1e-9.
    error = (frozen.selected_log_probs.double() - expected).abs()
    assert bool((error <= expected.abs() * 2.0 ** -24 + 1e-9).all())
    # The dense sum against the softmax of the unselected columns, from its definition.
    probabilities = frames.double().softmax(dim=1)
    probabilities[:, selected] = 0
    weighted = frozen.weighted(torch.ones(400))
    assert relative_error(weighted.grad_frames, probabilities.float()) < 1e-6


def test_backward_inside_autocast_gives_the_gradients_of_outside():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=19, dtype=torch.float32)
    outside = frozen_run(encoder_out, weight, bias, targets, lengths, offset=0.2)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        inside = frozen_run(encoder_out, weight, bias, targets, lengths, offset=0.2)
    for value, expected in zip(inside, outside):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_a_blank_offset_of_several_values_is_refused():
    encoder_out, weight, bias, targets, lengths = make_batch(seed=20)
    with pytest.raises(ValueError, match="blank_offset must hold one value"):
        pruned_ctc_loss(encoder_out, weight, bias, targets, lengths,
                        blank_offset=torch.zeros(2, dtype=torch.float64))
