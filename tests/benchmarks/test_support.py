"""benchmarks.support: what the benchmark programs share."""

import signal

import pytest

from benchmarks.support import failure_reason, interleaved_times


def test_failure_reason_tells_out_of_memory_from_other_failures():
    for returncode, stderr in [
            (1, "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 160000000 bytes."),
            (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            (1, "Traceback (most recent call last):\nMemoryError"),
            (-signal.SIGKILL, "")]:
        assert failure_reason(returncode, stderr)[0], stderr
    assert failure_reason(1, "x\nValueError: bad frames") == (False, "ValueError: bad frames")
    assert failure_reason(-signal.SIGSEGV, "") == (False, "killed by SIGSEGV")


def test_interleaved_times_alternate_the_steps_and_take_medians_of_the_paired_ratios():
    calls = []
    seconds = {"standard": iter([9.0, 2.0, 4.0, 8.0]), "pruned": iter([9.0, 1.0, 3.0, 2.0])}

    def step(name):
        calls.append(name)
        return next(seconds[name])

    row = interleaved_times({name: (lambda name=name: step(name)) for name in seconds}, 3, reference="standard")
    assert calls == ["standard", "pruned"] * 4  # one warm-up each, then the rounds in turn
    assert row["rounds"] == 3 and row["standard_times_s"] == "2.000 4.000 8.000"
    assert row["standard_s"] == 4.0 and row["pruned_s"] == 2.0
    assert row["pruned_over_standard"] == pytest.approx(0.5)  # median of 1/2, 3/4, 2/8
    assert "standard_over_standard" not in row and row["load_min"] <= row["load_max"]
