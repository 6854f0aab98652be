"""The same assertions on a CUDA device; skipped cleanly without one."""

import pytest
import torch

from pruned_ctc import pruned_ctc_loss
from references.ctc_reference import dense_reference, relative_error

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("beam", [None, 100.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_dense_reference(beam, dtype):
    generator = torch.Generator().manual_seed(0)
    encoder_out = torch.randn(4, 40, 64, generator=generator)
    weight = torch.randn(20_011, 64, generator=generator) / 8
    bias = torch.randn(20_011, generator=generator) * 0.1
    targets = [[5, 5, 900, 20_000], [7, 3], [], [12_345] * 3]
    lengths = [40, 31, 9, 22]
    encoder_out, weight, bias = (t.to(dtype) for t in (encoder_out, weight, bias))
    reference = dense_reference(encoder_out.float(), weight.float(), bias.float(), targets,
                                lengths)
    tensors = [t.cuda().requires_grad_(True) for t in (encoder_out, weight, bias)]
    losses = pruned_ctc_loss(*tensors, targets, torch.tensor(lengths).cuda(), beam=beam,
                             chunk_size=4096, reduction="none")
    losses.sum().backward()
    tolerances = (1e-6, 1e-5, 1e-4, 1e-4) if dtype == torch.float32 else (1e-6, 1e-2, 1e-2, 1e-2)
    results = [losses] + [t.grad for t in tensors]
    for value, expected, tolerance in zip(results, reference, tolerances):
        assert relative_error(value.cpu(), expected) <= tolerance
    for tensor in tensors:
        assert tensor.grad.dtype == dtype and tensor.grad.device.type == "cuda"
