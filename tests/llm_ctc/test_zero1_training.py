"""ZeRO-1 (``train.zero1``) through asr.train with two CPU ranks (gloo), LLM-CTC on the
tiny Qwen3 with the real 151,936-row head: the same losses and weights as plain DDP
after every step, a checkpoint with the consolidated optimizer state, and an exact
resume; and one process training as the two ranks (``train.virtual_ranks=2``). Each rank runs tests/asr/ddp_rank.py (as tests/asr/test_ddp.py)."""

import shutil
from pathlib import Path
from typing import List

import pytest
import torch

from references.ddp_launch import WORLD_SIZE, launch_ranks, run_one_process
from references.tiny_llm import tiny_llm_training_arguments

TIMEOUT_SECONDS = 420.0
# Three two-rank runs of about 40 s each on 2 shared cores: out of the default suite; the
# sharded step itself is tested in one process in tests/asr/test_train_zero1.py.
pytestmark = pytest.mark.slow


def overrides(corpus, ctc_config, exp_dir: Path, *extra: str) -> List[str]:
    return tiny_llm_training_arguments(corpus, ctc_config, exp_dir, "train.valid_interval=1000", *extra,
                                       max_duration=2.3)


def train_two_ranks(arguments: List[str], exp_dir: Path) -> List[List[dict]]:
    records = [exp_dir / f"steps-rank{rank}.pt" for rank in range(WORLD_SIZE)]
    launch_ranks(arguments, records, exp_dir, timeout=TIMEOUT_SECONDS)
    return [torch.load(path, weights_only=False) for path in records]


@pytest.fixture(scope="module")
def plain_ddp(small_training_corpus, ctc_config, tmp_path_factory):
    exp_dir = tmp_path_factory.mktemp("ddp_plain")
    return exp_dir, train_two_ranks(overrides(small_training_corpus, ctc_config, exp_dir), exp_dir)


@pytest.fixture(scope="module")
def zero1(small_training_corpus, ctc_config, tmp_path_factory):
    exp_dir = tmp_path_factory.mktemp("ddp_zero1")
    return exp_dir, train_two_ranks(overrides(small_training_corpus, ctc_config, exp_dir, "train.zero1=true"),
                                    exp_dir)


def test_zero1_makes_the_losses_and_weights_of_plain_ddp(plain_ddp, zero1) -> None:
    (_, plain), (_, sharded) = plain_ddp, zero1
    for rank in range(WORLD_SIZE):
        assert len(plain[rank]) == len(sharded[rank]) >= 4
        for expected, actual in zip(plain[rank], sharded[rank]):
            step = expected["batch_idx_train"]
            assert actual["batch_idx_train"] == step and actual["cut_ids"] == expected["cut_ids"]
            assert actual["loss"] == pytest.approx(expected["loss"], rel=1e-6), f"rank {rank}, step {step}"
            for name, tensor in expected["parameters"].items():
                torch.testing.assert_close(actual["parameters"][name], tensor, rtol=1e-6, atol=1e-8,
                                           msg=lambda m: f"rank {rank}, step {step}, {name}: {m}")


def test_one_process_as_two_ranks_makes_the_updates_of_plain_ddp(small_training_corpus, ctc_config, plain_ddp,
                                                                  tmp_path) -> None:
    """train.virtual_ranks=2 (asr/rank_group.py) on LLM-CTC with LoRA: both ranks' batches
    in every update, each under its rank's random state (LoRA's dropout), the same weights."""
    _, (first, second) = plain_ddp
    steps = run_one_process(tmp_path, overrides(small_training_corpus, ctc_config, tmp_path, "train.virtual_ranks=2"),
                            timeout=TIMEOUT_SECONDS)
    assert len(steps) == len(first) >= 4
    for step, expected, other in zip(steps, first, second):
        assert step["batch_idx_train"] == expected["batch_idx_train"]
        assert step["cut_ids"] == expected["cut_ids"] + other["cut_ids"]
        assert step["loss"] == pytest.approx(expected["loss"] + other["loss"], rel=1e-6)
        for name, tensor in expected["parameters"].items():
            torch.testing.assert_close(step["parameters"][name], tensor, rtol=1e-6, atol=1e-8,
                                       msg=lambda m: f"update {step['batch_idx_train']}, {name}: {m}")


def test_zero1_checkpoint_holds_the_whole_optimizer_state(plain_ddp, zero1) -> None:
    (plain_dir, _), (zero_dir, _) = plain_ddp, zero1
    plain = torch.load(plain_dir / "epoch-2.pt", weights_only=False)["optimizer"]
    sharded = torch.load(zero_dir / "epoch-2.pt", weights_only=False)["optimizer"]
    assert sharded["state"].keys() == plain["state"].keys() and len(plain["state"]) > 4
    for index, values in plain["state"].items():
        for name, value in values.items():
            torch.testing.assert_close(sharded["state"][index][name], value, rtol=1e-5, atol=1e-9)


def test_zero1_resumes_exactly(small_training_corpus, ctc_config, zero1, tmp_path) -> None:
    zero_dir, _ = zero1
    for name in ("checkpoint-2.pt",):
        shutil.copy(zero_dir / name, tmp_path / name)
    train_two_ranks(overrides(small_training_corpus, ctc_config, tmp_path, "train.zero1=true",
                              "train.start_batch=2"), tmp_path)
    first = torch.load(zero_dir / "epoch-2.pt", weights_only=False)
    second = torch.load(tmp_path / "epoch-2.pt", weights_only=False)
    for entry in ("model", "model_avg"):
        for name, tensor in first[entry].items():
            assert torch.equal(tensor, second[entry][name]), f"{entry}.{name} differs after resume"
    for index, values in first["optimizer"]["state"].items():
        for name, value in values.items():
            assert torch.equal(second["optimizer"]["state"][index][name], value)
