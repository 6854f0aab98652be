"""Specifications of the Zipformer building blocks (zipformer/scaling.py)."""

import math

import pytest
import torch
from torch import nn

from zipformer.gradient_modifiers import Balancer, Whiten, penalize_abs_values_gt, whitening_metric
from zipformer.scaling import (
    ActivationDropoutAndLinear, BiasNorm, ScheduledFloat, limit_param_value, scaled_linear,
    set_batch_count,
    swoosh_derivative, swoosh_l, swoosh_l_reference, swoosh_r, swoosh_r_reference, swoosh_value,
)


def test_scheduled_float_is_piecewise_linear_in_batch_count():
    schedule = ScheduledFloat((0.0, 0.2), (4000.0, 0.05), (16000.0, 0.0), default=0.0)
    schedule.train()
    expected = {0: 0.2, 2000: 0.125, 4000: 0.05, 10000: 0.025, 16000: 0.0, 50000: 0.0,
                -5: 0.2}
    for batch_count, value in expected.items():
        schedule.batch_count = batch_count
        assert float(schedule) == pytest.approx(value, abs=1e-12)


def test_scheduled_float_gives_default_in_eval_or_without_batch_count():
    schedule = ScheduledFloat((0.0, 0.3), (20000.0, 0.1), default=0.1)
    schedule.train()
    assert float(schedule) == 0.1  # no batch count yet
    schedule.batch_count = 10000
    assert float(schedule) == pytest.approx(0.2)
    schedule.eval()
    assert float(schedule) == 0.1


def test_set_batch_count_reaches_nested_schedules():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(Balancer(2)))
    set_batch_count(model, 8000)
    balancer = model[1][0]
    balancer.train()
    assert float(balancer.prob) == pytest.approx(0.125)


def test_swoosh_values_match_their_formulas():
    x = torch.linspace(-20, 20, 401)
    assert torch.allclose(swoosh_r(x), torch.log1p(torch.exp(x - 1)) - 0.08 * x - 0.313261687,
                          atol=1e-5)
    assert torch.allclose(swoosh_l(x), torch.log1p(torch.exp(x - 4)) - 0.08 * x - 0.035,
                          atol=1e-5)
    assert abs(float(swoosh_r(torch.tensor(0.0)))) < 1e-6


@pytest.mark.parametrize("shift, offset", [(4.0, 0.035), (1.0, 0.313261687)])
def test_swoosh_value_is_the_formula_and_stays_finite(shift, offset):
    x = torch.cat([torch.linspace(-30, 30, 601, dtype=torch.float64),
                   torch.tensor([-500.0, -100.0, 90.0, 100.0, 500.0, 1e4], dtype=torch.float64)])
    # log(1 + e^z) exactly enough in float64: z + log1p(e^-z) for z > 0, log1p(e^z) below.
    z = x - shift
    softplus = torch.where(z > 0, z + torch.log1p(torch.exp(-z.abs())), torch.log1p(torch.exp(-z.abs())))
    expected = softplus - 0.08 * x - offset
    assert torch.allclose(swoosh_value(x, shift, offset), expected, rtol=0, atol=1e-12)
    # float32, where e^(x - shift) overflows above x = 88 + shift: finite and within rounding.
    got32 = swoosh_value(x.float(), shift, offset).double()
    assert torch.isfinite(got32).all()
    assert ((got32 - expected).abs() <= 4e-7 * expected.abs().clamp(min=4.0)).all()
    derivative = 1.0 / (1.0 + torch.exp(-z)) - 0.08  # d/dx: the logistic function of z, less the slope
    assert torch.allclose(swoosh_derivative(x, shift), derivative, rtol=0, atol=1e-12)


@pytest.mark.parametrize("activation, reference", [("SwooshL", swoosh_l_reference),
                                                   ("SwooshR", swoosh_r_reference)])
def test_activation_dropout_and_linear_gradients_in_float64_with_dropout(activation, reference):
    torch.manual_seed(1)
    fused = ActivationDropoutAndLinear(12, 5, activation=activation, dropout_p=0.3).double()
    fused.train()
    x = (torch.randn(3, 7, 12, dtype=torch.float64) * 4).requires_grad_(True)
    torch.manual_seed(2)
    y = fused(x)
    # The same dropout mask (shared over time), drawn again: the channels an identity layer zeroes.
    probe = ActivationDropoutAndLinear(12, 12, activation=activation, dropout_p=0.3).double()
    probe.train()
    torch.manual_seed(2)
    with torch.no_grad():
        probe.weight.copy_(torch.eye(12, dtype=torch.float64))
        probe.bias.zero_()
        mask = (probe(torch.full((3, 7, 12), 10.0, dtype=torch.float64)) != 0).double() / 0.7
    assert 0 < (mask == 0).double().mean() < 1
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = nn.functional.linear(reference(x_ref) * mask, fused.weight, fused.bias)
    assert torch.allclose(y, y_ref, rtol=0, atol=1e-12)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    grads = torch.autograd.grad(y_ref, [x_ref, fused.weight, fused.bias], upstream)
    assert torch.allclose(x.grad, grads[0], rtol=0, atol=1e-12)
    assert torch.allclose(fused.weight.grad, grads[1], rtol=0, atol=1e-12)
    assert torch.allclose(fused.bias.grad, grads[2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("fast, reference", [(swoosh_l, swoosh_l_reference),
                                             (swoosh_r, swoosh_r_reference)])
def test_swoosh_gradient_is_exact_to_one_byte(fast, reference):
    x = torch.randn(1000, dtype=torch.float32) * 5
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    fast(x1).sum().backward()
    reference(x2).sum().backward()
    assert (x1.grad - x2.grad).abs().max() <= 0.5 / 255 + 1e-6


def test_biasnorm_follows_its_formula():
    torch.manual_seed(0)
    norm = BiasNorm(6)
    with torch.no_grad():
        norm.bias.copy_(torch.arange(6.0) / 10)
        norm.log_scale.fill_(0.3)
    x = torch.randn(4, 5, 6)
    expected = x * math.exp(0.3) / ((x - norm.bias) ** 2).mean(-1, keepdim=True).sqrt()
    assert torch.allclose(norm(x), expected, atol=1e-6)


def test_biasnorm_uses_an_out_of_range_log_scale_as_it_is_in_training():
    norm = BiasNorm(4)
    with torch.no_grad():
        norm.log_scale.fill_(3.0)
    x = torch.randn(3, 4, dtype=torch.float64)
    norm.double().train()
    expected = x * math.exp(3.0) / ((x - norm.bias) ** 2).mean(-1, keepdim=True).sqrt()
    for _ in range(5):  # limit_param_value is applied at random: whichever way, no clamp
        assert torch.allclose(norm(x), expected, rtol=1e-12)


def test_limit_param_value_flips_only_gradients_pushing_out_of_range():
    x = torch.tensor([-1.0, -1.0, 0.5, 0.5, 2.0, 2.0], requires_grad=True)
    upstream = torch.tensor([3.0, -3.0, 4.0, -4.0, -5.0, 5.0])
    y = limit_param_value(x, 0.0, 1.0, prob=1.0)
    assert torch.equal(y, x)
    y.backward(upstream)
    # From the definition: below 0 a positive gradient (descent lowers x) and above 1 a
    # negative one (descent raises x) change sign; every other element is untouched.
    below, above = x.detach() < 0.0, x.detach() > 1.0
    pushing_out = (below & (upstream > 0)) | (above & (upstream < 0))
    assert torch.equal(x.grad, torch.where(pushing_out, -upstream, upstream))
    assert pushing_out.tolist() == [True, False, False, False, True, False]


def test_limit_param_value_is_identity_in_eval_and_rejects_an_empty_range():
    x = torch.tensor([5.0], requires_grad=True)
    limit_param_value(x, 0.0, 1.0, prob=1.0, training=False).backward(torch.tensor([-1.0]))
    assert x.grad.item() == -1.0
    with pytest.raises(ValueError, match="low 2.0 > high 1.0"):
        limit_param_value(x, 2.0, 1.0)


def test_balancer_is_identity_forward_and_pushes_violating_channel_back():
    torch.manual_seed(0)
    balancer = Balancer(3, min_positive=0.2, max_positive=0.8, min_abs=0.2, max_abs=10.0,
                        prob=1.0)
    balancer.train()
    x = torch.randn(200, 3)
    x[:, 0] = -x[:, 0].abs() - 1.0  # never positive: violates min_positive
    x.requires_grad_(True)
    y = balancer(x)
    assert torch.equal(y, x)
    upstream = torch.randn(200, 3)
    y.backward(upstream)
    extra = x.grad - upstream
    assert extra[:, 0].sum() < 0  # a descent step raises channel 0
    assert extra[:, 1:].abs().max() < 1e-6  # satisfied channels are untouched
    assert extra.abs().max() <= 0.04 * upstream.abs().max() * 20


def test_whitening_metric_is_one_for_white_and_channels_for_rank_one():
    torch.manual_seed(0)
    white = torch.randn(20000, 8)
    assert whitening_metric(white, 1).item() == pytest.approx(1.0, abs=0.02)
    rank_one = torch.randn(1000, 1) * torch.randn(1, 8)
    assert whitening_metric(rank_one, 1).item() == pytest.approx(8.0, rel=1e-4)


def test_whiten_gradient_reduces_the_metric():
    torch.manual_seed(0)
    whiten = Whiten(num_groups=1, whitening_limit=1.5, prob=(1.0, 1.0), grad_scale=0.1)
    whiten.train()
    x = (torch.randn(500, 1) * torch.randn(1, 6) + 0.3 * torch.randn(500, 6))
    x.requires_grad_(True)
    y = whiten(x)
    assert torch.equal(y, x)
    y.backward(torch.zeros_like(x) + 1e-3)
    before = whitening_metric(x.detach(), 1)
    after = whitening_metric(x.detach() - 10.0 * x.grad, 1)
    assert after < before


def test_activation_dropout_and_linear_matches_plain_modules():
    torch.manual_seed(0)
    fused = ActivationDropoutAndLinear(10, 7, activation="SwooshR", dropout_p=0.0)
    x = torch.randn(2, 5, 10, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = fused(x)
    y_ref = nn.functional.linear(swoosh_r_reference(x_ref), fused.weight, fused.bias)
    assert torch.allclose(y, y_ref, atol=1e-6)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    grads = torch.autograd.grad(y_ref, [x_ref, fused.weight, fused.bias], upstream)
    assert torch.allclose(x.grad, grads[0], atol=1e-5)
    assert torch.allclose(fused.weight.grad, grads[1], atol=1e-5)
    assert torch.allclose(fused.bias.grad, grads[2], atol=1e-5)


def test_activation_dropout_mask_is_shared_over_time():
    torch.manual_seed(0)
    fused = ActivationDropoutAndLinear(16, 16, activation="SwooshL", dropout_p=0.5)
    with torch.no_grad():
        fused.weight.copy_(torch.eye(16))
        fused.bias.zero_()
    fused.train()
    y = fused(torch.ones(3, 9, 16))
    zero_channels = (y == 0)
    assert torch.equal(zero_channels, zero_channels[:, :1].expand_as(zero_channels))
    assert 0 < zero_channels.float().mean() < 1


def test_scaled_linear_scales_the_default_initialisation():
    torch.manual_seed(0)
    plain = nn.Linear(256, 256)
    torch.manual_seed(0)
    scaled = scaled_linear(256, 256, initial_scale=0.05)
    assert torch.allclose(scaled.weight, plain.weight * 0.05)
    assert scaled.bias.abs().max() <= 0.005


def test_whitening_metric_pools_groups_so_unequal_group_energies_count():
    # Four zero-mean orthogonal +-1 columns of an 8x8 Hadamard matrix, the second group
    # doubled: covariance diag(8, 8, 32, 32); pooled over groups (icefall's
    # _whitening_metric): mean squared entry / squared mean diagonal = (2176/4) / 20^2.
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    columns = torch.kron(h2, torch.kron(h2, h2))[:, 1:5]  # (8 frames, 4), zero mean
    x = columns * torch.tensor([1.0, 1.0, 2.0, 2.0])
    assert torch.allclose(x.t() @ x, torch.diag(torch.tensor([8.0, 8, 32, 32])))
    assert whitening_metric(x, 2).item() == pytest.approx(544.0 / 400.0)


def test_penalize_abs_values_gt_adds_penalty_gradient_beyond_the_limit_only():
    x = torch.tensor([-30.0, -10.0, 0.0, 10.0, 30.0], requires_grad=True)
    y = penalize_abs_values_gt(x, 25.0, 1e-4)
    assert torch.equal(y, x)
    y.backward(torch.ones(5))
    assert torch.allclose(x.grad, torch.tensor([1 - 1e-4, 1.0, 1.0, 1.0, 1 + 1e-4]), rtol=0, atol=1e-7)
