"""Gradient accumulation (``train.accum_grad=2``) through asr.train with two CPU ranks
(gloo), LLM-CTC on the tiny Qwen3 with the real 151,936-row head: DDP's all-reduce only
on each update's last microbatch (``no_sync`` before) still leaves the ranks with
identical weights after every update, and ZeRO-1 makes the same losses and weights.
Each rank runs tests/asr/ddp_rank.py (as tests/asr/test_ddp.py). The update itself
against the concatenated batch is tested in one process in tests/asr/test_train_step.py."""

from pathlib import Path
from typing import List

import pytest
import torch

from references.ddp_launch import WORLD_SIZE, launch_ranks
from references.tiny_llm import tiny_llm_training_arguments

TIMEOUT_SECONDS = 420.0
# Two two-rank runs of about 40 s each on 2 shared cores: out of the default suite.
pytestmark = pytest.mark.slow


def train_two_ranks(corpus, ctc_config, exp_dir: Path, *extra: str) -> List[List[dict]]:
    arguments = tiny_llm_training_arguments(corpus, ctc_config, exp_dir, "train.valid_interval=1000",
                                            "train.accum_grad=2", *extra, max_duration=2.3)
    records = [exp_dir / f"steps-rank{rank}.pt" for rank in range(WORLD_SIZE)]
    launch_ranks(arguments, records, exp_dir, timeout=TIMEOUT_SECONDS)
    return [torch.load(path, weights_only=False) for path in records]


@pytest.fixture(scope="module")
def plain_ddp(small_training_corpus, ctc_config, tmp_path_factory):
    return train_two_ranks(small_training_corpus, ctc_config, tmp_path_factory.mktemp("accum_ddp"))


@pytest.fixture(scope="module")
def zero1(small_training_corpus, ctc_config, tmp_path_factory):
    return train_two_ranks(small_training_corpus, ctc_config, tmp_path_factory.mktemp("accum_zero1"),
                           "train.zero1=true")


def test_updates_take_two_microbatches_on_every_rank(plain_ddp) -> None:
    first, second = plain_ddp
    assert len(first) == len(second) >= 3
    assert [s["num_microbatches"] for s in first] == [s["num_microbatches"] for s in second]
    assert {s["num_microbatches"] for s in first} <= {1, 2} and first[0]["num_microbatches"] == 2
    assert [s["batch_idx_train"] for s in first] == list(range(1, len(first) + 1))
    for step_first, step_second in zip(first, second):
        assert not set(step_first["cut_ids"]) & set(step_second["cut_ids"])


def test_the_ranks_hold_identical_parameters_after_every_update(plain_ddp) -> None:
    first, second = plain_ddp
    for step_first, step_second in zip(first, second):
        for name, tensor in step_first["parameters"].items():
            assert torch.equal(tensor, step_second["parameters"][name]), \
                f"after update {step_first['batch_idx_train']}, {name} differs between ranks"
    moved = [name for name, tensor in first[-1]["parameters"].items()
             if not torch.equal(tensor, first[0]["parameters"][name])]
    assert len(moved) > len(first[0]["parameters"]) // 2


def test_zero1_accumulates_as_plain_ddp(plain_ddp, zero1) -> None:
    for rank in range(WORLD_SIZE):
        assert len(plain_ddp[rank]) == len(zero1[rank])
        for expected, actual in zip(plain_ddp[rank], zero1[rank]):
            step = expected["batch_idx_train"]
            assert actual["cut_ids"] == expected["cut_ids"]
            assert actual["loss"] == pytest.approx(expected["loss"], rel=1e-6), f"rank {rank}, update {step}"
            for name, tensor in expected["parameters"].items():
                torch.testing.assert_close(actual["parameters"][name], tensor, rtol=1e-6, atol=1e-8,
                                           msg=lambda m: f"rank {rank}, update {step}, {name}: {m}")
