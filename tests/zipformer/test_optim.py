"""Specifications of ScaledAdam and Eden (zipformer/optim.py) against the rules of
icefall's egs/librispeech/ASR/zipformer/optim.py (ScaledAdam.step, Eden.get_lr)."""

import copy
import math
import statistics

import pytest
import torch

from zipformer.optim import Eden, ScaledAdam


class PlainScaledAdam:
    """The ScaledAdam update rule written one tensor at a time, for comparison."""

    def __init__(self, params, lr, clipping_scale, betas=(0.9, 0.98), scalar_lr_scale=0.1,
                 eps=1e-8, param_min_rms=1e-5, param_max_rms=3.0, scalar_max=10.0,
                 size_update_period=4, clipping_update_period=100):
        self.params = params
        self.lr, self.clipping_scale = lr, clipping_scale
        self.beta1, self.beta2 = betas
        self.scalar_lr_scale, self.eps = scalar_lr_scale, eps
        self.min_rms, self.max_rms, self.scalar_max = param_min_rms, param_max_rms, scalar_max
        self.period, self.clip_period = size_update_period, clipping_update_period
        self.step_count, self.norms, self.threshold, self.num_clipped = 0, [], None, 0
        self.v = [torch.zeros_like(p) for p in params]
        self.m = [torch.zeros_like(p) for p in params]
        self.rms = [float(p.pow(2).mean().sqrt()) for p in params]
        self.scale_grads = [[0.0] * size_update_period for _ in params]
        self.w = [0.0 for _ in params]

    def clipping_factor(self, grads):
        t = self.step_count
        total = 0.0
        for p, g, rms in zip(self.params, grads, self.rms):
            if p.numel() == 1:
                total += float((self.scalar_lr_scale * g) ** 2)
            else:
                total += float((g ** 2).sum()) * rms ** 2
        norm = math.sqrt(total)
        self.norms = (self.norms + [norm])[-self.clip_period:]
        median = float(torch.tensor(self.norms).median())
        if t > 0 and t % self.clip_period == 0:
            self.threshold = self.clipping_scale * median
        elif t < self.clip_period and t in (10, 20, 40):
            self.threshold = 2 * self.clipping_scale * median
        if t == 0 or self.threshold is None or norm <= self.threshold:
            return 1.0
        self.num_clipped += 1
        return self.threshold / norm

    def step(self, grads):
        t = self.step_count
        kappa = self.clipping_factor(grads)
        correction = 1 - self.beta2 ** (t + 1)
        for i, (p, g) in enumerate(zip(self.params, grads)):
            g = g * kappa
            self.v[i] = self.beta2 * self.v[i] + (1 - self.beta2) * g * g
            v_hat = self.v[i] / correction if correction < 0.99 else self.v[i]
            if p.numel() == 1:
                delta = -self.lr * self.scalar_lr_scale * g / (v_hat.sqrt() + self.eps)
                self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * delta
                p.copy_((p + self.m[i]).clamp(-self.scalar_max, self.scalar_max))
                continue
            self.scale_grads[i][t % self.period] = float((p * g).sum())
            size_delta = 0.0
            if t % self.period == self.period - 1:
                self.rms[i] = float(p.pow(2).mean().sqrt())
                b4 = self.beta2 ** self.period
                self.w[i] = b4 * self.w[i] + (1 - b4) * statistics.fmean(
                    s * s for s in self.scale_grads[i])
                k = (t + 1) // self.period
                step = (-self.lr * self.scalar_lr_scale * math.sqrt(1 - b4 ** k)
                        * sum(self.scale_grads[i]) / (math.sqrt(self.w[i]) + self.eps))
                if self.rms[i] < self.min_rms:
                    step = 0.0
                step = min(max(step, -0.1), 0.1)
                step = min(step, (self.max_rms - self.rms[i]) / self.rms[i])
                size_delta = step * p
            delta = -self.lr * g / (v_hat.sqrt() + self.eps) * max(self.rms[i], self.min_rms)
            delta = delta + size_delta
            self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * delta
            p.add_(self.m[i])
        self.step_count += 1


def make_params(seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (4, 3), (4, 3), (5,), (2, 3, 2), (1,), ()]
    return [torch.randn(shape, generator=generator) * 0.5 for shape in shapes]


def gradients(step, params):
    generator = torch.Generator().manual_seed(100 + step)
    spike = 50.0 if step in (5, 9) else 1.0  # large steps that the threshold clips
    return [torch.randn(p.shape, generator=generator) * spike for p in params]


def run_scaled_adam(optimizer, params, steps):
    for step in steps:
        for p, g in zip(params, gradients(step, params)):
            p.grad = g.clone()
        optimizer.step()


