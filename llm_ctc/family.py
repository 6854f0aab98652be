"""The LLM-CTC / LLM-CE family (:class:`asr.family.Family`): the LLM's own tokenizer as
the lexicon, the model from its ``model`` section (:class:`llm_ctc.config.LLMASRConfig`,
built by :func:`llm_ctc.build.build_model`), and AdamW with warm-up, cosine decay and
clipping from its ``optim`` section (:class:`llm_ctc.config.AdamWOptions`).

The models keep the toolkit's contract themselves (:class:`llm_ctc.base.SpeechLLM`):
their checkpoints hold only the trainable parameters; the frozen encoder, LLM and head
are rebuilt from the paths in the configuration.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

from torch import nn

from asr.family import Family
from llm_ctc.base import SpeechLLM
from llm_ctc.config import AdamWOptions, LLMASRConfig
from llm_ctc.optim import ClippedAdamW, WarmupCosine
from llm_ctc.tokenizer import LLMTokenizer


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(path: str, gguf_file: Optional[str]):
    from llm_ctc.language_model import load_tokenizer

    return load_tokenizer(path, gguf_file)


def _tokenizer_of(config: LLMASRConfig):
    # A GGUF LLM carries its own tokenizer unless another one is named (as SpeechLLM).
    return _hf_tokenizer(config.tokenizer_path, config.llm_gguf_file if not config.tokenizer else None)


def head_rows(config: LLMASRConfig) -> int:
    """Rows of the LLM head, from the LLM's configuration (the weights are not loaded)."""
    from llm_ctc.language_model import pretrained_config

    llm_config = pretrained_config(config.llm, "model.llm", config.llm_gguf_file)
    text_config = getattr(llm_config, "text_config", None) or llm_config  # Qwen3-ASR nests it
    return int(text_config.vocab_size)


def build_tokenizer(config: LLMASRConfig) -> LLMTokenizer:
    """The LLM's tokenizer as the run's lexicon: lowercased, no special tokens; the
    classes are the head's rows (plus an appended zero row when the tokenizer uses them
    all), the blank the first row beyond the tokenizer (Sec. 4.2, App. D.2)."""
    from llm_ctc.blank import choose_blank_row

    tokenizer = _tokenizer_of(config)
    rows = head_rows(config)
    blank, append = choose_blank_row(rows, len(tokenizer), config.blank_id)
    return LLMTokenizer(tokenizer, rows + int(append), blank, config.transcript_leading_space)


def build_model(config: LLMASRConfig, vocab_size: int, blank_id: int) -> SpeechLLM:
    """LLM-CTC (streaming or not) or LLM-CE (``model.objective``) whose classes are
    ``vocab_size`` head rows with the blank at ``blank_id`` (both from :func:`build_tokenizer`)."""
    from llm_ctc.build import build_model as build_speech_llm

    model = build_speech_llm(config, tokenizer=_tokenizer_of(config))
    if config.objective == "ctc" and (model.head_weight.shape[0] != vocab_size or model.blank_id != blank_id):
        raise ValueError(f"the LLM head of {config.llm} has {model.head_weight.shape[0]} classes with blank "
                         f"{model.blank_id}, but the lexicon says {vocab_size} classes with blank {blank_id}: "
                         "model.llm and model.tokenizer do not belong together")
    return model


def build_optimizer(model: nn.Module, options: AdamWOptions) -> Tuple[ClippedAdamW, WarmupCosine]:
    """AdamW over the trainable parameters (weight decay on matrices only), clipped to
    ``options.clip_norm``, with linear warm-up and cosine decay (App. D.2, Table 8)."""
    groups = [group for group in model.parameter_groups(options.weight_decay) if group["params"]]
    for group in groups:  # a trained encoder's groups run at a fraction of the peak
        group["lr"] = options.lr * group.pop("lr_scale", 1.0)
    optimizer = ClippedAdamW(groups, clip_norm=options.clip_norm, lr=options.lr, betas=(options.beta1, options.beta2),
                             eps=options.eps, weight_decay=options.weight_decay)
    scheduler = WarmupCosine(optimizer, options.warmup_batches, options.decay_batches, options.final_lr_fraction)
    return optimizer, scheduler


FAMILY = Family("llm_ctc", LLMASRConfig, AdamWOptions, build_model, build_optimizer, build_tokenizer,
                path_fields=("llm", "tokenizer", "encoder_path"))
