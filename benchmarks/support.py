"""What the benchmark and analysis programs share: synthetic batches (paper App. C.2),
the discarded posterior mass per alignment beam (App. B.3), memory probes, device
synchronization, the machine's description and load, runs of one configuration in a
fresh process, timings interleaved in one, and atomic writers with provenance lines.

Programs run from the repository root as ``python -m benchmarks.<experiment>`` and import
this module as ``benchmarks.support``; no program imports another program.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import random
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- synthetic batches
# App. C.2: every utterance contributes exactly 100 encoder frames; about 25 target
# tokens each, ids drawn with frequency 1 / r for the r-th non-blank class.
FRAMES_PER_UTTERANCE = 100
TOKENS_PER_UTTERANCE = 25
BLANK_ID = 0


def zipf_targets(vocab_size: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` non-blank ids in [1, V), class r with frequency proportional to 1 / r."""
    frequencies = 1.0 / torch.arange(1, vocab_size, dtype=torch.float64)
    return torch.multinomial(frequencies, count, replacement=True, generator=generator) + 1


def head_batch(vocab_size: int, num_frames: int, dim: int, device: str, seed: int = 0):
    """Encoder output (N, 100, D), head (V, D) + (V,), padded targets (N, 25) and the
    frame counts and target lengths, N = M / 100."""
    generator = torch.Generator().manual_seed(seed)
    num_utterances = num_frames // FRAMES_PER_UTTERANCE
    encoder_out = torch.randn(num_utterances, FRAMES_PER_UTTERANCE, dim, generator=generator)
    weight = torch.randn(vocab_size, dim, generator=generator) * dim ** -0.5
    bias = torch.zeros(vocab_size)
    targets = zipf_targets(vocab_size, num_utterances * TOKENS_PER_UTTERANCE, generator)
    targets = targets.view(num_utterances, TOKENS_PER_UTTERANCE)
    frame_counts = torch.full((num_utterances,), FRAMES_PER_UTTERANCE, dtype=torch.int64)
    target_lengths = torch.full((num_utterances,), TOKENS_PER_UTTERANCE, dtype=torch.int64)
    return tuple(t.to(device) for t in (encoder_out, weight, bias, targets, frame_counts,
                                        target_lengths))


# ---------------------------------------------------------------- discarded mass
def discarded_mass(head_input: torch.Tensor, frame_counts: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor], targets, beams: Sequence[float], chunk_size: int,
                   target_lengths=None, blank_id: int = 0) -> tuple[torch.Tensor, dict]:
    """(exact losses L_n (N,) float64, {beam: delta_n (N,) float64}) for head input (N, T, D)
    with T_n = frame_counts[n] (App. B.3): S is computed once, the alignment DP runs in FP64
    on it unpruned and at every beam, and delta_n = -expm1(-(L_beta,n - L_n)) is the
    posterior mass of the discarded alignments; an utterance whose retained lattice is
    empty has lost all its mass, delta_n = 1. Every utterance must be alignable."""
    from pruned_ctc import ExcludedUtteranceWarning, ReducedBatch, alignment_loss, reduce_vocabulary

    with torch.no_grad():
        reduced = reduce_vocabulary(head_input, weight, bias, targets, frame_counts,
                                    target_lengths=target_lengths, blank_id=blank_id,
                                    chunk_size=chunk_size)
    batch = reduced.batch
    if not bool(batch.alignable.all()):
        raise ValueError(f"{int((~batch.alignable).sum())} utterances have fewer frames than "
                         "their targets need")
    # The same S in FP64 (exactly): the DP returns losses in S's dtype, and delta needs the
    # FP64 difference of two losses.
    reduced = ReducedBatch(reduced.selected_log_probs.double(), batch)

    def retained(beam):
        with warnings.catch_warnings():
            # Narrow beams empty some lattices on purpose: delta_n = 1 below.
            warnings.simplefilter("ignore", ExcludedUtteranceWarning)
            return alignment_loss(reduced, beam=beam, reduction="none", return_stats=True)

    exact, _ = retained(None)
    deltas = {}
    for beam in beams:
        losses, stats = retained(beam)
        delta = -torch.expm1(-(losses - exact))
        deltas[beam] = torch.where(stats.excluded, torch.ones_like(delta), delta)
    return exact, deltas


# ---------------------------------------------------------------- chunk windows
# Paper Sec. 4.3, App. D.4: the chunk-window Zipformer reads, for each 2 s chunk, the h
# seconds before it and the chunk (fbank at 100 frames per second).
FRAMES_PER_SECOND = 100


def batch_windows(kind: str, max_duration: float, history: int, generator: random.Random) -> list[torch.Tensor]:
    """The encoder inputs of one batch's chunk windows (2 s chunks, ``history`` s) over
    random fbank: "sentences" of 2-4 s or "joined" examples of 8-10 s, filling at most
    ``max_duration`` seconds."""
    from asr.chunk_windows import chunk_windows
    from zipformer.windows import window_input

    low, high = (2.0, 4.0) if kind == "sentences" else (8.0, 10.0)
    windows, total = [], 0.0
    while True:
        seconds = generator.uniform(low, high)
        if total + seconds > max_duration:
            break
        total += seconds
        features = torch.randn(int(seconds * FRAMES_PER_SECOND), 80)
        windows += [window_input(past, chunk)[0] for past, chunk, _ in chunk_windows(features, 2, history)]
    return windows


# ---------------------------------------------------------------- memory and time
def cpu_memory_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process in MiB, from /proc/self/status."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def reset_cpu_peak() -> None:
    # Writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    """Starts a new peak: CUDA's allocator counters, or the CPU's peak resident set."""
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_cpu_peak()


