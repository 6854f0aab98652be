"""The blockwise frozen-head cross-entropy of LLM-CE against torch's dense
cross-entropy in float64 over every head row."""

import pytest
import torch

from llm_ctc.ce_loss import frozen_head_cross_entropy


def _problem(rows=7, dim=16, vocab=1000, seed=0, scale=3.0, with_bias=True):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    weight = torch.randn(vocab, dim, generator=generator, dtype=torch.float64) * scale
    bias = torch.randn(vocab, generator=generator, dtype=torch.float64) if with_bias else None
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    return states, weight, bias, labels


def _dense(states, weight, bias, labels):
    logits = states.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")


@pytest.mark.parametrize("rows_per_block", [1000, 97, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_loss_and_gradient_equal_dense_float64(rows_per_block, with_bias):
    states, weight, bias, labels = _problem(with_bias=with_bias)
    reference_states = states.clone().requires_grad_(True)
    expected = _dense(reference_states, weight, bias, labels)
    expected.backward()
    ours_states = states.float().requires_grad_(True)
    loss = frozen_head_cross_entropy(ours_states, weight.float(), None if bias is None else bias.float(), labels,
                                     rows_per_block)
    (2.5 * loss).backward()  # the incoming gradient scales the stored one
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours_states.grad.double(), 2.5 * reference_states.grad, rtol=1e-4, atol=1e-5)


def test_large_logits_stay_finite():
    # Logits near 1e3: a block-wise sum of exp without the running maximum overflows.
    states, weight, bias, labels = _problem(scale=200.0, seed=3)
    states.requires_grad_(True)
    expected = _dense(states, weight, bias, labels)
    grad_expected, = torch.autograd.grad(expected, states)
    ours = states.detach().float().requires_grad_(True)
    loss = frozen_head_cross_entropy(ours, weight.float(), bias.float(), labels, 64)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(ours.grad).all()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-2)
    torch.testing.assert_close(ours.grad.double(), grad_expected, rtol=1e-4, atol=1e-3)


def test_bfloat16_states_get_a_bfloat16_gradient_of_the_float32_loss():
    states, weight, bias, labels = _problem(seed=5)
    low = states.to(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = frozen_head_cross_entropy(low, weight.float(), bias.float(), labels, 128)
    loss.backward()
    reference = low.detach().double().requires_grad_(True)
    expected = _dense(reference, weight, bias, labels)
    expected.backward()
    assert loss.dtype == torch.float32 and low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(low.grad.double(), reference.grad, rtol=2e-2, atol=2e-2)


def test_a_trainable_head_is_refused():
    states, weight, bias, labels = _problem()
    with pytest.raises(ValueError, match="must not require grad"):
        frozen_head_cross_entropy(states.float(), weight.float().requires_grad_(True), None, labels)


def test_labels_outside_the_head_are_refused():
    states, weight, _, labels = _problem(vocab=50)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 50\)"):
        frozen_head_cross_entropy(states.float(), weight.float(), None, labels + 50)
