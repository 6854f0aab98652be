"""The pretrained decoder-only LLM, its tokenizer and LoRA.

Only the LLM's inner backbone is ever called (``inputs_embeds``, ``attention_mask``,
``position_ids``; final-norm hidden states out). The causal-LM forward, which builds
(N, S, V) logits, is never used: the head's weight goes to the loss instead (Sec. 3).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor, nn


@dataclass
class PretrainedLM:
    """backbone: the inner model (embeddings, layers, final norm); head: the LLM head
    (weight (V, D), bias (V,) or None), frozen."""

    backbone: nn.Module
    head: nn.Module
    hidden_size: int


def pretrained_config(name_or_path: str, option: str = "model.llm", gguf_file: Optional[str] = None):
    """transformers' configuration of a local folder or a hub model; ValueError naming
    ``option`` when it is neither (instead of transformers' repo-id validation traceback)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_path, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as error:
        raise ValueError(f"{option} {name_or_path!r}: not a model folder here ({Path(name_or_path).resolve()} "
                         f"{'has no config.json' if Path(name_or_path).is_dir() else 'does not exist'}) nor a hub "
                         f"model that can be loaded ({str(error).splitlines()[0][:160]})") from None


def load_pretrained_lm(name_or_path: str, dtype: str = "float32", attn_implementation: Optional[str] = None,
                       gguf_file: Optional[str] = None) -> PretrainedLM:
    """A causal LM (``AutoModelForCausalLM``) or the language model of a Qwen3-ASR checkpoint,
    by hub name or local directory (optionally a GGUF file in it); every parameter frozen."""
    from transformers import AutoModelForCausalLM

    if not name_or_path:
        raise ValueError("model.llm is empty: name a causal LM (hub name or local directory)")
    options = {"dtype": getattr(torch, dtype)}
    if attn_implementation:
        options["attn_implementation"] = attn_implementation
    file_options = {"gguf_file": gguf_file} if gguf_file else {}
    model_type = pretrained_config(name_or_path, "model.llm", gguf_file).model_type
    options.update(file_options)
    if model_type == "qwen3_asr":
        from transformers import Qwen3ASRForConditionalGeneration

        full = Qwen3ASRForConditionalGeneration.from_pretrained(name_or_path, **options)
        backbone, head = full.model.language_model, full.lm_head
        hidden_size = full.config.text_config.hidden_size
    else:
        full = AutoModelForCausalLM.from_pretrained(name_or_path, **options)
        backbone, head = full.get_decoder(), full.get_output_embeddings()
        hidden_size = full.config.hidden_size
    for parameter in full.parameters():
        parameter.requires_grad_(False)
    logging.info("LLM %s (%s): %d parameters, head %s, width %d (frozen)", name_or_path, model_type,
                 sum(p.numel() for p in full.parameters()), tuple(head.weight.shape), hidden_size)
    return PretrainedLM(backbone=backbone, head=head, hidden_size=hidden_size)


def add_lora(backbone: nn.Module, rank: int, alpha: float, dropout: float,
             targets: Sequence[str]) -> nn.Module:
    """The backbone wrapped by peft with LoRA on ``targets`` (App. D.2: q, k, v, o, up,
    gate, down; rank 64, alpha 64, dropout 0.05); base weights stay frozen."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in backbone.named_modules()}
    missing = sorted(set(targets) - present)
    if missing:
        raise ValueError(f"model.lora_targets {missing} are not modules of this LLM "
                         f"(it has e.g. {sorted(n for n in present if n.endswith('proj'))[:8]})")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets))
    return get_peft_model(backbone, config)


def is_lora_wrapped(backbone: nn.Module) -> bool:
    return hasattr(backbone, "merge_and_unload") and hasattr(backbone, "peft_config")


def load_tokenizer(name_or_path: str, gguf_file: Optional[str] = None):
    """The LLM's own tokenizer (``AutoTokenizer``)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as error:
        where = "exists" if Path(name_or_path).exists() else "does not exist"
        raise ValueError(f"model.tokenizer (default: model.llm) {name_or_path!r}: no tokenizer there "
                         f"({Path(name_or_path).resolve()} {where}; {str(error).splitlines()[0][:160]})") from None


def kv_cache_name() -> str:
    """The name transformers gives a model's KV cache, as argument and output field.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` and warns (FutureWarning)
    that 5.40 removes the old name; earlier 5.x take only ``past_key_values`` and would
    pass an unknown ``cache=`` on unused (no cache, silently)."""
    import transformers
    from packaging.version import Version

    return "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def backbone_states(backbone: nn.Module, inputs_embeds: Tensor, attention_mask: Tensor,
                    position_ids: Tensor, cache=None, use_cache: bool = False):
    """Final-norm hidden states (N, S, D) (and the KV cache when ``use_cache``)."""
    name = kv_cache_name()
    out = backbone(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=use_cache, **{name: cache})
    return (out.last_hidden_state, getattr(out, name)) if use_cache else out.last_hidden_state
