"""Blockwise float32 head logits."""

import pytest
import torch

from llm_ctc.head import head_logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_blockwise_logits_equal_one_product(dtype, with_bias):
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(2, 3, 8, generator=generator).to(dtype)
    weight = torch.randn(1000, 8, generator=generator).to(dtype)
    bias = torch.randn(1000, generator=generator).to(dtype) if with_bias else None
    expected = states.double() @ weight.double().t() + (bias.double() if with_bias else 0)
    found = head_logits(states, weight, bias, rows_per_block=96)
    assert found.dtype == torch.float32 and found.shape == (2, 3, 1000)
    torch.testing.assert_close(found.double(), expected, rtol=1e-5, atol=1e-5)
