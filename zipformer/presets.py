"""Model configuration: one dataclass, named presets, YAML files and command-line overrides.

Presets S, M and L are the icefall LibriSpeech sizes (facts 1.3); M is also the recipe
default (facts 1.1). ``mini`` (3.4 M parameters) is for the CPU mini recipe and ``tiny``
for unit tests. A recipe's ``conf/*.yaml`` may hold a ``model:`` section (or be flat)::

    model:
      preset: M
      vocab_size: 500
      loss: pruned

and every field can then be overridden with ``key=value`` strings, e.g.
``encoder_dim=192,256,256,256,256,256`` (lists are comma separated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from pruned_ctc import DEFAULT_BEAM, DEFAULT_CHUNK_SIZE

PER_STACK_FIELDS = (
    "num_encoder_layers", "downsampling_factor", "feedforward_dim", "num_heads",
    "encoder_dim", "encoder_unmasked_dim", "cnn_module_kernel",
)
LOSSES = ("pruned", "standard")


@dataclass
class ZipformerConfig:
    """Hyper-parameters of a Zipformer CTC model; defaults are Zipformer-M (facts 1.1).

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
    warmup_batches: float = 4000.0
    # Multiplies every stochastic regularizer of the encoder (dropouts, module and layer
    # skipping, feature masks; facts 2.1): 1 keeps icefall's schedules, 0 turns them all
    # off (short CPU runs of small models underfit, so regularization only slows them).
    regularization_scale: float = 1.0
    subsampling_channels: Tuple[int, ...] = (8, 32, 128)
    # CTC model
    vocab_size: int = 500
    blank_id: int = 0
    head_dropout: float = 0.1
    loss: str = "pruned"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    beam: Optional[float] = DEFAULT_BEAM  # alignment beam; None keeps every alignment

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
        """Encoder output dimension: the largest stack dimension (facts 1.1)."""
        return max(self.encoder_dim)

    def validate(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; valid: {', '.join(LOSSES)}")
        if len(self.subsampling_channels) != 3:
            raise ValueError(f"subsampling_channels needs 3 values, got {self.subsampling_channels}")
        if self.output_downsampling_factor != 2:
            raise ValueError("output_downsampling_factor must be 2 (facts 1.1), got "
                             f"{self.output_downsampling_factor}")
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

    def to_dict(self) -> Dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}


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
}

# Base learning rates of the icefall recipes (facts 1.3); custom sizes use M's.
BASE_LR = {"S": 0.04, "M": 0.045, "L": 0.045}


def preset_names() -> Tuple[str, ...]:
    return tuple(PRESETS)


def get_preset(name: str, **overrides: Any) -> ZipformerConfig:
    """The named preset (S, M, L, mini, tiny) with keyword overrides applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown Zipformer preset {name!r}; valid names: "
                         f"{', '.join(PRESETS)}")
    return config_from_dict({**PRESETS[name], **overrides})


def config_from_dict(values: Mapping[str, Any]) -> ZipformerConfig:
    """Build a config from a mapping; an optional ``preset`` key names the starting point."""
    values = dict(values)
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


def parse_overrides(overrides: Iterable[str]) -> Dict[str, Any]:
    """``["encoder_dim=192,256", "loss=standard", "beam=20"]`` -> typed values.

    Values are converted to the type of the field they set; a leading ``model.`` is
    accepted so that overrides of a whole training config can be passed through.
    """
    types = {f.name: f.type for f in fields(ZipformerConfig)}
    parsed: Dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip().removeprefix("model.").replace("-", "_")
        if key == "preset":
            parsed[key] = raw.strip()
            continue
        if key not in types:
            raise ValueError(f"unknown model option {key!r} in override {item!r}; "
                             f"valid: {sorted(types)}")
        kind = str(types[key])
        try:
            if kind.startswith("Tuple"):
                parsed[key] = _as_int_tuple(raw, key)
            elif kind == "int":
                parsed[key] = int(raw)
            elif kind == "float":
                parsed[key] = float(raw)
            elif kind == "Optional[float]":
                none = raw.strip().lower() in ("none", "null", "~", "")
                parsed[key] = None if none else float(raw)
            else:
                parsed[key] = raw.strip()
        except ValueError as error:
            raise ValueError(f"cannot read {key}={raw!r} as {kind}") from error
    return parsed


def load_config(path: Optional[Union[str, Path]] = None, overrides: Iterable[str] = (),
                section: str = "model") -> ZipformerConfig:
    """Read a YAML file (its ``model:`` section, or the whole file if it has none) and
    apply ``key=value`` overrides. With no file, start from preset M (or the override's
    ``preset=``)."""
    values: Dict[str, Any] = {}
    if path is not None:
        import yaml

        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream) or {}
        if not isinstance(document, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        values = dict(document.get(section, document))
    parsed = parse_overrides(overrides)
    if "preset" in parsed:
        # A preset given on the command line replaces the file's preset, not its overrides.
        values["preset"] = parsed.pop("preset")
    values.update(parsed)
    values.setdefault("preset", "M")
    return config_from_dict(values)


__all__ = ["ZipformerConfig", "PRESETS", "BASE_LR", "get_preset", "preset_names",
           "config_from_dict", "parse_overrides", "load_config"]
