"""Launching the ranks of a 2-process CPU (gloo) training run for the DDP tests:
each runs tests/asr/ddp_rank.py with torchrun's environment variables and records
its steps (tests/asr/test_ddp.py, tests/llm_ctc/test_zero1_training.py); and one
process recording its steps the same way (train.virtual_ranks)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

import torch

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = REPO / "tests" / "asr" / "ddp_rank.py"
WORLD_SIZE = 2
TIMEOUT_SECONDS = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_ranks(overrides: List[str], records: List[Path], log_dir: Path, attempts: int = 3,
                 timeout: float = TIMEOUT_SECONDS) -> None:
    """Run every rank to completion on a free port (another if the port was taken meanwhile).

    Raises AssertionError with every rank's output if a rank failed or the run took
    longer than ``timeout`` seconds; the other ranks are stopped then.
    """
    for attempt in range(attempts):
        port = free_port()
        failure, codes, outputs = run_ranks(port, overrides, records, log_dir, timeout)
        if not failure:
            return
        if "address already in use" not in "".join(outputs).lower() or attempt == attempts - 1:
            report = "\n".join(f"--- rank {rank} (exit {code}) ---\n{output[-4000:]}"
                               for rank, (code, output) in enumerate(zip(codes, outputs)))
            raise AssertionError(f"DDP run on port {port}: {failure}\n{report}")


def run_ranks(port: int, overrides: List[str], records: List[Path], log_dir: Path,
              timeout: float = TIMEOUT_SECONDS) -> Tuple[str, List, List[str]]:
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
    deadline = time.monotonic() + timeout
    failure = ""
    while any(p.poll() is None for p in processes):
        failed = [rank for rank, p in enumerate(processes) if p.returncode not in (None, 0)]
        if failed:
            failure = f"rank(s) {failed} failed"
        elif time.monotonic() > deadline:
            failure = f"timed out after {timeout:.0f} s"
        if failure:
            stuck = [p for p in processes if p.poll() is None]
            if failure.startswith("timed out"):
                for p in stuck:  # each rank dumps its threads' stacks into its log
                    p.send_signal(signal.SIGUSR1)
                time.sleep(2.0)
            for p in stuck:
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


def run_one_process(exp_dir: Path, overrides: List[str], timeout: float = TIMEOUT_SECONDS) -> List[dict]:
    """The steps recorded by tests/asr/ddp_rank.py in one process (no torchrun
    environment) of one thread, as each rank of :func:`launch_ranks` runs."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    record = exp_dir / f"steps-{len(list(exp_dir.glob('steps-*.pt')))}.pt"
    done = subprocess.run([sys.executable, str(RANK_SCRIPT), str(record), *overrides], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:]
    return torch.load(record, weights_only=False)
