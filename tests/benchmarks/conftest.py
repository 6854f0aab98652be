"""Fixtures of the benchmark tests: a benchmark program run as ``python -m
benchmarks.<name>`` from the repository root, in a fresh process that imports this
checkout's packages, and the CSV files the programs write."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_program(program: str, *arguments: str, check: bool = True, environment: Optional[dict] = None,
                 timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m program arguments...``; with ``check``, a failure is an AssertionError
    that shows the end of the program's stderr."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, **(environment or {}), PYTHONPATH=os.pathsep.join(paths))
    completed = subprocess.run([sys.executable, "-m", program, *arguments], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=timeout)
    if check and completed.returncode != 0:
        raise AssertionError(f"python -m {program} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return completed


def _read_csv(path: Path) -> list:
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="session")
def run_program() -> Callable[..., subprocess.CompletedProcess]:
    return _run_program


@pytest.fixture(scope="session")
def read_csv() -> Callable[[Path], list]:
    return _read_csv
