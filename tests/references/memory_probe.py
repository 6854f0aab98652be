"""Peak bytes allocated by a call, from torch's profiler memory events (CPU allocator).

Independent of the code under test: the profiler records every allocation and free of
the CPU allocator; the running sum of their sizes in time order is the live memory, and
its maximum the peak above what was live before the call."""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile


def peak_allocated_bytes(function: Callable[[], object]) -> int:
    """Largest increase of live CPU allocations during ``function()``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        result = function()
    del result
    events = [event for event in profiler.profiler.kineto_results.events()
              if event.name() == "[memory]"]
    events.sort(key=lambda event: event.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak
