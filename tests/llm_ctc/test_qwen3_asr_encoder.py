"""Qwen3-ASR as encoder (and LLM) source, through transformers' own classes."""

import pytest
import torch

from llm_ctc.config import LLMASRConfig
from llm_ctc.model import LLMCTCModel
from references.tiny_llm import random_features


@pytest.fixture(scope="module")
def qwen3_asr_model(tiny_qwen3_asr_dir, tokenizer_dir, qwen3_tokenizer):
    config = LLMASRConfig(llm=str(tiny_qwen3_asr_dir), tokenizer=str(tokenizer_dir), encoder_type="qwen3_asr",
                          encoder_path=str(tiny_qwen3_asr_dir), projector_type="mlp", projector_hidden=32,
                          projector_from_encoder=True, lora_rank=4, lora_alpha=4)
    return LLMCTCModel(config, tokenizer=qwen3_tokenizer)


@pytest.fixture(scope="module")
def reference_model(tiny_qwen3_asr_dir):
    from transformers import Qwen3ASRForConditionalGeneration

    return Qwen3ASRForConditionalGeneration.from_pretrained(tiny_qwen3_asr_dir).eval()


def test_speech_embeddings_equal_qwen3_asr_audio_features(qwen3_asr_model, reference_model):
    lengths = [330, 123, 250]
    features, lens = random_features(lengths, dim=128, seed=7)
    with torch.no_grad():
        ours, our_lens = qwen3_asr_model.speech_embeddings(features, lens)
        for n, length in enumerate(lengths):
            padded = -(-length // 100) * 100
            mel = torch.zeros(1, 128, padded)
            mel[0, :, :length] = features[n, :length].t()
            mask = (torch.arange(padded) < length).long()[None]
            expected = reference_model.get_audio_features(mel, mask).pooler_output
            assert our_lens[n].item() == expected.shape[0]
            torch.testing.assert_close(ours[n, :our_lens[n]], expected, rtol=1e-5, atol=1e-5)
    # 13 embeddings per 100 mel frames (1 s), as the Qwen3-ASR encoder gives.
    assert our_lens.tolist() == [43, 16, 33]


def test_llm_is_the_qwen3_asr_language_model_and_head(qwen3_asr_model, reference_model):
    assert qwen3_asr_model.head_weight.shape == reference_model.lm_head.weight.shape
    assert torch.equal(qwen3_asr_model.head_weight, reference_model.lm_head.weight)
    features, lens = random_features([200, 150], dim=128, seed=8)
    targets = qwen3_asr_model.encode_texts(["hi there", "ok"])
    loss, stats = qwen3_asr_model.loss(features, lens, targets)
    assert torch.isfinite(loss) and stats["excluded"] == 0


def test_projector_from_encoder_needs_matching_widths(tiny_qwen3_asr_dir, tokenizer_dir, qwen3_tokenizer):
    config = LLMASRConfig(llm=str(tiny_qwen3_asr_dir), tokenizer=str(tokenizer_dir), encoder_type="qwen3_asr",
                          encoder_path=str(tiny_qwen3_asr_dir), projector_type="mlp", projector_hidden=48,
                          projector_from_encoder=True, lora_rank=0)
    with pytest.raises(ValueError, match="projector_hidden"):
        LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def test_top_blocks_of_qwen3_asr_are_its_last_layers(tiny_qwen3_asr_dir):
    """model.encoder_trained_blocks=1 on Qwen3-ASR's tower: its last transformer layer and
    final norm train, and only they get a gradient from the embeddings."""
    from llm_ctc.encoders import Qwen3ASRSpeechEncoder

    encoder = Qwen3ASRSpeechEncoder(str(tiny_qwen3_asr_dir))
    last = len(encoder.audio_tower.layers) - 1
    encoder.unfreeze(1)
    trained = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trained and all(name.startswith((f"audio_tower.layers.{last}.", "audio_tower.ln_post."))
                           for name in trained), trained
    assert {name.split(".")[1] for name in trained} == {"layers", "ln_post"}
    features, lengths = random_features([300, 200], dim=encoder.feature_dim, seed=5)
    embeddings, _ = encoder(features, lengths)
    embeddings.square().sum().backward()
    assert all((p.grad is not None) == (name in trained) for name, p in encoder.named_parameters())
