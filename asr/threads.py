"""How the toolkit's programs use the CPU's threads, so that a machine with other busy
processes slows a run down gracefully instead of collapsing it.

torch runs its intra-op work on an OpenMP team (libgomp in the CPU wheels). By default
a worker that finishes its share spins for a long while (GOMP_SPINCOUNT 300,000) waiting
for the next parallel region; when another process holds one of the cores, the spinning
workers and the one that has work take turns on the cores and every step waits on the
slowest. Measured on the 2-core machine (the mini Zipformer's training step, 8 utterances
of 5 s; `benchmarks/threads/`): 0.36-0.46 s idle and 1.35 s beside one busy process with
the default; ``OMP_WAIT_POLICY=PASSIVE`` 0.63 s idle / 0.70 s busy; GOMP_SPINCOUNT 1,000
0.43 s idle / 0.81-0.83 s busy. A spin count of 1,000 keeps the idle speed and
bounds the loss on a busy machine, so it is the default here.

It is read once, when libgomp loads (the first ``import torch``): :func:`prefer_short_spinning`
runs when the ``asr`` package is imported, before any program imports torch, and only
where neither ``GOMP_SPINCOUNT`` nor ``OMP_WAIT_POLICY`` is set (the user's choice wins).
The number of threads: :func:`choose_threads`, called by the programs (``asr.train``,
``asr.decode``, ``asr.transcribe``) at their start, gives torch the cores that are idle
then (sampled from /proc/stat over a tenth of a second), at least one: beside one busy
process on 2 cores one thread takes 0.63 s per step where two take 0.87 s. ``OMP_NUM_THREADS``
(or a program's ``--threads``) wins. Measured table: ``benchmarks/threads/results_cpu.md``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, Optional

DEFAULT_SPIN_COUNT = "1000"
_CHOSEN: Dict[str, str] = {}


def prefer_short_spinning() -> None:
    """Set GOMP_SPINCOUNT for the OpenMP runtime that torch will load, unless the
    environment already chose a wait policy."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        _CHOSEN["source"] = "environment"
        return
    if "torch" in sys.modules:
        _CHOSEN["source"] = "torch was imported first: its OpenMP defaults"
        return
    os.environ["GOMP_SPINCOUNT"] = DEFAULT_SPIN_COUNT
    _CHOSEN["source"] = "asr.threads default"


def idle_cores(seconds: float = 0.1) -> Optional[float]:
    """Cores left idle by every process over ``seconds`` (Linux /proc/stat), else None."""
    def sample():
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        return sum(values), values[3] + (values[4] if len(values) > 4 else 0)  # total, idle + iowait

    try:
        total_before, idle_before = sample()
        time.sleep(seconds)
        total_after, idle_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total_after <= total_before:
        return None
    return (os.cpu_count() or 1) * (idle_after - idle_before) / (total_after - total_before)


def choose_threads(requested: int = 0) -> int:
    """Set torch's intra-op threads: ``requested`` when > 0, torch's own choice when
    OMP_NUM_THREADS is set, else the cores idle now (at least 1). Returns the number."""
    import torch

    if requested > 0:
        _CHOSEN["threads"] = "requested"
        torch.set_num_threads(requested)
    elif "OMP_NUM_THREADS" in os.environ:
        _CHOSEN["threads"] = "OMP_NUM_THREADS"
    else:
        idle = idle_cores()
        cores = os.cpu_count() or 1
        if idle is not None:
            threads = max(1, min(cores, int(idle + 0.5)))
            _CHOSEN["threads"] = f"{idle:.1f} of {cores} cores idle at the start"
            torch.set_num_threads(threads)
    return torch.get_num_threads()


def describe() -> str:
    """What this process runs with, for the programs' logs."""
    import torch

    spin = os.environ.get("GOMP_SPINCOUNT", "-")
    policy = os.environ.get("OMP_WAIT_POLICY", "-")
    return (f"{torch.get_num_threads()} intra-op thread(s) ({_CHOSEN.get('threads', 'torch default')}); OpenMP GOMP_SPINCOUNT={spin}, OMP_WAIT_POLICY={policy} "
            f"({_CHOSEN.get('source', 'not set by asr')}); set OMP_NUM_THREADS, GOMP_SPINCOUNT or "
            "OMP_WAIT_POLICY to choose otherwise")