def memory_mb(device: str, peak: bool) -> float:
    """Allocated (CUDA) or resident (CPU) MiB, now or at the peak since ``reset_peak``."""
    if device == "cuda":
        synchronize(device)
        counter = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
        return counter() / 2 ** 20
    return cpu_memory_mb("VmHWM" if peak else "VmRSS")


def peak_rss_mb() -> float:
    """This process's peak resident set so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Children start with glibc's mmap threshold fixed at 128 KiB: every freed block above it
# is unmapped, so that the resident set follows the live tensors.
FIXED_MMAP_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _mallopt(parameter: int, value: int) -> None:
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(parameter, value)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>


def unmap_freed_blocks() -> None:
    """What FIXED_MMAP_THRESHOLD does for a child, for this process from now on."""
    _mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def keep_freed_memory_for_reuse() -> None:
    """After the memory steps: glibc's usual state once its dynamic threshold has grown,
    blocks up to 32 MiB from the heap and reused, since re-mapping (page faulting) every
    block above 128 KiB slows a CPU step 2-5x."""
    _mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)
    _mallopt(M_TRIM_THRESHOLD, 64 * 2 ** 20)


# ---------------------------------------------------------------- fresh processes
RESULT_PREFIX = "RESULT "
OOM_MARKERS = ("out of memory", "outofmemoryerror", "can't allocate memory",
               "cannot allocate memory", "memoryerror", "std::bad_alloc")


def print_result(result: dict) -> None:
    """A child's answer to ``run_fresh``: one line on stdout."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def failure_reason(returncode: int, stderr: str) -> tuple[bool, str]:
    """(out of memory?, reason) for a child process that failed."""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else (
            str(-returncode))
        # SIGKILL is what the kernel's OOM killer sends.
        return -returncode == signal.SIGKILL, f"killed by {name}"
    lowered = stderr.lower()
    if any(marker in lowered for marker in OOM_MARKERS):
        return True, "out of memory"
    return False, (stderr.strip().splitlines() or [f"failed (exit status {returncode})"])[-1]


def limit_address_space(megabytes: int) -> Callable[[], None]:
    """A preexec_fn capping the child's address space at ``megabytes`` MB."""
    def preexec() -> None:
        limit = megabytes * 2 ** 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def checkout_environment(environment: Optional[dict] = None) -> dict:
    """This process's environment (plus ``environment``) with this checkout first on
    PYTHONPATH: a child imports this tree's packages, not an installed copy's."""
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, **(environment or {}), PYTHONPATH=os.pathsep.join(paths))


def run_fresh(program: str, arguments: Sequence[str], environment: Optional[dict] = None,
              preexec: Optional[Callable[[], None]] = None
              ) -> tuple[Optional[dict], subprocess.CompletedProcess]:
    """Runs ``python -m program arguments...`` in a fresh process (so that peaks and
    allocator state of one configuration do not reach the next) and returns its
    ``print_result`` dict, or None when it failed, with the completed process."""
    completed = subprocess.run([sys.executable, "-m", program, *arguments], capture_output=True,
                               text=True, env=checkout_environment(environment),
                               preexec_fn=preexec)
    lines = [line for line in completed.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        return None, completed
    return json.loads(lines[-1][len(RESULT_PREFIX):]), completed


def interleaved_times(steps: dict[str, Callable[[], float]], rounds: int,
                      reference: Optional[str] = None) -> dict:
    """Times the ``steps`` (name -> one timed run, in seconds) alternately, ``rounds``
    rounds after one warm-up each, so that a change of load hits them alike. Returns
    ``rounds``, the 1-minute load's range and, per name, ``<name>_s`` (the median) and
    ``<name>_times_s``; with a ``reference`` among the names, also
    ``<name>_over_<reference>``, the median of the per-round ratios."""
    for step in steps.values():
        step()
    times = {name: [] for name in steps}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(step())
        loads.append(os.getloadavg()[0])
    row = dict(rounds=rounds, load_min=min(loads), load_max=max(loads))
    for name, values in times.items():
        row[f"{name}_s"] = statistics.median(values)
        row[f"{name}_times_s"] = " ".join(f"{t:.3f}" for t in values)
        if reference in times and name != reference:
            row[f"{name}_over_{reference}"] = statistics.median(
                a / b for a, b in zip(values, times[reference]))
    return row


# ---------------------------------------------------------------- machine and writers
def load_average() -> str:
    """The 1, 5 and 15-minute load averages, e.g. "1.52/1.31/0.98"."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def machine_description(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
            f"load average {load_average()} when written")


def command_line() -> str:
    """The command that started this process: ``python -m benchmarks.<experiment> ...`` for
    a program run as a module (from the repository root), else the script's path."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        program = ["-m", spec.name.removesuffix(".__main__")]
    else:
        program = [Path(sys.argv[0]).as_posix()]
    return "python " + shlex.join(program + sys.argv[1:])


def provenance_lines(device: str) -> list[str]:
    """Markdown lines: the command that ran, the machine, torch and the date."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return [f"Command: `{command_line()}`", "",
            f"Machine: {machine_description(device)}; torch {torch.__version__}; date {stamp}"]


def write_csv(rows: list[dict], path: Path) -> None:
    """Writes rows (the union of their keys are the columns) to ``path`` atomically."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    temporary = path.with_name("." + path.name + ".tmp")
    with open(temporary, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, path)


def write_text(text: str, path: Path) -> None:
    """``text`` written to a temporary name beside ``path`` (its folder made), then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name("." + path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def add_grid_arguments(parser) -> None:
    """The CPU grid shared by the analyses: vocabularies, frames per batch, seeds."""
    parser.add_argument("--vocab-sizes", type=int, nargs="+",
                        default=[500, 2000, 10000, 50000, 100000])
    parser.add_argument("--frames", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
