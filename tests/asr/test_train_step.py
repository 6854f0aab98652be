"""Specification of asr.train_step: ``train.accum_grad`` microbatches make the optimizer
update of their concatenated batch (float64, every family's loss being a sum), with one
clipping, one schedule step and one loss-scale step per update; under DDP only the last
microbatch all-reduces."""

from typing import List

import pytest
import torch

from asr.family import Recognizer
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from asr.train_step import Trainee, accumulate_gradients, apply_update, training_step, with_last_flag
from llm_ctc.optim import ClippedAdamW, WarmupCosine
from pruned_ctc import pruned_ctc_loss
from zipformer.optim import Eden, ScaledAdam

FEATURE_DIM, HIDDEN, VOCAB = 6, 5, 7


class LinearCTC(Recognizer):
    """A family model without randomness: features -> linear -> tanh -> head -> summed
    CTC (exact: beam None), float64 throughout."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.hidden = torch.nn.Parameter(torch.randn(HIDDEN, FEATURE_DIM, generator=generator, dtype=torch.float64))
        self.weight = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=generator, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.zeros(VOCAB, dtype=torch.float64))
        self.batch_counts: List[float] = []

    def start_update(self, update: int, batch_count: float) -> None:
        self.batch_counts.append(batch_count)

    def forward(self, features, feature_lens, targets, return_stats=True):
        states = torch.tanh(features @ self.hidden.T)
        return pruned_ctc_loss(states, self.weight, self.bias, targets, feature_lens, beam=None,
                               reduction="sum", return_stats=return_stats)

    def output_lengths(self, frames):
        return frames

    def log_probs(self, features, feature_lens):
        states = torch.tanh(features @ self.hidden.T)
        return (states @ self.weight.T + self.bias).log_softmax(-1), feature_lens


def microbatch(seed: int, utterances: int = 2, frames: int = 9) -> dict:
    """Utterances of one length (no padding, so that a concatenation pads nothing)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "features": torch.randn(utterances, frames, FEATURE_DIM, generator=generator, dtype=torch.float64),
        "feature_lens": torch.full((utterances,), frames, dtype=torch.int64),
        "targets": [torch.randint(1, VOCAB, (3,), generator=generator).tolist() for _ in range(utterances)],
    }


def concatenation(batches: List[dict]) -> dict:
    return {"features": torch.cat([b["features"] for b in batches]),
            "feature_lens": torch.cat([b["feature_lens"] for b in batches]),
            "targets": [t for b in batches for t in b["targets"]]}


def make_trainee(optimizer_kind: str, loss_scale: float = 1.0) -> Trainee:
    model = LinearCTC()
    if optimizer_kind == "clipped-adamw":
        # A clip norm below every update's gradient norm: clipping acts on each update.
        optimizer = ClippedAdamW(model.parameters(), clip_norm=0.5, lr=0.05, betas=(0.9, 0.95), eps=1e-6,
                                 weight_decay=0.1)
        scheduler = WarmupCosine(optimizer, warmup_batches=2, decay_batches=8)
    else:
        optimizer = ScaledAdam(model.parameters(), lr=0.045, clipping_scale=2.0)
        scheduler = Eden(optimizer, lr_batches=3, lr_epochs=1.5, warmup_batches=2)
    # A power-of-two loss scale is undone exactly: the scaler must scale every microbatch
    # and unscale the sum once.
    scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale, enabled=loss_scale != 1.0)
    return Trainee(model, optimizer, scheduler, scaler, "fp32", torch.device("cpu"), schedule_units_per_batch=2.5)


UPDATES = [[microbatch(10), microbatch(11)], [microbatch(12), microbatch(13, utterances=1)],
           [microbatch(14), microbatch(15), microbatch(16)]]


