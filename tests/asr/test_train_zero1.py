"""ZeRO-1 (asr/train_zero1.py) in one process (a gloo group of one rank): the sharded,
globally clipped optimizer makes the steps of the unsharded one, its consolidated state
loads back, and optimizers that cannot be sharded exactly are refused. The two-rank
runs through asr.train are in tests/llm_ctc/test_zero1_training.py."""


import pytest
import torch

from asr.train_zero1 import check_shardable, consolidate, zero1_optimizer
from llm_ctc.optim import ClippedAdamW, WarmupCosine


def make_parameters(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((6, 5), (5,), (3, 4))]


def groups_of(parameters):
    return [{"params": [parameters[0], parameters[2]], "weight_decay": 0.1},
            {"params": [parameters[1]], "weight_decay": 0.0}]


def run_steps(optimizer, scheduler, parameters, steps: int):
    generator = torch.Generator().manual_seed(7)
    for step in range(1, steps + 1):
        for parameter in parameters:
            # Large gradients, so that clipping at norm 1 acts on every step.
            parameter.grad = 10 * torch.randn(parameter.shape, generator=generator)
        scheduler.step_batch(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def make_clipped(parameters):
    optimizer = ClippedAdamW(groups_of(parameters), clip_norm=1.0, lr=1e-2, betas=(0.9, 0.95), eps=1e-6,
                             weight_decay=0.1)
    return optimizer, WarmupCosine(optimizer, warmup_batches=2, decay_batches=6)


def test_sharded_clipped_adamw_makes_the_unsharded_steps(one_rank_group) -> None:
    plain = make_parameters(0)
    run_steps(*make_clipped(plain), plain, steps=5)
    sharded = make_parameters(0)
    optimizer, scheduler = make_clipped(sharded)
    zero = zero1_optimizer(optimizer, scheduler)
    assert scheduler.optimizer is zero
    assert all(group["clip_norm"] == 0.0 for group in zero.optim.param_groups)  # the shards do not clip
    run_steps(zero, scheduler, sharded, steps=5)
    for expected, actual in zip(plain, sharded):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert zero.last_grad_norm > 1.0  # clipping was active


def test_the_schedule_reaches_the_shards(one_rank_group) -> None:
    parameters = make_parameters(1)
    optimizer, scheduler = make_clipped(parameters)
    zero = zero1_optimizer(optimizer, scheduler)
    run_steps(zero, scheduler, parameters, steps=1)
    # Step 1 of a 2-update warm-up: half the peak learning rate.
    assert [group["lr"] for group in zero.optim.param_groups] == pytest.approx([5e-3, 5e-3])


def test_the_consolidated_state_is_the_unsharded_format_and_loads_back(one_rank_group) -> None:
    plain = make_parameters(2)
    plain_optimizer, plain_scheduler = make_clipped(plain)
    run_steps(plain_optimizer, plain_scheduler, plain, steps=3)
    sharded = make_parameters(2)
    optimizer, scheduler = make_clipped(sharded)
    zero = zero1_optimizer(optimizer, scheduler)
    run_steps(zero, scheduler, sharded, steps=3)
    consolidate(zero)
    state = zero.state_dict()
    expected = plain_optimizer.state_dict()
    assert state["state"].keys() == expected["state"].keys()
    for index, values in expected["state"].items():
        for name, value in values.items():
            torch.testing.assert_close(state["state"][index][name], value, rtol=0, atol=0)
    # A fresh sharded optimizer loading it continues as the unsharded one does.
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in sharded]
    optimizer, scheduler = make_clipped(resumed)
    scheduler.load_state_dict(plain_scheduler.state_dict())
    zero_resumed = zero1_optimizer(optimizer, scheduler)
    zero_resumed.load_state_dict(state)
    for target, source in ((zero_resumed, resumed), (plain_optimizer, plain)):
        generator = torch.Generator().manual_seed(11)
        for parameter in source:
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        target.step()
    for expected_parameter, actual in zip(plain, resumed):
        torch.testing.assert_close(actual, expected_parameter, rtol=0, atol=0)


def test_scaled_adam_is_refused() -> None:
    from zipformer.optim import ScaledAdam

    optimizer = ScaledAdam([torch.nn.Parameter(torch.randn(4, 4))], lr=0.045)
    with pytest.raises(ValueError, match="train.zero1: the family's optimizer ScaledAdam cannot be sharded"):
        check_shardable(optimizer)
