"""Specification of asr.train under DDP: two CPU ranks (gloo) train on disjoint
batches and hold identical weights after every optimizer step.

Two processes run tests/asr/ddp_rank.py with torchrun's environment variables;
each records, through train.main's ``after_step`` hook, the cut ids it trained on and
its parameters after every step. The comparison happens here, on the records.
"""

from pathlib import Path
from typing import Dict, List

import pytest
import torch

from references.ddp_launch import WORLD_SIZE, launch_ranks

# 12 cuts of 1.1-2.2 s with 4 s batches: about three batches per rank and epoch.
TRAIN = {
    f"utt-{index:02d}": (1.1 + 0.1 * index, text)
    for index, text in enumerate([
        "HELLO WORLD", "PRUNED CTC", "A SMALL TEST", "QUICK BROWN FOX", "JUMPS OVER",
        "THE LAZY DOG", "TWO RANKS", "ONE MODEL", "SAME WEIGHTS", "OTHER CUTS",
        "GLOO BACKEND", "LAST ONE",
    ])
}
VALID = {"utt-v": (1.5, "VALID")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, make_cut_corpus) -> Dict[str, Path]:
    return make_cut_corpus(tmp_path_factory.mktemp("ddp_corpus"), train=TRAIN, valid=VALID)


@pytest.fixture(scope="module")
def rank_records(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> List[List[dict]]:
    exp_dir = tmp_path_factory.mktemp("ddp_exp")
    overrides = [
        "model.preset=tiny", f"train.exp_dir={exp_dir}", f"train.lang_dir={corpus['lang']}",
        f"data.train_cuts={corpus['train']}", f"data.valid_cuts={corpus['valid']}",
        f"data.musan_cuts={corpus['musan']}", "data.max_duration=4", "data.num_buckets=2",
        "data.num_workers=0", "train.num_epochs=2", "train.device=cpu", "train.precision=fp32",
        "train.tensorboard=false", "train.save_every_n=0", "train.log_interval=1",
        "train.valid_interval=1000",
    ]
    records = [exp_dir / f"steps-rank{rank}.pt" for rank in range(WORLD_SIZE)]
    launch_ranks(overrides, records, exp_dir)
    return [torch.load(path, weights_only=False) for path in records]


@pytest.fixture(scope="module")
def rank_logs(rank_records, tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    exp_dir = tmp_path_factory.getbasetemp() / "ddp_exp0"
    return [(exp_dir / f"rank{rank}.out").read_text() for rank in range(WORLD_SIZE)]


def test_no_gradient_is_copied_into_a_bucket_of_other_strides(rank_logs: List[str]) -> None:
    # The Zipformer's channels-last convolutions return weight gradients with other strides
    # on size-1 dimensions; asr.train restrides them before DDP sees them.
    assert "epoch 1, batch 1 " in rank_logs[0]  # rank 0 logs the training (the others only warnings)
    for log in rank_logs:
        assert "Grad strides do not match bucket view strides" not in log


def test_every_rank_takes_the_same_number_of_steps(rank_records: List[List[dict]]) -> None:
    first, second = rank_records
    assert len(first) == len(second) >= 4
    assert [s["batch_idx_train"] for s in first] == [s["batch_idx_train"] for s in second]
    assert [s["epoch"] for s in first] == [s["epoch"] for s in second]
    assert {s["epoch"] for s in first} == {1, 2}


def test_the_ranks_train_on_disjoint_batches_in_every_epoch(rank_records: List[List[dict]]) -> None:
    first, second = rank_records
    for step_first, step_second in zip(first, second):
        assert step_first["cut_ids"] and step_second["cut_ids"]
        assert set(step_first["cut_ids"]) <= set(TRAIN) and set(step_second["cut_ids"]) <= set(TRAIN)
    for epoch in (1, 2):
        seen = [[cut for step in steps if step["epoch"] == epoch for cut in step["cut_ids"]]
                for steps in rank_records]
        assert len(seen[0]) == len(set(seen[0])) and len(seen[1]) == len(set(seen[1])), \
            f"epoch {epoch}: a rank trained twice on a cut: {seen}"
        assert not set(seen[0]) & set(seen[1]), f"epoch {epoch}: both ranks trained on {set(seen[0]) & set(seen[1])}"


def test_the_ranks_hold_identical_parameters_after_every_step(rank_records: List[List[dict]]) -> None:
    first, second = rank_records
    for step_first, step_second in zip(first, second):
        step = step_first["batch_idx_train"]
        assert step_first["parameters"].keys() == step_second["parameters"].keys()
        differing = {name: (tensor - step_second["parameters"][name]).abs().max().item()
                     for name, tensor in step_first["parameters"].items()
                     if not torch.equal(tensor, step_second["parameters"][name])}
        assert not differing, f"after step {step}, parameters differ between ranks (largest difference): {differing}"


def test_every_step_changes_the_parameters(rank_records: List[List[dict]]) -> None:
    """The identity above holds for weights that train, not for frozen ones."""
    steps = rank_records[0]
    for before, after in zip(steps, steps[1:]):
        changed = [name for name, tensor in after["parameters"].items()
                   if not torch.equal(tensor, before["parameters"][name])]
        assert len(changed) > len(after["parameters"]) // 2, f"step {after['batch_idx_train']}"