def test_scaled_adam_matches_a_plain_per_tensor_implementation():
    options = dict(lr=0.05, clipping_scale=2.0, clipping_update_period=4)
    params = [torch.nn.Parameter(p) for p in make_params()]
    optimizer = ScaledAdam(params, **options)
    reference_params = make_params()
    reference = PlainScaledAdam(reference_params, **options)
    for step in range(10):
        run_scaled_adam(optimizer, params, [step])
        reference.step(gradients(step, reference_params))
        for p, q in zip(params, reference_params):
            assert torch.allclose(p.detach(), q, atol=1e-6, rtol=1e-5), step
    assert reference.num_clipped >= 2
    assert optimizer.param_groups[0]["num_clipped"] == reference.num_clipped
    # The update really is scale-relative and moved every tensor.
    for p, q in zip(params, make_params()):
        assert not torch.equal(p.detach(), q)


def test_scaled_adam_clamps_scalars():
    scalar = torch.nn.Parameter(torch.tensor(9.99))
    optimizer = ScaledAdam([scalar], lr=10.0, clipping_scale=None)
    for _ in range(5):
        scalar.grad = torch.tensor(-1.0)
        optimizer.step()
    assert float(scalar.detach()) == 10.0


def test_scaled_adam_drops_a_step_with_a_nonfinite_gradient_norm():
    weight = torch.nn.Parameter(torch.ones(3, 3))
    optimizer = ScaledAdam([weight], lr=0.1)
    weight.grad = torch.full((3, 3), float("nan"))
    optimizer.step()
    assert torch.equal(weight.detach(), torch.ones(3, 3))


def test_scaled_adam_resumes_exactly_from_its_state_dict():
    options = dict(lr=0.05, clipping_scale=2.0, clipping_update_period=4)
    params = [torch.nn.Parameter(p) for p in make_params()]
    optimizer = ScaledAdam(params, **options)
    run_scaled_adam(optimizer, params, range(6))
    saved_params = [p.detach().clone() for p in params]
    saved_state = copy.deepcopy(optimizer.state_dict())  # as torch.save would freeze it
    run_scaled_adam(optimizer, params, range(6, 10))

    resumed = [torch.nn.Parameter(p.clone()) for p in saved_params]
    resumed_optimizer = ScaledAdam(resumed, **options)
    resumed_optimizer.load_state_dict(saved_state)
    run_scaled_adam(resumed_optimizer, resumed, range(6, 10))
    for p, q in zip(params, resumed):
        assert torch.equal(p.detach(), q.detach())


def eden_formula(base_lr, batch, epoch, lr_batches=7500.0, lr_epochs=3.5,
                 warmup_batches=500.0, warmup_start=0.5):
    warmup = (warmup_start + (1 - warmup_start) * batch / warmup_batches
              if batch < warmup_batches else 1.0)
    return (base_lr * ((batch ** 2 + lr_batches ** 2) / lr_batches ** 2) ** -0.25
            * ((epoch ** 2 + lr_epochs ** 2) / lr_epochs ** 2) ** -0.25 * warmup)


@pytest.mark.parametrize("batch, epoch", [(0, 0), (100, 0), (499, 0), (500, 1), (7500, 3),
                                          (60000, 20), (250, 2)])
def test_eden_follows_its_formula(batch, epoch):
    optimizer = ScaledAdam([torch.nn.Parameter(torch.ones(2, 2))], lr=0.045)
    scheduler = Eden(optimizer)
    scheduler.step_epoch(epoch)
    scheduler.step_batch(batch)
    assert scheduler.get_last_lr()[0] == pytest.approx(eden_formula(0.045, batch, epoch),
                                                       rel=1e-12)


def test_eden_known_values():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.045)
    scheduler = Eden(optimizer, warmup_start=0.1)
    assert scheduler.get_last_lr()[0] == pytest.approx(0.0045)
    scheduler.step_batch(7500)
    scheduler.step_epoch(0)
    assert scheduler.get_last_lr()[0] == pytest.approx(0.045 * 2 ** -0.25)


def test_eden_state_dict_round_trips():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.04)
    scheduler = Eden(optimizer, lr_batches=5000, lr_epochs=6)
    scheduler.step_batch(1234)
    scheduler.step_epoch(3)
    state = scheduler.state_dict()
    other_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.04)
    other = Eden(other_optimizer)
    other.load_state_dict(state)
    assert other.get_last_lr() == scheduler.get_last_lr()
    assert (other.lr_batches, other.lr_epochs) == (5000.0, 6.0)
