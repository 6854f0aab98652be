"""local.llm_size_settings: the overlay of a Qwen3 size, found from the LLM's name, and
its own settings as overrides (egs/gigaspeech/run.sh stages 22-25)."""

import pytest

from asr.config import load_run_config
from local.llm_size_settings import qwen3_size, size_settings


@pytest.mark.parametrize("llm, size", [
    ("Qwen/Qwen3-32B", "32b"), ("Qwen/Qwen3-14B-Base", "14b"), ("qwen3-0.6b", "0.6b"),
    ("/models/Qwen3-14B/", "14b"), ("Qwen/Qwen3-ASR-1.7B", "1.7b"), ("data/full/tiny_qwen3", None),
    ("Qwen/Qwen3-14Bx", None),
])
def test_the_size_is_read_from_the_name(llm, size):
    assert qwen3_size(llm) == size


@pytest.fixture
def conf(tmp_path):
    (tmp_path / "base.yaml").write_text("family: llm_ctc\noptim:\n  decay_batches: 1000\n")
    (tmp_path / "llm_ctc_enc.yaml").write_text("base: base.yaml\nmodel:\n  encoder_type: spear\n")
    (tmp_path / "llm_ctc_32b.yaml").write_text(
        "base: base.yaml\nmodel:\n  activation_checkpointing: true\n  lora_targets: q_proj,v_proj\n"
        "optim:\n  lr: 0.00005\ndata:\n  max_duration: .inf\n")
    return tmp_path


def test_the_overlay_of_the_size_gives_its_own_settings(conf):
    settings = size_settings(conf / "llm_ctc_enc.yaml", "Qwen/Qwen3-32B")
    assert settings == ["model.activation_checkpointing=true", "model.lora_targets=q_proj,v_proj",
                        "optim.lr=5e-05", "data.max_duration=inf"]
    config = load_run_config(conf / "llm_ctc_enc.yaml", settings)
    assert (config.model.encoder_type, config.model.activation_checkpointing, config.model.lora_targets) == (
        "spear", True, ("q_proj", "v_proj"))
    assert (config.optim.lr, config.optim.decay_batches, config.data.max_duration) == (5e-05, 1000, float("inf"))


def test_sizes_without_an_overlay_and_names_without_a_size_add_nothing(conf):
    assert size_settings(conf / "llm_ctc_enc.yaml", "Qwen/Qwen3-8B") == []
    assert size_settings(conf / "llm_ctc_enc.yaml", "data/full/tiny_qwen3") == []


def test_an_overlay_of_another_base_is_refused(conf):
    (conf / "other.yaml").write_text("family: llm_ctc\n")
    (conf / "llm_ctc_14b.yaml").write_text("base: other.yaml\nmodel:\n  activation_checkpointing: true\n")
    with pytest.raises(ValueError, match=r"llm_ctc_14b.yaml: extends .*other.yaml, which .*llm_ctc_enc.yaml does not"):
        size_settings(conf / "llm_ctc_enc.yaml", "Qwen/Qwen3-14B")
