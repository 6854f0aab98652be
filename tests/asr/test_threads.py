"""asr/threads.py: the OpenMP spin count set before torch loads, and the threads chosen
from the cores idle at the start; the environment wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr.threads import choose_threads, idle_cores

REPO = Path(__file__).resolve().parents[2]


def spin_count_seen(environment: dict, first: str = "asr") -> str:
    code = f"import {first}, os, torch; import asr; print(os.environ.get('GOMP_SPINCOUNT', '-'))"
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(environment, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_asr_sets_a_short_spin_unless_the_environment_chose() -> None:
    assert spin_count_seen({}) == "1000"
    assert spin_count_seen({"GOMP_SPINCOUNT": "5"}) == "5"
    assert spin_count_seen({"OMP_WAIT_POLICY": "PASSIVE"}) == "-"
    assert spin_count_seen({}, first="torch") == "-"  # too late: the runtime has read its settings


def test_idle_cores_are_between_none_and_all() -> None:
    idle = idle_cores(0.05)
    assert idle is None or 0.0 <= idle <= os.cpu_count() + 1e-9


def test_a_requested_count_wins_and_omp_num_threads_is_kept(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        assert choose_threads(1) == 1
        torch.set_num_threads(before)
        monkeypatch.setenv("OMP_NUM_THREADS", "7")
        assert choose_threads() == before  # torch already took the environment's count
        monkeypatch.delenv("OMP_NUM_THREADS")
        chosen = choose_threads()
        assert 1 <= chosen <= os.cpu_count()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("idle, expected", [(0.2, 1), (1.0, 1), (1.6, 2), (2.0, 2)])
def test_threads_follow_the_idle_cores(monkeypatch, idle, expected) -> None:
    import asr.threads as threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "idle_cores", lambda seconds=0.1: idle)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    try:
        assert choose_threads() == expected
    finally:
        torch.set_num_threads(before)
