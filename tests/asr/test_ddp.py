"""Specification of asr.train under DDP: two CPU ranks (gloo) train on disjoint
batches and hold identical weights after every optimizer step.

Two processes run tests/asr/ddp_rank.py with torchrun's environment variables;
each records, through train.main's ``after_step`` hook, the cut ids it trained on and
its parameters after every step. The comparison happens here, on the records.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from references.ddp_launch import REPO, WORLD_SIZE, launch_ranks, run_one_process

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


def run_overrides(corpus: Dict[str, Path], exp_dir: Path) -> List[str]:
    return [
        "model.preset=tiny", f"train.exp_dir={exp_dir}", f"train.lang_dir={corpus['lang']}",
        f"data.train_cuts={corpus['train']}", f"data.valid_cuts={corpus['valid']}",
        f"data.musan_cuts={corpus['musan']}", "data.max_duration=4", "data.num_buckets=2",
        "data.num_workers=0", "train.num_epochs=2", "train.device=cpu", "train.precision=fp32",
        "train.tensorboard=false", "train.save_every_n=0", "train.log_interval=1",
        "train.valid_interval=1000",
    ]


@pytest.fixture(scope="module")
def rank_records(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> List[List[dict]]:
    exp_dir = tmp_path_factory.mktemp("ddp_exp")
    records = [exp_dir / f"steps-rank{rank}.pt" for rank in range(WORLD_SIZE)]
    launch_ranks(run_overrides(corpus, exp_dir), records, exp_dir)
    return [torch.load(path, weights_only=False) for path in records]


@pytest.fixture(scope="module")
def virtual_records(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> List[dict]:
    """One process training as the two ranks above (train.virtual_ranks=2)."""
    exp_dir = tmp_path_factory.mktemp("virtual_exp")
    return run_one_process(exp_dir, [*run_overrides(corpus, exp_dir), "train.virtual_ranks=2"])


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


def differences(parameters: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> Dict[str, float]:
    assert parameters.keys() == reference.keys()
    return {name: (tensor - reference[name]).abs().max().item() for name, tensor in parameters.items()
            if not torch.equal(tensor, reference[name])}


def test_one_process_as_two_ranks_trains_the_two_ranks_updates(rank_records: List[List[dict]],
                                                                virtual_records: List[dict]) -> None:
    """train.virtual_ranks=2 in one process: every update trains on both DDP ranks'
    microbatches (rank 0's, then rank 1's) and leaves DDP's weights, bit for bit (the sum
    of the two gradients times 1/2 is DDP's average, exactly in binary floating point)."""
    first, second = rank_records
    assert len(virtual_records) == len(first)
    for step, step_first, step_second in zip(virtual_records, first, second):
        assert (step["epoch"], step["batch_idx_train"]) == (step_first["epoch"], step_first["batch_idx_train"])
        assert step["cut_ids"] == step_first["cut_ids"] + step_second["cut_ids"]
        assert step["num_microbatches"] == step_first["num_microbatches"]
        assert step["loss"] == pytest.approx(step_first["loss"] + step_second["loss"], rel=1e-6)
        differing = differences(step["parameters"], step_first["parameters"])
        assert not differing, f"after update {step['batch_idx_train']}, the weights differ from DDP's: {differing}"


def test_a_two_process_run_continues_in_one_process_as_two_ranks(
        corpus: Dict[str, Path], rank_records: List[List[dict]], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Epoch 1 of the DDP run, continued by one process with train.virtual_ranks=2: the
    same batches and weights in epoch 2 (the checkpoint holds both ranks' random states)."""
    ddp_exp = tmp_path_factory.getbasetemp() / "ddp_exp0"
    exp_dir = tmp_path_factory.mktemp("continued_exp")
    shutil.copy(ddp_exp / "epoch-1.pt", exp_dir / "epoch-1.pt")
    continued = run_one_process(exp_dir, [*run_overrides(corpus, exp_dir), "train.virtual_ranks=2"])
    first, second = ([step for step in steps if step["epoch"] == 2] for steps in rank_records)
    assert [step["batch_idx_train"] for step in continued] == [step["batch_idx_train"] for step in first]
    for step, step_first, step_second in zip(continued, first, second):
        assert step["cut_ids"] == step_first["cut_ids"] + step_second["cut_ids"]
        assert not differences(step["parameters"], step_first["parameters"]), step["batch_idx_train"]


def test_one_process_as_two_ranks_resumes_mid_epoch_exactly(
        corpus: Dict[str, Path], virtual_records: List[dict], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Stopped after update 2 (checkpoint-2.pt: one sampler state for both ranks, the
    random states of both), rerun: the updates that follow are the uninterrupted run's."""
    exp_dir = tmp_path_factory.mktemp("resumed_exp")
    overrides = [*run_overrides(corpus, exp_dir), "train.virtual_ranks=2"]
    stopped = run_one_process(exp_dir, [*overrides, "train.max_batches=2"])
    assert [step["batch_idx_train"] for step in stopped] == [1, 2]
    assert len(torch.load(exp_dir / "checkpoint-2.pt", weights_only=False)["rng_per_rank"]) == 2
    resumed = run_one_process(exp_dir, overrides)
    assert [step["batch_idx_train"] for step in resumed] == [step["batch_idx_train"] for step in virtual_records[2:]]
    for step, reference in zip(resumed, virtual_records[2:]):
        assert step["cut_ids"] == reference["cut_ids"]
        assert not differences(step["parameters"], reference["parameters"]), step["batch_idx_train"]


def test_a_mid_epoch_checkpoint_refuses_another_number_of_ranks(
        corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    exp_dir = tmp_path_factory.mktemp("refused_exp")
    overrides = run_overrides(corpus, exp_dir)
    run_one_process(exp_dir, [*overrides, "train.virtual_ranks=2", "train.max_batches=1"])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    refused = subprocess.run([sys.executable, "-m", "asr.train", *overrides], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert refused.returncode != 0
    assert "continues a run of 2 rank(s)" in refused.stdout and "this run has 1" in refused.stdout
