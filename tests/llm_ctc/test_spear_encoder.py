"""SPEAR as LLM-CTC's speech encoder (llm_ctc/encoders.py SpearSpeechEncoder), on the
SPEAR-layout icefall fixture of tests/data/spear_zipformer (icefall's own outputs)."""

from pathlib import Path

import pytest
import torch

from llm_ctc.config import LLMASRConfig
from llm_ctc.encoders import SpearSpeechEncoder, build_speech_encoder

FIXTURE = Path(__file__).parents[1] / "data" / "spear_zipformer"


@pytest.fixture(scope="module")
def reference():
    return torch.load(FIXTURE / "reference.pt", weights_only=False)


@pytest.fixture(scope="module")
def spear_config(tiny_qwen3_dir, tokenizer_dir):
    return LLMASRConfig(llm=str(tiny_qwen3_dir), tokenizer=str(tokenizer_dir), encoder_type="spear",
                        encoder_path=str(FIXTURE / "pretrained.pt"), projector_type="stack", projector_stack=5,
                        projector_hidden=48, lora_rank=4, lora_alpha=8, lora_dropout=0.0)


def test_registry_builds_spear_from_the_config(spear_config):
    encoder = build_speech_encoder(spear_config)
    assert isinstance(encoder, SpearSpeechEncoder)
    assert (encoder.feature_dim, encoder.output_dim) == (128, 32)


def test_padded_batch_gives_icefalls_embeddings_of_each_utterance(reference):
    encoder = SpearSpeechEncoder(str(FIXTURE / "pretrained.pt"), dtype=torch.float64)
    out, lens = encoder(reference["features"].double(), reference["lengths"])
    expected = reference["eval_float64"]
    assert lens.tolist() == expected["encoder_out_lens"]
    for i, n in enumerate(lens.tolist()):
        # float64 throughout; the CPU's kernels (FMA, summation order) move the relative error:
        # under 1e-10 on the machines before 2026-11-27, 1.3e-9 on that day's Intel Xeon; float32: ~1e-6.
        assert float((out[i, :n] - expected["encoder_out"][i]).norm() / expected["encoder_out"][i].norm()) < 1e-8
        assert not out[i, n:].any()


def test_encoder_is_frozen_and_stays_in_evaluation_mode():
    encoder = SpearSpeechEncoder(str(FIXTURE / "pretrained.pt"))
    encoder.train()
    assert not encoder.training and not encoder.zipformer.training
    assert not any(p.requires_grad for p in encoder.parameters())


def test_llm_positions_are_a_fifth_of_the_fifty_per_second_embeddings(spear_config, qwen3_tokenizer, reference):
    # App. D.3: 50 embeddings/s stacked by 5 into about 10 LLM positions per second.
    from llm_ctc.model import LLMCTCModel

    torch.manual_seed(4)
    model = LLMCTCModel(spear_config, tokenizer=qwen3_tokenizer)
    features, lengths = reference["features"], reference["lengths"]
    with torch.no_grad():
        _, readout_lens = model.ctc_states(features, lengths)
    embeddings = reference["eval_float64"]["encoder_out_lens"]
    assert readout_lens.tolist() == [-(-n // 5) for n in embeddings]
    assert model.output_lengths(lengths).tolist() == readout_lens.tolist()
    assert [model.output_lengths(int(n)) for n in lengths] == readout_lens.tolist()
    assert model.output_lengths(100 * 10 + 7) == 100  # 10 s of fbank -> 500 embeddings -> 100


def test_unknown_encoder_type_names_the_choices(tiny_qwen3_dir):
    with pytest.raises(ValueError, match="spear"):
        LLMASRConfig(llm=str(tiny_qwen3_dir), encoder_type="spearx", encoder_path="x")
