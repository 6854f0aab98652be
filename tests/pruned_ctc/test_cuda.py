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


def blank_offset_bias(vocab_size, offset):
    """The dense reference's bias for a head without one: LLM-CTC's blank offset on the
    blank (class 0) logit."""
    bias = torch.zeros(vocab_size, dtype=torch.float64)
    bias[0] = offset
    return bias


@pytest.mark.parametrize("autocast", [False, True])
def test_cuda_frozen_bfloat16_head_with_blank_offset_matches_dense_reference(autocast):
    """LLM-CTC's head (Sec. 4.2): a frozen BF16 head without bias and a trainable blank
    offset, the column schedule on CUDA, inside or outside bf16 autocast (as the toolkit
    trains on GPUs), against torch's CTC in FP64 over every row."""
    generator = torch.Generator().manual_seed(1)
    encoder_out = torch.randn(3, 30, 48, generator=generator)
    weight = (torch.randn(9_001, 48, generator=generator) / 4).to(torch.bfloat16)
    targets = [[4, 4, 8_000], [17, 2, 9_000, 3], [1]]
    lengths = [30, 26, 5]
    offset = 0.7
    reference = dense_reference(encoder_out, weight.float(), blank_offset_bias(weight.shape[0], offset), targets,
                                lengths)
    x = encoder_out.cuda().requires_grad_(True)
    eta = torch.tensor(offset, device="cuda", requires_grad=True)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = pruned_ctc_loss(x, weight.cuda(), None, targets, torch.tensor(lengths).cuda(),
                               blank_offset=eta, beam=None, chunk_size=1024)
    loss.backward()
    losses, grad_input, _, grad_bias = reference
    assert loss.dtype == torch.float32 and x.grad.device.type == "cuda"
    assert relative_error(loss.detach().cpu(), losses.sum()) <= 1e-5
    assert relative_error(x.grad.cpu(), grad_input) <= 1e-4
    assert relative_error(eta.grad.cpu(), grad_bias[0]) <= 1e-4
