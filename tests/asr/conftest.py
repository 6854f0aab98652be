"""Fixtures of the trainer tests."""

import socket

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def one_rank_group():
    """A gloo process group of one rank (ZeRO-1 and DDP in one process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