def assert_same_parameters(expected: Trainee, actual: Trainee) -> None:
    for (name, reference), parameter in zip(expected.model.named_parameters(), actual.model.parameters()):
        torch.testing.assert_close(parameter, reference, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("optimizer_kind, loss_scale", [
    ("clipped-adamw", 1.0), ("scaled-adam", 1.0), ("clipped-adamw", 1024.0)])
def test_accumulated_microbatches_make_the_update_of_their_concatenation(optimizer_kind, loss_scale) -> None:
    whole, accumulated = make_trainee(optimizer_kind, loss_scale), make_trainee(optimizer_kind, loss_scale)
    for update, microbatches in enumerate(UPDATES, start=1):
        batch = concatenation(microbatches)
        whole_loss, whole_frames, _ = training_step(whole, batch, batch["targets"], update)
        losses, frames = [], []
        for index, part in enumerate(microbatches):
            loss, part_frames, _ = accumulate_gradients(accumulated, part, part["targets"], update,
                                                        sync=index == len(microbatches) - 1)
            losses.append(loss)
            frames.append(part_frames)
        apply_update(accumulated, update)
        assert sum(losses) == pytest.approx(whole_loss, rel=1e-12) and sum(frames) == whole_frames
        assert_same_parameters(whole, accumulated)
    if optimizer_kind == "clipped-adamw":
        assert accumulated.optimizer.last_grad_norm > 0.5  # the clipping acted, once over the sum
    assert accumulated.scheduler.get_last_lr() == whole.scheduler.get_last_lr()
    # Every microbatch of update u sees the schedules' count of update u.
    assert accumulated.model.batch_counts == [2.5 * u for u, parts in enumerate(UPDATES, start=1) for _ in parts]


def test_the_update_sees_the_gradient_sum_not_the_last_microbatch() -> None:
    """A trainer that dropped the earlier microbatches' gradients would fail the test above
    only through the optimizer; here the gradient itself is compared."""
    trainee = make_trainee("clipped-adamw")
    first, second = UPDATES[0]
    accumulate_gradients(trainee, first, first["targets"], 1, sync=False)
    accumulate_gradients(trainee, second, second["targets"], 1)
    summed = [p.grad.clone() for p in trainee.model.parameters()]
    reference = LinearCTC()
    batch = concatenation([first, second])
    reference(batch["features"], batch["feature_lens"], batch["targets"])[0].backward()
    for gradient, parameter in zip(summed, reference.parameters()):
        torch.testing.assert_close(gradient, parameter.grad, rtol=1e-12, atol=1e-12)


def test_virtual_ranks_average_the_gradient_sum_after_the_backward_passes() -> None:
    """gradient_weight (train.virtual_ranks = 2): each microbatch's backward is the plain
    one (a DDP rank's), and the update sees half the summed gradient: the gradient a
    clipping optimizer clips is that of the two microbatches concatenated, halved."""
    trainee = make_trainee("clipped-adamw")
    trainee.gradient_weight = 0.5
    first, second = UPDATES[0]
    accumulate_gradients(trainee, first, first["targets"], 1, sync=False)
    after_first = [p.grad.clone() for p in trainee.model.parameters()]
    reference = LinearCTC()
    reference(first["features"], first["feature_lens"], first["targets"])[0].backward()
    for gradient, parameter in zip(after_first, reference.parameters()):
        torch.testing.assert_close(gradient, parameter.grad, rtol=1e-12, atol=1e-12)  # not yet halved
    accumulate_gradients(trainee, second, second["targets"], 1)
    summed = [p.grad.clone() for p in trainee.model.parameters()]
    apply_update(trainee, 1)
    reference.zero_grad()
    batch = concatenation([first, second])
    reference(batch["features"], batch["feature_lens"], batch["targets"])[0].backward()
    norm = torch.sqrt(sum((0.5 * p.grad).pow(2).sum() for p in reference.parameters())).item()
    assert trainee.optimizer.last_grad_norm == pytest.approx(norm, rel=1e-12)
    assert torch.sqrt(sum(g.pow(2).sum() for g in summed)).item() == pytest.approx(2 * norm, rel=1e-12)


def test_under_ddp_only_the_last_microbatch_all_reduces(one_rank_group) -> None:
    trainee = make_trainee("clipped-adamw")
    wrapped = DistributedDataParallel(trainee.model, find_unused_parameters=True)  # as asr.train wraps it
    trainee.trained_model = wrapped
    reductions: List[int] = []

    def counting_hook(state, bucket):
        reductions.append(bucket.buffer().numel())
        return _all_reduced(bucket)

    wrapped.register_comm_hook(None, counting_hook)
    parts = UPDATES[2]
    per_microbatch = []
    for index, part in enumerate(parts):
        before = len(reductions)
        accumulate_gradients(trainee, part, part["targets"], 1, sync=index == len(parts) - 1)
        per_microbatch.append(len(reductions) - before)
    assert per_microbatch[:-1] == [0, 0] and per_microbatch[-1] >= 1
    assert sum(reductions) == sum(p.numel() for p in trainee.model.parameters())


def _all_reduced(bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def test_with_last_flag_marks_only_the_last_item() -> None:
    assert list(with_last_flag(iter(["a", "b", "c"]))) == [("a", False), ("b", False), ("c", True)]
    assert list(with_last_flag([])) == []
    assert list(with_last_flag(["only"])) == [("only", True)]
