"""Shared by the CUDA tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def exact_float32_convolutions():
    """cuDNN convolutions may use TF32 by default; the comparisons with the CPU or an FP64
    reference need FP32 (imported by a test module, it applies to each of its tests)."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved
