"""The configuration of a training run: one YAML preset plus command-line overrides.

A recipe's ``egs/<corpus>/conf/train.yaml`` has three sections::

    model:            # zipformer.presets.ZipformerConfig (``preset: M`` and overrides)
      preset: M
    data:             # zipformer.data.DataOptions
      max_duration: 1000
    train:            # TrainOptions below
      num_epochs: 50

and any field can be overridden on the command line as ``section.field=value``
(``train.num_epochs=30 data.max_duration=600 model.preset=S``). Values are read as
the type of the field they set; an unknown section or field is an error naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Type, TypeVar, Union

from zipformer.data import DataOptions
from zipformer.presets import ZipformerConfig, config_from_dict, parse_overrides

PRECISIONS = ("fp32", "bf16", "fp16")
SECTIONS = ("model", "data", "train")

# Fields that a resumed run may change without invalidating its checkpoint.
CHANGEABLE_ON_RESUME = (
    "train.num_epochs", "train.start_epoch", "train.start_batch", "train.exp_dir",
    "train.log_interval", "train.valid_interval", "train.save_every_n", "train.keep_last_k",
    "train.max_batches", "train.tensorboard", "train.device", "data.num_workers",
    "data.train_cuts", "data.valid_cuts", "data.musan_cuts", "train.lang_dir",
)


@dataclass
class TrainOptions:
    """The training loop's settings; defaults are icefall's LibriSpeech Zipformer-M recipe."""

    exp_dir: str = "exp/zipformer"
    lang_dir: str = "data/lang_bpe_500"
    num_epochs: int = 30
    start_epoch: int = 1  # > 1 resumes from epoch-<start_epoch - 1>.pt
    start_batch: int = 0  # > 0 resumes from checkpoint-<start_batch>.pt (exactly)
    base_lr: float = 0.045
    lr_batches: float = 7500.0
    lr_epochs: float = 3.5
    warmup_batches: float = 500.0
    warmup_start: float = 0.5
    clipping_scale: float = 2.0
    precision: str = "fp32"  # fp32, bf16 (autocast) or fp16 (autocast + GradScaler)
    average_period: int = 200  # batches between model_avg updates
    save_every_n: int = 4000  # batches between checkpoint-<batch>.pt files (0: never)
    keep_last_k: int = 30  # checkpoint-<batch>.pt files kept (0: all)
    valid_interval: int = 3000  # batches between validations (and after every epoch)
    log_interval: int = 50  # batches between console/tensorboard lines
    seed: int = 42
    device: str = "auto"  # auto, cpu, cuda
    tensorboard: bool = True
    max_batches: int = 0  # stop after this many global batches (0: no limit)
    # The model's schedules (dropout, layer skipping, balancers: ScheduledFloat) advance
    # with batch_idx * max_duration * world_size / schedule_ref_duration, icefall's
    # duration-adjusted batch count (facts 2.1, reference 600 s). Recipes with small
    # batches may lower it so that the schedules finish within a short run.
    schedule_ref_duration: float = 600.0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.start_epoch < 1:
            raise ValueError(f"train.start_epoch must be >= 1, got {self.start_epoch}")
        if not self.schedule_ref_duration > 0:
            raise ValueError(f"train.schedule_ref_duration must be > 0 seconds, got "
                             f"{self.schedule_ref_duration}")
        for name in ("num_epochs", "average_period", "log_interval", "valid_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.start_epoch > 1 and self.start_batch > 0:
            raise ValueError("give train.start_epoch or train.start_batch to resume, not both")


@dataclass
class RunConfig:
    """Everything that defines a training run."""

    model: ZipformerConfig = field(default_factory=ZipformerConfig)
    data: DataOptions = field(default_factory=DataOptions)
    train: TrainOptions = field(default_factory=TrainOptions)

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict (saved in every checkpoint, compared on resume)."""
        return {
            "model": self.model.to_dict(),
            "data": dataclasses.asdict(self.data),
            "train": dataclasses.asdict(self.train),
        }


def load_run_config(path: Optional[Union[str, Path]] = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a preset YAML (``model``/``data``/``train`` sections) and apply overrides."""
    document: Dict[str, Any] = {}
    if path is not None:
        import yaml

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--config: preset file not found: {path}")
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(document, dict):
            raise ValueError(f"{path}: expected a mapping with sections {SECTIONS} at the top level")
        unknown = sorted(set(document) - set(SECTIONS))
        if unknown:
            raise ValueError(f"{path}: unknown section(s) {unknown}; valid sections: {list(SECTIONS)}")
    by_section: Dict[str, List[str]] = {name: [] for name in SECTIONS}
    for item in overrides:
        section, _, rest = item.partition(".")
        if "=" not in item or section not in SECTIONS or not rest:
            raise ValueError(f"override {item!r} is not of the form <section>.<field>=<value> with "
                             f"section one of {list(SECTIONS)}")
        by_section[section].append(rest)
    model_values = dict(document.get("model") or {})
    model_values.setdefault("preset", "M")
    model = _model_config(model_values, by_section["model"])
    data = _dataclass_with_overrides(DataOptions, document.get("data") or {}, by_section["data"], "data")
    train = _dataclass_with_overrides(TrainOptions, document.get("train") or {}, by_section["train"], "train")
    return RunConfig(model=model, data=data, train=train)


def _model_config(values: Mapping[str, Any], overrides: List[str]) -> ZipformerConfig:
    values = dict(values)
    parsed = parse_overrides(overrides)
    if "preset" in parsed:
        # A preset named on the command line replaces the file's preset, not its fields.
        values["preset"] = parsed.pop("preset")
    values.update(parsed)
    return config_from_dict(values)


Options = TypeVar("Options")


def _dataclass_with_overrides(
    kind: Type[Options], values: Mapping[str, Any], overrides: List[str], section: str
) -> Options:
    types = {f.name: str(f.type) for f in dataclasses.fields(kind)}
    merged = dict(values)
    for name in merged:
        if name not in types:
            raise ValueError(f"unknown {section} option {name!r}; valid: {sorted(types)}")
    for item in overrides:
        name, _, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in types:
            raise ValueError(f"unknown {section} option {name!r} in override '{section}.{item}'; "
                             f"valid: {sorted(types)}")
        merged[name] = _parse_value(raw.strip(), types[name], f"{section}.{name}")
    return kind(**merged)


def _parse_value(raw: str, kind: str, name: str) -> Any:
    try:
        if kind == "bool":
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"cannot read {name}={raw!r} as {kind}") from None
