"""The LLM-CTC / LLM-CE family as the trainer and decoder of :mod:`asr` use it (see
:mod:`asr.family` for the interface): the LLM's own tokenizer as the lexicon, the model
from its ``model`` section (:class:`llm_ctc.config.LLMASRConfig`), and AdamW with
warm-up, cosine decay and clipping from its ``optim`` section
(:class:`llm_ctc.config.AdamWOptions`).

The toolkit sees the models through two thin adapters (:class:`ToolkitLLMCTC`,
:class:`ToolkitLLMCE`): the batch loss with per-utterance exclusions, output lengths,
``log_probs`` (LLM-CTC) or ``generate_ids`` (LLM-CE, decoded by generation), and
checkpoints that hold only the trainable parameters (``checkpoint_state_dict``): the
frozen encoder, LLM and head are rebuilt from the paths in the configuration.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from llm_ctc.config import LLMASRConfig
from llm_ctc.decoding import LLMTokenizer, best_frame_ids
from llm_ctc.optim import ClippedAdamW, WarmupCosine
from llm_ctc.config import AdamWOptions

FrameCount = Union[int, Tensor]


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(path: str, gguf_file: Optional[str]):
    from llm_ctc.language_model import load_tokenizer

    return load_tokenizer(path, gguf_file)


def _tokenizer_of(config: LLMASRConfig):
    # A GGUF LLM carries its own tokenizer unless another one is named (as SpeechLLM).
    return _hf_tokenizer(config.tokenizer_path, config.llm_gguf_file if not config.tokenizer else None)


def head_rows(config: LLMASRConfig) -> int:
    """Rows of the LLM head, from the LLM's configuration (the weights are not loaded)."""
    from transformers import AutoConfig

    options = {"gguf_file": config.llm_gguf_file} if config.llm_gguf_file else {}
    llm_config = AutoConfig.from_pretrained(config.llm, **options)
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
    return LLMTokenizer(tokenizer, rows + int(append), blank)


def build_model(config: LLMASRConfig, vocab_size: int, blank_id: int) -> nn.Module:
    """LLM-CTC or LLM-CE (``model.objective``) whose classes are ``vocab_size`` head rows
    with the blank at ``blank_id`` (both from :func:`build_tokenizer`)."""
    from llm_ctc.checkpoint import build_model as build_speech_llm

    model = build_speech_llm(config, tokenizer=_tokenizer_of(config))
    if config.objective == "ce":
        return ToolkitLLMCE(model)
    if model.head_weight.shape[0] != vocab_size or model.blank_id != blank_id:
        raise ValueError(f"the LLM head of {config.llm} has {model.head_weight.shape[0]} classes with blank "
                         f"{model.blank_id}, but the lexicon says {vocab_size} classes with blank {blank_id}: "
                         "model.llm and model.tokenizer do not belong together")
    if config.streaming:
        from llm_ctc.streaming_toolkit import StreamingToolkitLLMCTC

        return StreamingToolkitLLMCTC(model)
    return ToolkitLLMCTC(model)


def build_optimizer(model: nn.Module, options: AdamWOptions) -> Tuple[ClippedAdamW, WarmupCosine]:
    """AdamW over the trainable parameters (weight decay on matrices only), clipped to
    ``options.clip_norm``, with linear warm-up and cosine decay (App. D.2, Table 8)."""
    speech_llm = model.speech_llm if hasattr(model, "speech_llm") else model
    groups = [group for group in speech_llm.parameter_groups(options.weight_decay) if group["params"]]
    optimizer = ClippedAdamW(groups, clip_norm=options.clip_norm, lr=options.lr, betas=(options.beta1, options.beta2),
                             eps=options.eps, weight_decay=options.weight_decay)
    scheduler = WarmupCosine(optimizer, options.warmup_batches, options.decay_batches, options.final_lr_fraction)
    return optimizer, scheduler


@dataclass
class NothingExcluded:
    """Loss statistics of a loss that keeps every utterance (LLM-CE)."""

    excluded: Tensor
    num_excluded: int = 0


