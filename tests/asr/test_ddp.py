"""Specification of asr.train under DDP: two CPU ranks (gloo) train on disjoint
batches and hold identical weights after every optimizer step.

Two processes run tests/asr/ddp_rank.py with torchrun's environment variables;
each records, through train.main's ``after_step`` hook, the cut ids it trained on and
its parameters after every step. The comparison happens here, on the records.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = Path(__file__).with_name("ddp_rank.py")
WORLD_SIZE = 2
TIMEOUT_SECONDS = 180.0

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_ranks(overrides: List[str], records: List[Path], log_dir: Path, attempts: int = 3) -> None:
    """Run every rank to completion on a free port (another if the port was taken meanwhile).

    Raises AssertionError with every rank's output if a rank failed or the run took
    longer than TIMEOUT_SECONDS; the other ranks are stopped then.
    """
    for attempt in range(attempts):
        port = free_port()
        failure, codes, outputs = run_ranks(port, overrides, records, log_dir)
        if not failure:
            return
        if "address already in use" not in "".join(outputs).lower() or attempt == attempts - 1:
            report = "\n".join(f"--- rank {rank} (exit {code}) ---\n{output[-4000:]}"
                               for rank, (code, output) in enumerate(zip(codes, outputs)))
            raise AssertionError(f"DDP run on port {port}: {failure}\n{report}")


def run_ranks(port: int, overrides: List[str], records: List[Path], log_dir: Path) -> Tuple[str, List, List[str]]:
    """(what went wrong or "", exit codes, outputs) of one launch of every rank."""
    processes = []
    logs = []
    for rank in range(WORLD_SIZE):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE)}
        log = open(log_dir / f"rank{rank}.out", "w+")
        logs.append(log)
        processes.append(subprocess.Popen(
            [sys.executable, str(RANK_SCRIPT), str(records[rank]), *overrides],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_SECONDS
    failure = ""
    while any(p.poll() is None for p in processes):
        failed = [rank for rank, p in enumerate(processes) if p.returncode not in (None, 0)]
        if failed:
            failure = f"rank(s) {failed} failed"
        elif time.monotonic() > deadline:
            failure = f"timed out after {TIMEOUT_SECONDS:.0f} s"
        if failure:
            for p in processes:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.1)
    codes = [p.wait() for p in processes]
    if not failure and any(codes):
        failure = f"exit codes {codes}"
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return failure, codes, outputs


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
