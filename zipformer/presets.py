"""Model configuration: one dataclass, named presets, YAML files and command-line overrides.

Presets S, M and L are the icefall LibriSpeech sizes (icefall egs/librispeech/ASR/RESULTS.md); M is
also the default (icefall egs/librispeech/ASR/zipformer/train.py). ``mini`` (3.4 M parameters) is for
the CPU mini recipe and ``tiny`` for unit tests. A recipe's ``conf/*.yaml`` names one in its
``model:`` section, with the fields that differ from it (:mod:`asr.config`; the vocabulary size
comes from the lexicon of ``train.lang_dir``, not from the preset)::

    model:
      preset: S
      loss: standard

and every field can then be overridden as ``model.key=value``, e.g.
``model.encoder_dim=192,256,256,256,256,256`` (lists are comma separated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple, Union

from asr.lookahead import lookahead_frames_of

PER_STACK_FIELDS = (
    "num_encoder_layers", "downsampling_factor", "feedforward_dim", "num_heads",
    "encoder_dim", "encoder_unmasked_dim", "cnn_module_kernel",
)
LOSSES = ("pruned", "standard")


@dataclass
class ZipformerConfig:
    """Hyper-parameters of a Zipformer CTC model; defaults are Zipformer-M (icefall
    egs/librispeech/ASR/zipformer/train.py).

    Per-stack fields hold one value per encoder stack. ``vocab_size`` includes blank.
    """

    feature_dim: int = 80
    num_encoder_layers: Tuple[int, ...] = (2, 2, 3, 4, 3, 2)
    downsampling_factor: Tuple[int, ...] = (1, 2, 4, 8, 4, 2)
    feedforward_dim: Tuple[int, ...] = (512, 768, 1024, 1536, 1024, 768)
    num_heads: Tuple[int, ...] = (4, 4, 4, 8, 4, 4)
    encoder_dim: Tuple[int, ...] = (192, 256, 384, 512, 384, 256)
    encoder_unmasked_dim: Tuple[int, ...] = (192, 192, 256, 256, 256, 192)
    cnn_module_kernel: Tuple[int, ...] = (31, 31, 15, 15, 15, 31)
    query_head_dim: int = 32
    value_head_dim: int = 12
    pos_head_dim: int = 4
    pos_dim: int = 48
    output_downsampling_factor: int = 2
    # The layers' warm-up (icefall zipformer.py's warmup_batches): the stacks' layer-skip rates
    # fall over this many schedule units (asr.config.TrainOptions.schedule_ref_duration), not
    # optimizer updates; the learning-rate warm-up is optim.warmup_batches.
    layer_warmup_batches: float = 4000.0
    # Multiplies every stochastic regularizer of the encoder (dropouts, module and layer
    # skipping, feature masks; icefall zipformer.py): 1 keeps icefall's schedules, 0 turns them all
    # off (short CPU runs of small models underfit, so regularization only slows them).
    regularization_scale: float = 1.0
    subsampling_channels: Tuple[int, ...] = (8, 32, 128)
    # CTC model
    vocab_size: int = 500
    blank_id: int = 0
    head_dropout: float = 0.1
    loss: str = "pruned"
    # Pruned CTC's vocabulary chunk and alignment pruning beam (paper Sec. 3.2-3.3, App. B.3);
    # None takes pruned_ctc's defaults, alignment_beam=inf keeps every alignment.
    chunk_size: Optional[int] = None
    alignment_beam: Optional[float] = None
    # Chunk-window training (paper Sec. 4.3, App. D.4): an encoder for bounded-history
    # streaming. With ``streaming`` every utterance is cut into chunks of
    # ``streaming_chunk_seconds``; each chunk's window (the h seconds before it and the
    # chunk, no later audio) runs as an independent sequence and only the chunk's frames
    # are kept (zipformer/windows.py). Training draws h per update as streaming LLM-CTC
    # does (``streaming_max_history`` s with probability 1/2, each shorter whole second
    # equally often, from ``streaming_seed`` and the update number); validation and
    # decoding use h = ``streaming_max_history``, what a chunk-by-chunk decoder computes.
    # The features are computed per chunk (data.feature_chunk_seconds follows).
    # ``streaming_lookahead_seconds`` (not in the paper; 0 keeps its windows) also gives
    # each window that much of the next chunk after the chunk, as right context of its
    # last frames; each chunk's output then waits that much longer.
    streaming: bool = False
    streaming_chunk_seconds: int = 2
    streaming_max_history: int = 8
    streaming_seed: int = 0
    streaming_lookahead_seconds: float = 0.0
    # Fine-tuning only the encoder's top stacks: ``trained_stacks`` > 0 trains the last that
    # many stacks, the output downsampling and the head; the front end and the stacks below
    # keep their weights, run in evaluation mode and build no autograd graph, so the
    # backward pass stops at the lowest trained stack (0 trains everything).
    trained_stacks: int = 0

    # A preset name is accepted where a model section is read (asr.config.build_section).
    extra_keys: ClassVar[Dict[str, str]] = {"preset": "str"}

    def __post_init__(self) -> None:
        for name in PER_STACK_FIELDS + ("subsampling_channels",):
            setattr(self, name, _as_int_tuple(getattr(self, name), name))
        stacks = len(self.encoder_dim)
        for name in PER_STACK_FIELDS:
            value = getattr(self, name)
            if len(value) == 1 and stacks > 1:
                setattr(self, name, value * stacks)
            elif len(value) != stacks:
                raise ValueError(f"{name} has {len(value)} entries, expected one per stack "
                                 f"({stacks}, as encoder_dim={self.encoder_dim})")
        self.validate()

    @property
    def num_stacks(self) -> int:
        return len(self.encoder_dim)

    @property
    def output_dim(self) -> int:
        """Encoder output dimension: the largest stack dimension (icefall zipformer/model.py)."""
        return max(self.encoder_dim)

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; valid: {', '.join(LOSSES)}")
        if len(self.subsampling_channels) != 3:
            raise ValueError(f"subsampling_channels needs 3 values, got {self.subsampling_channels}")
        # icefall's LibriSpeech Zipformer2 asserts 2; SPEAR's copy of it runs with 1 (50
        # frames per second, paper App. D.3), which SimpleDownsample(1) computes as identity.
        if self.output_downsampling_factor not in (1, 2):
            raise ValueError("output_downsampling_factor must be 2 (icefall's ASR models) or 1 "
                             f"(SPEAR encoders), got {self.output_downsampling_factor}")
        if self.vocab_size < 2 or not 0 <= self.blank_id < self.vocab_size:
            raise ValueError(f"need vocab_size >= 2 and 0 <= blank_id < vocab_size, got "
                             f"vocab_size={self.vocab_size}, blank_id={self.blank_id}")
        for i, (dim, unmasked, heads, kernel) in enumerate(zip(
                self.encoder_dim, self.encoder_unmasked_dim, self.num_heads,
                self.cnn_module_kernel)):
            if not 0 < unmasked <= dim:
                raise ValueError(f"stack {i}: encoder_unmasked_dim {unmasked} must be in "
                                 f"(0, encoder_dim {dim}]")
            if dim % 4 != 0:
                raise ValueError(f"stack {i}: encoder_dim {dim} must be a multiple of 4")
            if kernel % 2 != 1:
                raise ValueError(f"stack {i}: cnn_module_kernel {kernel} must be odd")
            if heads < 1:
                raise ValueError(f"stack {i}: num_heads must be >= 1, got {heads}")
        if not 0.0 <= self.regularization_scale <= 1.0:
            raise ValueError("regularization_scale must be in [0, 1], got "
                             f"{self.regularization_scale}")
        if self.pos_dim % 2 != 0:
            raise ValueError(f"pos_dim must be even, got {self.pos_dim}")
        if self.streaming_chunk_seconds < 1 or self.streaming_max_history < 1 or self.streaming_seed < 0:
            raise ValueError("streaming_chunk_seconds and streaming_max_history must be >= 1, streaming_seed >= 0, "
                             f"got {self.streaming_chunk_seconds}, {self.streaming_max_history} and "
                             f"{self.streaming_seed}")
        lookahead_frames_of(self.streaming_lookahead_seconds, self.streaming_chunk_seconds,
                            "streaming_lookahead_seconds")
        if not 0 <= self.trained_stacks <= self.num_stacks:
            raise ValueError(f"trained_stacks must be between 0 (all) and the {self.num_stacks} stacks, "
                             f"got {self.trained_stacks}")
        if self.streaming and self.output_downsampling_factor != 2:
            raise ValueError("streaming (chunk windows) needs output_downsampling_factor 2 (25 frames per second), "
                             f"got {self.output_downsampling_factor}")

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "ZipformerConfig":
        """A config from a mapping; an optional ``preset`` key names the starting point."""
        return config_from_dict(values)


@dataclass
class ScaledAdamOptions:
    """The ``optim`` section of a Zipformer run: ScaledAdam and the Eden schedule, with
    icefall's LibriSpeech Zipformer-M values (egs/librispeech/ASR/zipformer/train.py and
    optim.py; S uses base_lr 0.04)."""

    base_lr: float = 0.045
    clipping_scale: float = 2.0
    lr_batches: float = 7500.0
    lr_epochs: float = 3.5
    warmup_batches: float = 500.0
    warmup_start: float = 0.5

    def __post_init__(self) -> None:
        for name in ("base_lr", "lr_batches", "lr_epochs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"optim.{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_batches < 0 or not 0 < self.warmup_start <= 1:
            raise ValueError(f"need optim.warmup_batches >= 0 and 0 < optim.warmup_start <= 1, got "
                             f"{self.warmup_batches} and {self.warmup_start}")


def _as_int_tuple(value: Union[int, str, Sequence[int]], name: str) -> Tuple[int, ...]:
    try:
        if isinstance(value, str):
            return tuple(int(v) for v in value.split(",") if v.strip())
        if isinstance(value, int):
            return (value,)
        return tuple(int(v) for v in value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be integers (comma separated), got {value!r}") from error


PRESETS: Dict[str, Dict[str, Any]] = {
    "S": dict(num_encoder_layers=(2, 2, 2, 2, 2, 2),
              feedforward_dim=(512, 768, 768, 768, 768, 768),
              encoder_dim=(192, 256, 256, 256, 256, 256),
              encoder_unmasked_dim=(192, 192, 192, 192, 192, 192)),
    "M": dict(),
    "L": dict(num_encoder_layers=(2, 2, 4, 5, 4, 2),
              feedforward_dim=(512, 768, 1536, 2048, 1536, 768),
              encoder_dim=(192, 256, 512, 768, 512, 256),
              encoder_unmasked_dim=(192, 192, 256, 320, 256, 192)),
    # 3.42 M parameters with V = 500: the CPU mini recipe.
    "mini": dict(num_encoder_layers=(1, 1, 1, 1, 1, 1),
                 feedforward_dim=(256, 384, 384, 512, 384, 384),
                 encoder_dim=(96, 128, 128, 192, 128, 128),
                 encoder_unmasked_dim=(96, 96, 96, 128, 96, 96),
                 num_heads=(4, 4, 4, 4, 4, 4), query_head_dim=16, pos_dim=24,
                 subsampling_channels=(8, 16, 32)),
    # Unit tests: three stacks, a few hundred thousand parameters.
    "tiny": dict(num_encoder_layers=(1, 1, 1), downsampling_factor=(1, 2, 1),
                 feedforward_dim=(96, 96, 96), num_heads=(2, 2, 2),
                 encoder_dim=(48, 64, 48), encoder_unmasked_dim=(32, 48, 32),
                 cnn_module_kernel=(7, 7, 7), query_head_dim=8, value_head_dim=8,
                 pos_head_dim=4, pos_dim=16, subsampling_channels=(4, 8, 16)),
    # SPEAR-XLarge v2 (paper Table 3 and App. D.3: 128-dim fbank in, 1280-dim embeddings at
    # about 50 frames/s), the layout zipformer/spear.py documents with its sources.
    "spear_xlarge_v2": dict(feature_dim=128, output_downsampling_factor=1,
                            downsampling_factor=(1, 2, 4, 8, 4, 2, 1),
                            num_encoder_layers=(1, 2, 3, 4, 1, 1, 1),
                            encoder_dim=(1280,) * 7, encoder_unmasked_dim=(768,) * 7,
                            feedforward_dim=(3840,) * 7, num_heads=(8,) * 7,
                            cnn_module_kernel=(31, 31, 15, 15, 15, 31, 31),
                            subsampling_channels=(8, 32, 128)),
}

def get_preset(name: str, **overrides: Any) -> ZipformerConfig:
    """The named preset (S, M, L, mini, tiny, spear_xlarge_v2) with keyword overrides applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown Zipformer preset {name!r}; valid names: "
                         f"{', '.join(PRESETS)}")
    return config_from_dict({**PRESETS[name], **overrides})


def config_from_dict(values: Mapping[str, Any]) -> ZipformerConfig:
    """Build a config from a mapping, e.g. the model section saved in a checkpoint (keys
    renamed since are translated: asr.renamed_keys); an optional ``preset`` key names the
    starting point."""
    from asr.renamed_keys import translate_saved_model

    values = translate_saved_model("zipformer", values)
    preset = values.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown Zipformer preset {preset!r}; valid names: "
                             f"{', '.join(PRESETS)}")
        values = {**PRESETS[preset], **values}
    known = {f.name for f in fields(ZipformerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown model option(s) {unknown}; valid: {sorted(known)}")
    return ZipformerConfig(**values)


__all__ = ["ZipformerConfig", "ScaledAdamOptions", "PRESETS", "get_preset", "config_from_dict"]
