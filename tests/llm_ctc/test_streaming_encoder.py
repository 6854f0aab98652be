"""The streaming encoder side: per-chunk counts follow the time grid, a chunk never sees
later audio nor audio older than h, and the Qwen3-ASR chunk rows are those of the
offline encoder on the same window."""

import pytest
import torch

from llm_ctc.config import LLMASRConfig
from llm_ctc.model import LLMCTCModel
from llm_ctc.streaming.encoder import streaming_speech_embeddings
from references.tiny_llm import random_features


@pytest.fixture(scope="module")
def qwen3_asr_model(tiny_qwen3_asr_dir, tokenizer_dir, qwen3_tokenizer):
    config = LLMASRConfig(llm=str(tiny_qwen3_asr_dir), tokenizer=str(tokenizer_dir), encoder_type="qwen3_asr",
                          encoder_path=str(tiny_qwen3_asr_dir), projector_type="mlp", projector_hidden=32,
                          projector_from_encoder=True, lora_rank=4, lora_alpha=4)
    return LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def model_and_dim(which, ctc_model, qwen3_asr_model):
    return (ctc_model, 80) if which == "zipformer" else (qwen3_asr_model, 128)


@pytest.mark.parametrize("which", ["zipformer", "qwen3_asr"])
def test_chunk_counts_follow_the_grid(which, ctc_model, qwen3_asr_model):
    model, dim = model_and_dim(which, ctc_model, qwen3_asr_model)
    features, lens = random_features([430, 203, 57], dim=dim, seed=1)
    with torch.no_grad():
        speech, layouts = streaming_speech_embeddings(model, features, lens, 2)
    assert [layout.chunk_frames for layout in layouts] == [[200, 200, 30], [200, 3], [57]]
    per_frame = 8 if which == "zipformer" else None  # 4 feature frames per encoder frame, stack 2
    for layout in layouts:
        if per_frame:
            assert layout.chunk_lens == [-(-f // per_frame) for f in layout.chunk_frames]
        else:
            assert layout.chunk_lens == [13 * (f // 100) + -(-(f % 100) // 8) for f in layout.chunk_frames]
    assert speech.shape[:2] == (3, layouts[0].num_frames)
    assert speech[1, layouts[1].num_frames:].abs().max() == 0
    assert speech[1, :layouts[1].num_frames].abs().min(dim=-1).values.gt(0).all()


@pytest.mark.parametrize("which", ["zipformer", "qwen3_asr"])
def test_a_chunk_sees_only_its_history_and_itself(which, ctc_model, qwen3_asr_model):
    model, dim = model_and_dim(which, ctc_model, qwen3_asr_model)
    features, lens = random_features([800], dim=dim, seed=2)
    old_changed, late_changed = features.clone(), features.clone()
    old_changed[0, :400] = torch.randn(400, dim)  # older than chunk 3's 2 s history (chunk 3: frames 600-800)
    late_changed[0, 700:] = torch.randn(100, dim)  # inside chunk 3: after chunks 0-2
    with torch.no_grad():
        speech, (layout,) = streaming_speech_embeddings(model, features, lens, 2)
        old, _ = streaming_speech_embeddings(model, old_changed, lens, 2)
        late, _ = streaming_speech_embeddings(model, late_changed, lens, 2)
    split = sum(layout.chunk_lens[:3])
    # Unaffected chunks are computed from identical windows: bit for bit equal. (The
    # tiny random Qwen3-ASR tower barely reacts to its input, hence "> 1e-7".)
    assert torch.equal(speech[0, split:], old[0, split:])
    assert (speech[0, :split] - old[0, :split]).abs().max() > 1e-7
    assert torch.equal(speech[0, :split], late[0, :split])
    assert (speech[0, split:] - late[0, split:]).abs().max() > 1e-7


def test_qwen3_asr_chunk_rows_are_the_window_encoder_rows(qwen3_asr_model):
    model = qwen3_asr_model
    features, lens = random_features([530], dim=128, seed=3)
    with torch.no_grad():
        speech, (layout,) = streaming_speech_embeddings(model, features, lens, 1)
        # Chunk 2 (frames 400-530) with 1 s history: the offline path on frames 300-530.
        window, _ = model.speech_embeddings(features[:, 300:530], torch.tensor([230]))
    start = sum(layout.chunk_lens[:2])
    count = layout.chunk_lens[2]
    assert count == 13 + 4
    assert (speech[0, start:start + count] - window[0, -count:]).abs().max() <= 1e-5
