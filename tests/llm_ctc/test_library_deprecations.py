"""The project's calls into transformers and peft: the KV-cache argument the installed
transformers expects, and no FutureWarning or DeprecationWarning from a generation step,
a streaming step, or LoRA wrapping and merging."""

import dataclasses
import inspect
import warnings

import pytest
import torch

from llm_ctc.language_model import add_lora, kv_cache_name
from references.tiny_llm import WIDTH, perturb_lora, random_features

# peft 0.21's PeftModel.__init__ reads model.is_gradient_checkpointing itself, which
# transformers 5.24 deprecates; no argument of ours reaches it.
PEFT_OWN_DEPRECATION = "`is_gradient_checkpointing` is deprecated"


def deprecations(record):
    return [str(w.message) for w in record if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_kv_cache_argument_is_the_one_the_installed_models_take():
    from transformers import Qwen3Model
    from transformers.modeling_outputs import BaseModelOutputWithPast

    name = kv_cache_name()
    assert name in inspect.signature(Qwen3Model.forward).parameters
    assert name in {field.name for field in dataclasses.fields(BaseModelOutputWithPast)}


@pytest.fixture(scope="module")
def ce_model(ctc_config, tiny_untied_qwen3_dir, qwen3_tokenizer):
    from llm_ctc.ce_model import LLMCEModel

    torch.manual_seed(21)
    config = dataclasses.replace(ctc_config, llm=str(tiny_untied_qwen3_dir), objective="ce", max_new_tokens=4)
    model = LLMCEModel(config, tokenizer=qwen3_tokenizer)
    perturb_lora(model)
    return model.eval()


def test_cached_generation_raises_no_deprecation_and_uses_the_cache(ce_model):
    features, lengths = random_features([60], seed=22)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        cached = ce_model.generate_ids(features, lengths, use_cache=True)
    # Without the cache really passed, the steps after the prefill would see one token.
    assert cached == ce_model.generate_ids(features, lengths, use_cache=False)


def test_streaming_step_raises_no_deprecation_and_fills_the_cache(ctc_model):
    from llm_ctc.streaming.llm import CachedStreamingLLM
    from llm_ctc.streaming.layout import Qwen3ASRGrid

    grid = Qwen3ASRGrid()
    count = grid.count(200)
    speech = torch.randn(count, WIDTH, generator=torch.Generator().manual_seed(23))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        state = CachedStreamingLLM(ctc_model, 2, grid)
        states = state.step(speech, 200)
    assert states.shape == (count, WIDTH) and bool(torch.isfinite(states).all())
    assert state.cache.get_seq_length() == state.cache_size > len(ctc_model.prompt_ids)


def test_lora_wrapping_and_merging_raise_no_deprecation_of_ours(tiny_qwen3_dir):
    from transformers import Qwen3ForCausalLM

    backbone = Qwen3ForCausalLM.from_pretrained(tiny_qwen3_dir).get_decoder()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        wrapped = add_lora(backbone, 4, 8.0, 0.0, ["q_proj", "v_proj"])
        merged = wrapped.merge_and_unload()
    assert all(PEFT_OWN_DEPRECATION in message for message in deprecations(record))
    assert not hasattr(merged, "peft_config")
