"""The configuration of a run: one YAML preset plus ``section.field=value`` overrides.

A recipe's ``egs/<corpus>/conf/<model>.yaml`` has up to five sections, names its model
family (default ``zipformer``) and may extend a base preset (:mod:`asr.preset_files`)::

    base: train.yaml  # optional: a preset in the same folder, merged key by key below this one
    family: zipformer
    model:            # the family's model config (zipformer.presets.ZipformerConfig)
      preset: S
    optim:            # the family's optimizer and schedule (ScaledAdam + Eden for zipformer)
      base_lr: 0.04
    data:             # DataOptions below: manifests, batching, augmentation
      max_duration: 1000
    train:            # TrainOptions below: the training loop
      num_epochs: 50
    decode:           # DecodeOptions below: checkpoint choice and search
      beam_size: 8

A preset holds only what differs from its base or from the schema's defaults. Every
program (``asr.train``, ``asr.decode``, the benchmarks, the recipes' shell) reads it with
:func:`load_run_config`; any field can be overridden on the command line as
``section.field=value`` (``train.num_epochs=30 data.max_duration=600 model.preset=S``).
Values are read as the type of the field they set; an unknown section or field is an
error naming it, a renamed one an error naming its new name (:mod:`asr.renamed_keys`).
Each default lives once: in the dataclass that owns the field.

This module imports the standard library and yaml only (and a family's config module,
which must do the same), so reading a preset is cheap and imports no lhotse or torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from asr.decode_methods import DEFAULT_METHODS, STREAMING, method_of
from asr.preset_files import SECTIONS, merge_presets, read_preset_chain
from asr.override_values import format_value, parse_value
from asr.renamed_keys import refusal, translate_saved_config

PathLike = Union[str, Path]

PRECISIONS = ("fp32", "bf16", "fp16")
# Model families: name -> (model section class, optim section class, the module that
# builds model and optimizer; see asr.family). The classes' modules import the standard
# library only.
FAMILIES: Dict[str, Tuple[str, str, str]] = {
    "zipformer": ("zipformer.presets:ZipformerConfig", "zipformer.presets:ScaledAdamOptions", "zipformer.family"),
    "llm_ctc": ("llm_ctc.config:LLMASRConfig", "llm_ctc.config:AdamWOptions", "llm_ctc.family"),
}
DEFAULT_FAMILY = "zipformer"

# Fields that a resumed run may change without invalidating its checkpoint.
CHANGEABLE_ON_RESUME = (
    "train.num_epochs", "train.start_epoch", "train.start_batch", "train.exp_dir", "train.auto_resume",
    "train.log_interval", "train.valid_interval", "train.save_every_n", "train.keep_last_k",
    "train.max_batches", "train.tensorboard", "train.device", "train.zero1", "train.accum_grad", "train.init_from",
    "train.virtual_ranks",
    "data.num_workers",
    "data.train_cuts", "data.valid_cuts", "data.musan_cuts", "train.lang_dir", "decode",
)


@dataclass
class DataOptions:
    """The data module's settings (:mod:`asr.data`). Durations are in seconds; defaults
    are icefall's LibriSpeech values."""

    # Cut manifests; several comma-separated files (or glob patterns of pieces) are
    # interleaved (see asr.data.load_cuts_lazy).
    train_cuts: str = (
        "data/fbank/librispeech_cuts_train-clean-100.jsonl.gz,"
        "data/fbank/librispeech_cuts_train-clean-360.jsonl.gz,"
        "data/fbank/librispeech_cuts_train-other-500.jsonl.gz"
    )
    valid_cuts: str = "data/fbank/librispeech_cuts_dev-clean.jsonl.gz,data/fbank/librispeech_cuts_dev-other.jsonl.gz"
    musan_cuts: str = "data/fbank/musan_cuts.jsonl.gz"
    max_duration: float = 200.0  # total seconds of audio per batch (of each rank, as icefall's --max-duration)
    # True: max_duration is the batch of all ranks together, each rank drawing
    # max_duration / world_size seconds, so N processes train the updates of one (the
    # same global batch and schedule) in less time: CPU processes on one machine
    # (recipes' --cpu-processes). False: every rank draws max_duration.
    batch_across_ranks: bool = False
    num_buckets: int = 30
    shuffle: bool = True
    drop_last: bool = True
    num_workers: int = 2
    on_the_fly_feats: bool = False  # compute fbank from the audio instead of reading it
    on_the_fly_num_mel_bins: int = 80  # its bins: the model's input width (128 for the LLM encoders)
    min_cut_duration: float = 1.0
    max_cut_duration: float = 20.0
    enable_musan: bool = True
    musan_prob: float = 0.5
    musan_snr_min: float = 10.0  # dB
    musan_snr_max: float = 20.0  # dB
    enable_spec_aug: bool = True
    spec_aug_time_warp_factor: int = 80
    spec_aug_num_feature_masks: int = 2
    spec_aug_features_mask_size: int = 27  # frequency bins
    spec_aug_num_frame_masks: int = 10
    spec_aug_frames_mask_size: int = 100  # frames
    # Features and SpecAugment per chunk of this many seconds of audio (paper App. D.4,
    # streaming models; asr.chunk_features), 0: per cut. None (unset): a streaming
    # model's chunk (model.streaming_chunk_seconds when model.streaming), else 0.
    feature_chunk_seconds: Optional[int] = None
    # Training only: join each batch's cuts back to back, ``concatenate_gap`` seconds of
    # silence apart, into cuts of at most this many seconds (Lhotse's CutConcatenate, as
    # icefall's --concatenate-cuts), so that sentences start anywhere in a streaming
    # model's chunks; 0: each cut alone. ``concatenate_probability``: the share of
    # batches joined (drawn per batch from its cuts, so a resumed run draws the same),
    # the rest left as single sentences. ``concatenate_each``: "batch", the whole batch
    # joined or not; "cut", each cut drawn with ``concatenate_probability`` and the drawn
    # ones joined, so that every batch holds joined and single sentences alike.
    # ``concatenate_max_gap`` above ``concatenate_gap``: each joined batch's silence drawn
    # uniformly between the two (per batch, from its cuts), so that joins come back to back
    # and with pauses; 0: always ``concatenate_gap``. ``concatenate_gap_probability``: the
    # share of joined batches whose silence is drawn so, the rest ``concatenate_gap``.
    concatenate_seconds: float = 0.0
    concatenate_gap: float = 0.1
    concatenate_max_gap: float = 0.0
    concatenate_gap_probability: float = 1.0
    concatenate_probability: float = 1.0
    concatenate_each: str = "batch"
    # Training only: each example (joined or alone) followed by silence drawn uniformly
    # between 0 and this many seconds (in 10 ms steps, per example from the batch's cuts),
    # so that not every input ends on a word (CutConcatenate puts silence only between
    # cuts); 0: none.
    trailing_silence_max: float = 0.0
    # Training only: the same before each example (its own draw), so that not every input
    # starts on a word, as a stream starts with silence; 0: none.
    leading_silence_max: float = 0.0

    def __post_init__(self) -> None:
        positive = ("max_duration", "num_buckets", "spec_aug_features_mask_size", "spec_aug_frames_mask_size",
                    "on_the_fly_num_mel_bins")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"data.{name} must be positive, got {getattr(self, name)!r}")
        non_negative = ("num_workers", "min_cut_duration", "spec_aug_num_feature_masks", "spec_aug_num_frame_masks")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"data.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.musan_prob <= 1.0:
            raise ValueError(f"data.musan_prob must be in [0, 1], got {self.musan_prob!r}")
        if self.min_cut_duration > self.max_cut_duration:
            raise ValueError(f"data.min_cut_duration {self.min_cut_duration} exceeds data.max_cut_duration "
                             f"{self.max_cut_duration}")
        if self.musan_snr_min > self.musan_snr_max:
            raise ValueError(f"data.musan_snr_min {self.musan_snr_min} exceeds data.musan_snr_max "
                             f"{self.musan_snr_max}")
        for name in ("concatenate_seconds", "concatenate_gap", "concatenate_max_gap", "trailing_silence_max",
                     "leading_silence_max"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"data.{name} must be >= 0 (seconds), got {getattr(self, name)!r}")
        if 0 < self.concatenate_max_gap < self.concatenate_gap:
            raise ValueError(f"data.concatenate_max_gap {self.concatenate_max_gap} is below data.concatenate_gap "
                             f"{self.concatenate_gap} (0: no range)")
        for name in ("concatenate_probability", "concatenate_gap_probability"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"data.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.concatenate_each not in ("batch", "cut"):
            raise ValueError(f"data.concatenate_each must be 'batch' or 'cut', got {self.concatenate_each!r}")
        if self.feature_chunk_seconds is not None and self.feature_chunk_seconds < 0:
            raise ValueError(f"data.feature_chunk_seconds must be >= 0 (whole seconds; 0: per cut), got "
                             f"{self.feature_chunk_seconds!r}")


@dataclass
class TrainOptions:
    """The training loop's settings; defaults are icefall's LibriSpeech Zipformer-M recipe."""

    exp_dir: str = "exp/zipformer_pruned_ctc"
    lang_dir: str = "data/lang_bpe_500"
    num_epochs: int = 30
    # With auto_resume, a run continues from the newest checkpoint of exp_dir (and says
    # "already finished" when epoch-<num_epochs>.pt exists). start_epoch / start_batch name
    # a checkpoint explicitly: epoch-<start_epoch - 1>.pt or checkpoint-<start_batch>.pt.
    auto_resume: bool = True
    start_epoch: int = 1
    start_batch: int = 0
    precision: str = "fp32"  # fp32, bf16 (autocast) or fp16 (autocast + GradScaler)
    average_period: int = 200  # batches between model_avg updates
    save_every_n: int = 4000  # batches between checkpoint-<batch>.pt files (0: never)
    keep_last_k: int = 30  # checkpoint-<batch>.pt files kept (0: all)
    valid_interval: int = 3000  # batches between validations (and after every epoch)
    log_interval: int = 50  # batches between console/tensorboard lines
    seed: int = 42  # the run's one seed: model initialization, data order and augmentation
    device: str = "auto"  # auto, cpu, cuda
    tensorboard: bool = True
    max_batches: int = 0  # stop after this many global batches (0: no limit)
    # The model's schedules (dropout, layer skipping, balancers) advance with
    # batch_idx * max_duration * world_size * accum_grad / schedule_ref_duration (without
    # the world size with data.batch_across_ranks): icefall's
    # duration-adjusted batch count (egs/librispeech/ASR/zipformer/train.py,
    # get_adjusted_batch_count, reference 600 s). Recipes with small batches may lower it
    # so that the schedules finish within a short run.
    schedule_ref_duration: float = 600.0
    # ZeRO stage 1 under DDP (asr/train_zero1.py): optimizer state sharded across ranks.
    zero1: bool = False
    # Gradient accumulation (ESPnet's accum_grad; the paper's GA, App. D.3 Table 8):
    # microbatches of data.max_duration per rank whose gradients are summed into one
    # optimizer update. Every count above that says "batches" (max_batches,
    # save_every_n, average_period, valid_interval, log_interval, the schedules) counts
    # updates; checkpoints fall on update boundaries only (asr/train.py).
    accum_grad: int = 1
    # Ranks per process (asr/rank_group.py): each process trains as this many DDP ranks
    # of a world of processes x virtual_ranks, drawing each rank's batches and averaging
    # their gradients as DDP does, so one process makes the updates of several (a run
    # planned on 2 GPUs on one, or a laptop's one core). A run resumes with any number of
    # processes and virtual_ranks of the same product.
    virtual_ranks: int = 1
    # Fine-tuning (ESPnet's --init_param, icefall's --finetune-ckpt): the model weights
    # of this checkpoint file (its "model" entry, as asr.train and
    # local.export_decoding_weights write it) start the run instead of a random
    # initialization; the optimizer and schedule start afresh. A resumed run continues
    # from its own checkpoint. Empty: random initialization.
    init_from: str = ""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.start_epoch < 1:
            raise ValueError(f"train.start_epoch must be >= 1, got {self.start_epoch}")
        if not self.schedule_ref_duration > 0:
            raise ValueError(f"train.schedule_ref_duration must be > 0 seconds, got "
                             f"{self.schedule_ref_duration}")
        for name in ("num_epochs", "average_period", "log_interval", "valid_interval", "accum_grad",
                     "virtual_ranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.start_epoch > 1 and self.start_batch > 0:
            raise ValueError("give train.start_epoch or train.start_batch to resume, not both")


@dataclass
class DecodeOptions:
    """The decoder's settings (:mod:`asr.decode`): which weights, which search, which data.

    The weights are chosen as icefall's decoders choose them: ``epoch`` (a number or
    ``last``) or ``iter`` (a batch number or ``last``; ``0`` means use ``epoch``), ``avg``
    checkpoints, and ``use_averaged_model`` for the exact running average between them.
    """

    epoch: str = "last"
    iter: str = "0"
    avg: int = 1
    use_averaged_model: bool = True
    methods: Tuple[str, ...] = DEFAULT_METHODS  # names of asr.decode_methods.METHODS
    # Search width: prefixes kept by ctc-prefix-beam-search (paper Sec. 5.2), hypotheses by
    # llm-beam-search (App. D.2-D.3). The loss's alignment beam is model.alignment_beam.
    beam_size: int = 4
    token_penalty: float = 0.0  # added per emitted token (paper App. D.3-D.4: 0.3 or 0.7 for LLM-CTC)
    # Subtracted from blank's log-probability at every frame by the CTC searches (icefall's
    # --blank-penalty); several values (0,0.5,1) give one setting each from one forward pass.
    blank_penalty: Tuple[float, ...] = (0.0,)
    test_cuts: str = ""  # comma-separated manifests, or NAME=PATH items
    max_duration: float = 0.0  # seconds per batch; 0: data.max_duration
    compute_cer: str = "auto"  # auto (a character lexicon scores characters), true, false
    text_normalization: str = "none"  # none, gigaspeech (the official scoring rules)
    device: str = "auto"
    history_seconds: Tuple[int, ...] = (8,)  # left histories h of the ctc-streaming-* methods (paper Table 5)
    # Seconds of silence after every test cut before its features, as a stream's end is fed
    # to a streaming recognizer (sherpa-onnx's tail padding); > 0 names every setting
    # ``..._tail-padding-<s>s``. Zero samples where features come from the audio (per chunk
    # or on the fly), frames of the fbank of zeros where they are read.
    tail_padding_seconds: float = 0.0
    # The same before every test cut, as a stream starts with silence; > 0 names every
    # setting ``..._lead-padding-<s>s`` (before any tail padding's suffix).
    lead_padding_seconds: float = 0.0
    # > 0: the ctc-streaming-* methods of a model with a lookahead (whose chunks' encoder
    # windows overlap) merge the seams: tokens the frame argmax takes within this many
    # seconds before a chunk boundary and again within as many after it are written once
    # (asr.streaming_search); names every streaming setting ``..._seam-merge-<s>s_history-<h>s``.
    seam_merge_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.methods = tuple(dict.fromkeys(self.methods))
        for method in self.methods:
            method_of(method)
        if not self.methods:
            raise ValueError(f"decode.methods is empty; valid: {list(DEFAULT_METHODS)} and the others of "
                             "asr.decode_methods.METHODS")
        if self.epoch != "last" and not _is_count(self.epoch, minimum=1):
            raise ValueError(f"decode.epoch must be a positive number or 'last', got {self.epoch!r}")
        if self.iter != "last" and not _is_count(self.iter, minimum=0):
            raise ValueError(f"decode.iter must be a batch number, 'last' or 0 (use decode.epoch), got {self.iter!r}")
        if self.avg < 1:
            raise ValueError(f"decode.avg must be >= 1, got {self.avg}")
        if self.beam_size < 1:
            raise ValueError(f"decode.beam_size must be >= 1, got {self.beam_size}")
        if self.max_duration < 0:
            raise ValueError(f"decode.max_duration must be >= 0, got {self.max_duration}")
        if isinstance(self.history_seconds, int):
            self.history_seconds = (self.history_seconds,)
        self.history_seconds = tuple(dict.fromkeys(self.history_seconds))
        if not self.history_seconds or min(self.history_seconds) < 1:
            raise ValueError(f"decode.history_seconds must be whole seconds >= 1, got {list(self.history_seconds)}")
        if isinstance(self.blank_penalty, (int, float)):
            self.blank_penalty = (self.blank_penalty,)
        self.blank_penalty = tuple(dict.fromkeys(float(value) for value in self.blank_penalty))
        if not self.blank_penalty or not all(math.isfinite(value) for value in self.blank_penalty):
            raise ValueError(f"decode.blank_penalty must be one or more finite numbers, got {list(self.blank_penalty)}")
        if self.seam_merge_seconds and not any(method_of(name).needs == STREAMING for name in self.methods):
            raise ValueError("decode.seam_merge_seconds merges the seams of the ctc-streaming-* methods; "
                             f"decode.methods {list(self.methods)} has none")
        for name in ("tail_padding_seconds", "lead_padding_seconds", "seam_merge_seconds"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"decode.{name} must be a finite number of seconds >= 0, got {getattr(self, name)!r}")
        choices = {"compute_cer": ("auto", "true", "false"), "text_normalization": ("none", "gigaspeech"),
                   "device": ("auto", "cpu", "cuda")}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"decode.{name} must be one of {valid}, got {getattr(self, name)!r}")


def _is_count(text: str, minimum: int) -> bool:
    return text.isdigit() and int(text) >= minimum


@dataclass
class RunConfig:
    """Everything that defines a run: the family and its five sections."""

    family: str = DEFAULT_FAMILY
    model: Any = None
    optim: Any = None
    data: DataOptions = field(default_factory=DataOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    decode: DecodeOptions = field(default_factory=DecodeOptions)

    def __post_init__(self) -> None:
        model_class, optim_class = family_config_classes(self.family)
        if self.model is None:
            self.model = model_class()
        if self.optim is None:
            self.optim = optim_class()
        self._resolve_feature_chunks()

    def _resolve_feature_chunks(self) -> None:
        """Per-chunk features follow a streaming model's chunks (App. D.4) unless set;
        set, they must be that chunk or 0 (the cut's features sliced at chunk boundaries)."""
        streaming = bool(getattr(self.model, "streaming", False))
        chunk = getattr(self.model, "streaming_chunk_seconds", 0) if streaming else 0
        given = self.data.feature_chunk_seconds
        if given is None:
            self.data.feature_chunk_seconds = chunk
        elif given and given != chunk:
            needs = f"model.streaming_chunk_seconds={chunk}" if streaming else "a streaming model (model.streaming)"
            raise ValueError(f"data.feature_chunk_seconds={given} needs {needs}: features are chunked as the "
                             "model's chunks (0: per cut)")

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict (saved in every checkpoint, compared on resume)."""
        return {"family": self.family, **{name: section_to_dict(getattr(self, name)) for name in SECTIONS}}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], overrides: Iterable[str] = ()) -> "RunConfig":
        """The inverse of :meth:`to_dict` (a checkpoint's saved configuration, its keys
        renamed since translated), with ``section.field=value`` overrides applied."""
        document = translate_saved_config(values)
        return _build(document, _overrides_by_section(overrides, document), source="saved configuration")


def section_to_dict(section: Any) -> Dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(section).items()}


def family_config_classes(family: str) -> Tuple[type, type]:
    """The model and optim section classes of a family."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid: {sorted(FAMILIES)}")
    return tuple(_import_class(spec) for spec in FAMILIES[family][:2])  # type: ignore[return-value]


def _import_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def load_run_config(path: Optional[PathLike] = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a preset YAML (``family``, the sections of :data:`SECTIONS`, optionally a
    ``base`` preset it extends) and apply ``section.field=value`` overrides
    (``family=NAME`` switches the family). Errors name the preset file at fault."""

    chain = read_preset_chain(path) if path is not None else []
    document = merge_presets(chain)
    by_section = _overrides_by_section(overrides, document)
    family = document.get("family") or DEFAULT_FAMILY
    classes = section_classes(family)
    for preset in chain:
        for name, kind in classes.items():
            for key in preset.document.get(name) or {}:
                _check_key(kind, family, name, key, source=f"{preset.path}: ")
    for name in ("vocab_size", "blank_id"):
        files = [str(p.path) for p in chain if name in (p.document.get("model") or {})]
        if files or any(o.split("=")[0].strip() == name for o in by_section["model"]):
            raise ValueError(f"model.{name} is taken from the lexicon of train.lang_dir (its tokens.txt or "
                             f"bpe.model); remove it from {', '.join(files) or 'the overrides'}")
    if path is None:
        return _build(document, by_section, "defaults")
    try:
        return _build(document, by_section, str(path))
    except OverrideError:
        raise
    except ValueError as error:
        raise ValueError(f"{path}{' with the overrides' if overrides else ''}: {error}") from None


def _overrides_by_section(overrides: Iterable[str], document: Dict[str, Any]) -> Dict[str, List[str]]:
    """``section.field=value`` items grouped by section (``family=NAME`` goes into ``document``)."""
    by_section: Dict[str, List[str]] = {name: [] for name in SECTIONS}
    for item in overrides:
        section, _, rest = item.partition(".")
        if item.startswith("family="):
            document["family"] = item.partition("=")[2].strip()
            continue
        if "=" not in item or section not in SECTIONS or not rest or "=" not in rest:
            raise ValueError(f"override {item!r} is not of the form <section>.<field>=<value> with section one "
                             f"of {list(SECTIONS)} (or family=<name>)")
        by_section[section].append(rest)
    return by_section


def section_classes(family: str) -> Dict[str, type]:
    """Section name -> the dataclass that reads it, for a family."""
    model_class, optim_class = family_config_classes(family)
    return {"model": model_class, "optim": optim_class, "data": DataOptions, "train": TrainOptions,
            "decode": DecodeOptions}


def _build(document: Dict[str, Any], by_section: Dict[str, List[str]], source: str) -> RunConfig:
    family = document.get("family") or DEFAULT_FAMILY
    sections = {}
    for name, kind in section_classes(family).items():
        values = document.get(name) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{source}: section {name!r} must be a mapping, got {values!r}")
        sections[name] = build_section(kind, values, by_section[name], name, family=family)
    return RunConfig(family=family, **sections)


Section = TypeVar("Section")


def build_section(kind: Type[Section], values: Mapping[str, Any], overrides: Iterable[str], section: str,
                  family: str = DEFAULT_FAMILY) -> Section:
    """A section's dataclass from its YAML values and ``field=value`` overrides.

    Overrides are typed by the field they set. A class may accept keys that are not
    fields (``extra_keys``, e.g. a model's ``preset``) and build itself from the merged
    mapping (``from_dict``); otherwise the fields are its keyword arguments. Renamed
    keys are refused, naming the new key (``family`` decides the model section's).
    """
    types = _section_keys(kind)
    merged = dict(values)
    for name in merged:
        _check_key(kind, family, section, name)
    for item in overrides:
        name, _, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        _check_key(kind, family, section, name, override=f"{section}.{item}")
        try:
            merged[name] = parse_value(raw.strip(), types[name], f"{section}.{name}")
        except ValueError as error:
            raise OverrideError(str(error)) from None
    builder = getattr(kind, "from_dict", None)
    try:
        return builder(merged) if builder is not None else kind(**merged)
    except TypeError as error:
        raise ValueError(f"{section}: {error}") from None


def _section_keys(kind: type) -> Dict[str, str]:
    return {**field_types(kind), **getattr(kind, "extra_keys", {})}


class OverrideError(ValueError):
    """A ``section.field=value`` override that names no field or gives an unreadable value."""


def _check_key(kind: type, family: str, section: str, key: str, source: str = "", override: str = "") -> None:
    """Refuse a key that ``kind`` does not read: renamed (naming the new key) or unknown;
    ``source`` (a preset file) or ``override`` (the item) say where it was given."""
    if key in _section_keys(kind):
        return
    error = OverrideError if override else ValueError
    reason = refusal(family, section, key)
    if reason is not None:
        raise error(f"{source}{section}.{key} is {reason}" + (f" (given as override '{override}')" if override else ""))
    where = f" in override '{override}'" if override else ""
    raise error(f"{source}unknown {section} option {key!r}{where}; valid: {sorted(_section_keys(kind))}")


def field_types(kind: type) -> Dict[str, str]:
    """Field name -> type as written in the class (``int``, ``Optional[float]``, ...)."""
    return {f.name: f.type if isinstance(f.type, str) else _type_name(f.type) for f in dataclasses.fields(kind)}


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


__all__ = ["RunConfig", "DataOptions", "TrainOptions", "DecodeOptions", "load_run_config", "build_section",
           "section_classes", "format_value",
           "parse_value", "family_config_classes", "FAMILIES", "SECTIONS", "CHANGEABLE_ON_RESUME", "PathLike"]
