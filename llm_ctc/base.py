"""Parts shared by LLM-CTC and LLM-CE: speech encoder (frozen by default), trainable projector,
pretrained LLM backbone with LoRA, frozen LLM head, the LLM's tokenizer.

Both are :class:`asr.family.Recognizer` models; what they share of the contract lives here:
output lengths (the encoder's, then the projector's), checkpoints that hold only the
trainable parameters (LoRA, projector, query, blank offset: the frozen parts are rebuilt
from the config), LoRA merged before decoding, and the AdamW parameter groups.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from asr.family import FrameCount, Recognizer
from llm_ctc.config import LLMASRConfig
from llm_ctc.encoders import ZipformerSpeechEncoder, build_speech_encoder
from llm_ctc.language_model import add_lora, is_lora_wrapped, load_pretrained_lm, load_tokenizer
from llm_ctc.projector import MLPProjector, build_projector


class SpeechLLM(Recognizer):
    """Encoder -> projector -> LLM backbone. ``tokenizer``: an already loaded tokenizer
    of ``config.tokenizer_path`` (loaded from there when None)."""

    def __init__(self, config: LLMASRConfig, tokenizer=None) -> None:
        super().__init__()
        config.validate()
        self.config = config
        if tokenizer is None:
            # A GGUF LLM carries its own tokenizer unless another one is named.
            gguf_file = config.llm_gguf_file if not config.tokenizer else None
            tokenizer = load_tokenizer(config.tokenizer_path, gguf_file)
        self.tokenizer = tokenizer
        self.encoder = build_speech_encoder(config)
        pretrained = load_pretrained_lm(config.llm, config.llm_dtype, config.attn_implementation,
                                        config.llm_gguf_file)
        self.hidden_size = pretrained.hidden_size
        self.projector = build_projector(config, self.encoder.output_dim, self.hidden_size)
        if config.projector_from_encoder:
            state = getattr(self.encoder, "pretrained_projector_state", None)
            if state is None or not isinstance(self.projector, MLPProjector):
                raise ValueError("model.projector_from_encoder needs encoder_type qwen3_asr and "
                                 "projector_type mlp")
            self.projector.load_qwen3_asr_projector(state)
        self.llm = pretrained.backbone
        if config.activation_checkpointing:
            # Non-reentrant: the layer inputs need not require grad (the LLM is frozen).
            options = {"use_reentrant": False}
            if hasattr(self.llm, "activation_checkpointing_enable"):  # transformers >= 5
                self.llm.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
            else:
                self.llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        if config.lora_rank > 0:
            self.llm = add_lora(self.llm, config.lora_rank, config.lora_alpha, config.lora_dropout,
                                config.lora_targets)
        # The LLM head, frozen: its weight may be the input embedding (tied in the
        # smaller Qwen3 models, App. D.3).
        self.lm_head = pretrained.head
        if config.llm_full_finetune:
            frozen = {id(p) for p in self.llm.get_input_embeddings().parameters()}
            frozen |= {id(p) for p in self.lm_head.parameters()}
            for parameter in self.llm.parameters():
                parameter.requires_grad_(id(parameter) not in frozen)
            logging.info("LLM layers and final norm trained whole (model.llm_full_finetune): %d parameters",
                         sum(p.numel() for p in self.llm.parameters() if p.requires_grad))

    # --- inputs -------------------------------------------------------------------

    def encode_texts(self, texts: Sequence[str]) -> List[List[int]]:
        """Lowercased transcripts as LLM token ids without special tokens (App. D.2)."""
        if isinstance(texts, str):
            raise TypeError("encode_texts() takes a list of texts, got a single str")
        return [self.tokenizer.encode(text.lower(), add_special_tokens=False) for text in texts]

    def decode_ids(self, ids: Sequence[int]) -> str:
        """Token ids joined and detokenized once: byte-level pieces of one character
        (Mandarin: 3 UTF-8 bytes over 1-2 tokens) only make text together."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.llm.get_input_embeddings()(ids)

    def text_embeddings(self, text: str) -> Tensor:
        """(P, D) embeddings of ``text``'s tokens (no special tokens added)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self.embed_tokens(torch.tensor(ids, dtype=torch.long, device=self.device))

    def speech_embeddings(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Projected speech (N, T_n max, D) in the LLM's dtype and T_n (N,)."""
        frames, frame_lens = self.encoder(features, feature_lens)
        projected, lens = self.projector(frames.to(self.projector_dtype), frame_lens)
        return projected.to(self.llm_dtype), lens

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def llm_dtype(self) -> torch.dtype:
        """The backbone's input dtype (its embeddings'); the head may be kept in another
        (App. D.3 times an FP32 head over BF16 LLM weights)."""
        return self.llm.get_input_embeddings().weight.dtype

    @property
    def projector_dtype(self) -> torch.dtype:
        return next(self.projector.parameters()).dtype

    # --- the toolkit's contract (asr.family.Recognizer) ---------------------------

    @property
    def feature_dim(self) -> int:
        return self.encoder.feature_dim

    def output_lengths(self, num_feature_frames: FrameCount) -> FrameCount:
        """LLM speech positions T_n for a number of feature frames (an int or a tensor)."""
        return self.projector.output_lengths(self.encoder.output_lengths(num_feature_frames))

    def uses_every_trained_weight(self) -> bool:
        """LoRA, the projector, q and the blank offset take part in every loss, and so does a
        trained Zipformer encoder, which runs in evaluation mode (no layer skipped); a
        trained encoder of another type is not vouched for."""
        return not self.encoder.trainable or isinstance(self.encoder, ZipformerSpeechEncoder)

    def checkpoint_state_dict(self) -> Dict[str, Tensor]:
        """Only the parameters that train (LoRA, projector, query, blank offset; the LLM's
        layers under ``model.llm_full_finetune``)."""
        return {name: value.detach().clone() for name, value in self.named_parameters() if value.requires_grad}

    def load_checkpoint_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Inverse of :meth:`checkpoint_state_dict`; the names must match exactly."""
        own = {name: value for name, value in self.named_parameters() if value.requires_grad}
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError(f"trainable state does not fit this model: missing {missing[:5]} "
                           f"({len(missing)} in all), unexpected {unexpected[:5]} ({len(unexpected)} in all); "
                           "was it saved from a model with the same config (LoRA rank, readout, merged?)")
        with torch.no_grad():
            for name, value in state.items():
                if own[name].shape != value.shape:
                    raise ValueError(f"trainable parameter {name}: shape {tuple(value.shape)} in the "
                                     f"state but {tuple(own[name].shape)} in the model")
                own[name].copy_(value)

    def parameter_groups(self, weight_decay: float) -> List[dict]:
        """AdamW groups: weight decay on matrices (LoRA, projector linears) only; biases,
        norms, the query vector and the blank offset are not decayed (decaying eta
        towards 0 would undo its log c_bl start), nor the LLM's own weights under
        ``model.llm_full_finetune`` (decay would shrink the pretrained LLM towards 0, where
        LoRA's decays towards the LLM). The projector's parameters run at
        ``model.projector_lr_scale`` x optim.lr, a trained encoder's at
        ``model.encoder_lr_scale`` x optim.lr, the query vector q (the query readout) at
        ``model.query_lr_scale`` x optim.lr: groups of another scale than 1 carry it as
        ``lr_scale``."""
        scale_of = {id(p): scale for module, scale in ((self.projector, self.config.projector_lr_scale),
                                                        (self.encoder, self.config.encoder_lr_scale))
                    for p in module.parameters()}
        query = getattr(self, "query", None)
        if query is not None:
            scale_of[id(query)] = self.config.query_lr_scale
        pretrained = {id(p) for p in self.llm.parameters()} if self.config.llm_full_finetune else set()
        by_scale: Dict[float, Tuple[list, list]] = {1.0: ([], [])}
        for parameter in self.parameters():
            if parameter.requires_grad:
                decay, no_decay = by_scale.setdefault(scale_of.get(id(parameter), 1.0), ([], []))
                decayed = parameter.dim() >= 2 and id(parameter) not in pretrained
                (decay if decayed else no_decay).append(parameter)
        groups = []
        for scale, (decay, no_decay) in by_scale.items():
            extra = {} if scale == 1.0 else {"lr_scale": scale}
            groups += [{"params": decay, "weight_decay": weight_decay, **extra},
                       {"params": no_decay, "weight_decay": 0.0, **extra}]
        return groups

    def prepare_for_decoding(self) -> None:
        """Fold LoRA into the base weights for inference (peft ``merge_and_unload``): one
        matrix product per layer again."""
        if is_lora_wrapped(self.llm):
            self.llm = self.llm.merge_and_unload()
            for parameter in self.llm.parameters():
                parameter.requires_grad_(False)
            logging.info("LoRA merged into the LLM weights")

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
