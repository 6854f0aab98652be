"""The LLM's layers trained whole instead of LoRA (``model.llm_full_finetune``), and a LoRA
run's checkpoint folded into them (``python -m llm_ctc.merge_lora``): the model it starts
computes the LoRA model's log-probs, and training moves the layers, not the embeddings."""

import dataclasses

import pytest
import torch

from asr.trainee import initialize_from
from llm_ctc import merge_lora
from llm_ctc.model import LLMCTCModel
from references.tiny_llm import perturb_lora, random_features


@pytest.fixture(scope="module")
def whole_config(ctc_config):
    return dataclasses.replace(ctc_config, lora_rank=0, llm_full_finetune=True)


def test_the_layers_and_final_norm_train_and_the_embeddings_and_head_stay_frozen(whole_config, qwen3_tokenizer):
    model = LLMCTCModel(whole_config, tokenizer=qwen3_tokenizer)
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    llm_names = {f"llm.{name}" for name, _ in model.llm.named_parameters()}
    embeddings = {f"llm.{name}" for name, _ in model.llm.named_parameters() if "embed_tokens" in name}
    assert embeddings and not embeddings & trained
    assert llm_names - embeddings <= trained  # every layer weight and the final norm
    assert any(".layers.1.mlp.down_proj.weight" in name for name in trained)
    assert any(name.endswith("llm.norm.weight") for name in trained)
    assert not any("lora" in name for name in trained)
    assert not model.lm_head.weight.requires_grad  # tied to the embeddings in the small Qwen3s
    # No weight decay on the pretrained LLM's matrices (it would shrink them towards 0).
    llm_ids = {id(p) for p in model.llm.parameters()}
    decayed = [p for group in model.parameter_groups(0.1) if group["weight_decay"] > 0 for p in group["params"]]
    assert decayed and not any(id(p) in llm_ids for p in decayed)
    assert sum(p.numel() for p in model.llm.parameters() if p.requires_grad) == \
        sum(p.numel() for n, p in model.named_parameters() if n in trained and n.startswith("llm."))


def test_full_finetune_with_lora_is_an_error_naming_both_options(ctc_config):
    with pytest.raises(ValueError, match="model.llm_full_finetune .* model.lora_rank=0"):
        dataclasses.replace(ctc_config, llm_full_finetune=True).validate()


def test_a_merged_lora_checkpoint_starts_the_whole_layers_where_lora_was(ctc_config, whole_config, qwen3_tokenizer,
                                                                         tmp_path):
    torch.manual_seed(7)
    lora_model = LLMCTCModel(dataclasses.replace(ctc_config, readout="speech"), tokenizer=qwen3_tokenizer)
    perturb_lora(lora_model, scale=0.2)
    with torch.no_grad():
        lora_model.blank_offset.add_(0.3)
    lora_model.eval()
    source = tmp_path / "decoding.pt"
    torch.save({"model": lora_model.checkpoint_state_dict(), "format_version": 1,
                "config": {"family": "llm_ctc", "model": lora_model.config.to_dict(), "train": {"seed": 1}}}, source)
    out = tmp_path / "merged.pt"
    merge_lora.main([str(source), str(out)])
    merged = torch.load(out, map_location="cpu", weights_only=False)
    assert merged["config"]["model"]["lora_rank"] == 0 and merged["config"]["model"]["llm_full_finetune"]
    assert merged["config"]["train"] == {"seed": 1}  # the rest of the run's configuration kept
    whole = LLMCTCModel(dataclasses.replace(whole_config, readout="speech"), tokenizer=qwen3_tokenizer)
    initialize_from(whole, str(out))
    whole.eval()
    # The whole layers compute what LoRA computed (LoRA's B random, so not the LLM alone).
    features, lengths = random_features([70, 45], seed=8)
    with torch.no_grad():
        expected, expected_lens = lora_model.log_probs(features, lengths)
        got, got_lens = whole.log_probs(features, lengths)
    assert torch.equal(got_lens, expected_lens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # The layer weights moved by LoRA are the merged W + (alpha / r) B A.
    base = LLMCTCModel(whole_config, tokenizer=qwen3_tokenizer)
    name = "layers.0.self_attn.q_proj"
    lora_layer = dict(lora_model.llm.named_modules())[f"base_model.model.{name}"]
    a, b = lora_layer.lora_A["default"].weight, lora_layer.lora_B["default"].weight
    scale = ctc_config.lora_alpha / ctc_config.lora_rank
    torch.testing.assert_close(dict(whole.llm.named_parameters())[f"{name}.weight"],
                               dict(base.llm.named_parameters())[f"{name}.weight"] + scale * b @ a)
    # An existing output is kept; a checkpoint without LoRA is an error naming it.
    merge_lora.main([str(source), str(out)])
    no_lora = tmp_path / "no_lora.pt"
    torch.save(merged, no_lora)
    with pytest.raises(SystemExit, match="no LoRA to merge"):
        merge_lora.main([str(no_lora), str(tmp_path / "again.pt")])
    # A checkpoint of another family (a Zipformer's) is named as such.
    zipformer = tmp_path / "zipformer.pt"
    torch.save({"model": {}, "config": {"family": "zipformer", "model": {"num_heads": [4]}}}, zipformer)
    with pytest.raises(SystemExit, match="of the 'zipformer' family, not of LLM-CTC"):
        merge_lora.main([str(zipformer), str(tmp_path / "again.pt")])
    assert not (tmp_path / "again.pt").exists()
