"""LLM-CTC on a CUDA device: the loss against torch's CTC in FP64 over every head row, the
CPU model's loss, BF16 autocast gradients, and cached chunk-by-chunk streaming against the
parallel masked forward; skipped cleanly without one."""

import copy

import pytest
import torch

from llm_ctc.streaming.layout import Qwen3ASRGrid, utterance_layout
from llm_ctc.streaming.llm import CachedStreamingLLM, parallel_query_states
from references.ctc_reference import dense_reference
from references.cuda import exact_float32_convolutions  # noqa: F401 (autouse fixture)
from references.tiny_llm import WIDTH, random_features

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"
GRID = Qwen3ASRGrid()
TEXTS = ["the cat sat on the mat", "hello world"]


@pytest.fixture(scope="module")
def cuda_model(ctc_model):
    """The suite's shared LLM-CTC model (query readout, LoRA perturbed) copied to the device, exact DP."""
    model = copy.deepcopy(ctc_model).to(DEVICE)
    model.config.alignment_beam = None
    return model



def test_cuda_loss_is_dense_ctc_of_its_states_and_the_cpu_models_loss(cuda_model, ctc_model):
    features, lens = random_features([400, 250], seed=31)
    targets = cuda_model.encode_texts(TEXTS)
    with torch.no_grad():
        loss, _ = cuda_model.loss(features.to(DEVICE), lens.to(DEVICE), targets)
        states, state_lens = cuda_model.ctc_states(features.to(DEVICE), lens.to(DEVICE))
    assert loss.device.type == "cuda"
    losses, *_ = dense_reference(states.cpu(), cuda_model.head_weight.cpu(), cuda_model.head_bias().cpu(),
                                 targets, state_lens.cpu(), blank_id=cuda_model.blank_id)
    torch.testing.assert_close(loss.double().cpu(), losses.sum(), rtol=1e-6, atol=1e-3)
    cpu_model = copy.deepcopy(ctc_model)
    cpu_model.config.alignment_beam = None
    with torch.no_grad():
        cpu_loss, _ = cpu_model.loss(features, lens, targets)
    assert float(loss) == pytest.approx(float(cpu_loss), rel=1e-4)


def test_cuda_bfloat16_autocast_trains_the_query_lora_and_blank_offset(cuda_model):
    features, lens = random_features([400, 250], seed=32)
    targets = cuda_model.encode_texts(TEXTS)
    cuda_model.zero_grad()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss, _ = cuda_model.loss(features.to(DEVICE), lens.to(DEVICE), targets)
    loss.backward()
    assert torch.isfinite(loss)
    assert cuda_model.query.grad.abs().max() > 0 and cuda_model.blank_offset.grad.abs() > 0
    lora = [p.grad for name, p in cuda_model.named_parameters() if "lora_B" in name]
    assert lora and all(g is not None and torch.isfinite(g).all() for g in lora)
    assert any(g.abs().max() > 0 for g in lora)
    cuda_model.zero_grad()


@pytest.mark.parametrize("h", [1, 3])
def test_cuda_cached_streaming_equals_the_parallel_masked_forward(h, cuda_model):
    model = cuda_model.eval()
    layouts = [utterance_layout(len(model.prompt_ids), frames, GRID) for frames in ([200, 200, 200, 37], [150])]
    generator = torch.Generator().manual_seed(5)
    speech = torch.randn(len(layouts), max(l.num_frames for l in layouts), WIDTH, generator=generator).to(DEVICE)
    with torch.no_grad():
        parallel, lens = parallel_query_states(model, speech, layouts, h)
        for n, layout in enumerate(layouts):
            state, outputs, start = CachedStreamingLLM(model, h, GRID), [], 0
            for frames, count in zip(layout.chunk_frames, layout.chunk_lens):
                outputs.append(state.step(speech[n, start:start + count], frames))
                start += count
            cached = torch.cat(outputs)
            assert cached.device.type == "cuda"
            assert (cached - parallel[n, :layout.num_frames]).abs().max() <= 1e-4