class ToolkitSpeechLLM(nn.Module):
    """What both adapters share: output lengths and trainable-only checkpoints."""

    def __init__(self, speech_llm: nn.Module) -> None:
        super().__init__()
        self.speech_llm = speech_llm

    def output_lengths(self, num_feature_frames: FrameCount) -> FrameCount:
        """LLM speech positions T_n for a number of feature frames (an int or a tensor)."""
        config = self.speech_llm.config
        frames = encoder_output_lengths(self.speech_llm.encoder, config, num_feature_frames)
        if config.projector_type == "stack":
            return (frames + config.projector_stack - 1) // config.projector_stack
        return frames

    def checkpoint_state_dict(self) -> Dict[str, Tensor]:
        """The trainable parameters only (LoRA, projector, query, blank offset)."""
        return self.speech_llm.trainable_state_dict()

    def load_checkpoint_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.speech_llm.load_trainable_state_dict(state)

    def prepare_for_decoding(self) -> None:
        """LoRA folded into the base weights (one matrix product per layer again)."""
        self.speech_llm.merge_lora()


class ToolkitLLMCTC(ToolkitSpeechLLM):
    def forward(self, features: Tensor, feature_lens: Tensor, targets: List[List[int]], return_stats: bool = True):
        loss, info = self.speech_llm.loss(features, feature_lens, targets)
        return (loss, info["loss_stats"]) if return_stats else loss

    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Full-head log-probabilities (N, T_n max, V), float32, and T_n, for CTC search."""
        return self.speech_llm.ctc_log_probs(features, feature_lens)

    def best_frame_ids(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """The argmax class of every frame (N, T_n max) and T_n, for greedy search without
        the (N, T_n max, V) log-softmax (llm_ctc/decoding.py)."""
        if type(self).log_probs is not ToolkitLLMCTC.log_probs:
            # A subclass whose frames differ (streaming): the argmax of its own log-probs.
            log_probs, lengths = self.log_probs(features, feature_lens)
            return log_probs.argmax(dim=-1), lengths
        return best_frame_ids(self.speech_llm, features, feature_lens)


class ToolkitLLMCE(ToolkitSpeechLLM):
    """LLM-CE: decoded by generation (``decode.methods`` llm-greedy-search /
    llm-beam-search), so it has ``generate_ids`` and no ``log_probs``."""

    def forward(self, features: Tensor, feature_lens: Tensor, targets: List[List[int]], return_stats: bool = True):
        loss, _ = self.speech_llm.loss(features, feature_lens, targets)
        stats = NothingExcluded(torch.zeros(features.shape[0], dtype=torch.bool, device=features.device))
        return (loss, stats) if return_stats else loss

    def generate_ids(self, features: Tensor, feature_lens: Tensor, beam: Optional[int] = None) -> List[List[int]]:
        """Token ids per utterance: greedy (``beam`` None) or beam search (App. D.2)."""
        return self.speech_llm.generate(features, feature_lens, beam=beam)


def encoder_output_lengths(encoder: nn.Module, config: LLMASRConfig, frames: FrameCount) -> FrameCount:
    """Frames out of the frozen speech encoder for ``frames`` feature frames."""
    if hasattr(encoder, "output_lengths"):
        return encoder.output_lengths(frames)
    if config.encoder_type == "zipformer":
        from zipformer.encoder import encoder_output_lengths as zipformer_lengths

        return zipformer_lengths(frames)
    # Qwen3-ASR: windows of ``encoder.window`` mel frames, each convolved on its own.
    as_tensor = torch.as_tensor(frames)
    full, rest = as_tensor // encoder.window, as_tensor % encoder.window
    post = encoder.audio_tower._post_cnn_length
    lengths = full * post(torch.full_like(as_tensor, encoder.window)) + torch.where(
        rest > 0, post(rest.clamp(min=1)), torch.zeros_like(rest))
    return lengths if isinstance(frames, Tensor) else int(lengths)
