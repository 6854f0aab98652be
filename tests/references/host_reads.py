"""Counting the operator calls that make the host wait for a device's result."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# Reading a value (item, bool, int), or an output whose size depends on the values: on a
# GPU each waits for every queued kernel.
HOST_READS = (aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique2,
              aten.unique_consecutive, aten.unique_dim, aten.repeat_interleave)


class HostReadCounter(TorchDispatchMode):
    """How many host-reading operators ran, by name."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in HOST_READS and not (packet is aten.repeat_interleave and "output_size" in kwargs):
            self.calls[packet.__name__] = self.calls.get(packet.__name__, 0) + 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.calls.values())
