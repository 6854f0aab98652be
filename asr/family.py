"""The family contract: how a model family plugs into the trainer (:mod:`asr.train`), the
decoder (:mod:`asr.decode`) and the programs that load trained weights (:mod:`asr.weights`).

A family is named in a run's configuration (``family: zipformer``), registered in
:data:`asr.config.FAMILIES`, and described by a :class:`Family` record that its module
exposes as ``FAMILY``. Its models subclass :class:`Recognizer`, whose abstract members
every model must define (the batch loss with its exclusions, output lengths,
log-probabilities) and whose other members have defaults a family overrides where it
differs. The trainer and decoder call these members; they never probe for them.
:func:`load_family` and :func:`Family.build` check the record and the model they build,
so that a family missing a member fails when it is built, naming the member.

An optimizer that clips gradients does so inside its ``step()``: ``GradScaler.step``
unscales fp16 gradients before calling it. The scheduler steps per update and per epoch
(``step_batch(update)``, ``step_epoch(epoch)``), reports ``get_last_lr()`` and saves
``state_dict()``.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, FrozenSet, List, Mapping, Optional, Protocol, Tuple, Union

import torch
from torch import Tensor, nn

from asr.config import FAMILIES, PathLike, family_config_classes
from asr.decode_methods import CTC_SEARCH, DECODING_KINDS, GENERATION, STREAMING
from asr.tokenizer import Tokenizer, load_tokenizer

FrameCount = Union[int, Tensor]

class LossStats(Protocol):
    """What the trainer reads of a batch loss's statistics (:class:`pruned_ctc.LossStats` is one)."""

    excluded: Tensor  # (N,) bool: utterances the loss left out (zero loss and gradient)
    num_excluded: int


@dataclass
class NothingExcluded:
    """The statistics of a loss that keeps every utterance (e.g. cross-entropy)."""

    excluded: Tensor
    num_excluded: int = 0

    @classmethod
    def of_batch(cls, features: Tensor) -> "NothingExcluded":
        return cls(torch.zeros(features.shape[0], dtype=torch.bool, device=features.device))


class Recognizer(nn.Module, metaclass=abc.ABCMeta):
    """A speech recognizer as the toolkit trains and decodes it.

    Required (abstract): :meth:`forward` (the summed loss of a batch and which
    utterances it excluded), :meth:`output_lengths` and :meth:`log_probs`. A model decoded
    other than by CTC search says so in :attr:`decoding` and overrides the member that
    kind needs (:meth:`generate_ids`, :meth:`streaming_ids`); :meth:`log_probs` then raises
    :class:`NotDecodableBy`.
    """

    # The kinds of decoding the model supports (asr.decode_methods.DECODING_KINDS).
    decoding: ClassVar[FrozenSet[str]] = frozenset({CTC_SEARCH})
    # Mel bins of the log-mel fbank features the model reads (at 100 frames per second).
    feature_dim: int = 80

    @abc.abstractmethod
    def forward(self, features: Tensor, feature_lens: Tensor, targets: List[List[int]],
                return_stats: bool = False) -> Union[Tensor, Tuple[Tensor, LossStats]]:
        """The batch loss summed over utterances (features (N, T, F), feature_lens (N,),
        targets: token ids per utterance); with ``return_stats`` also its
        :class:`LossStats`."""

    @abc.abstractmethod
    def output_lengths(self, num_feature_frames: FrameCount) -> FrameCount:
        """Model frames T' for a number of feature frames (an int or a tensor): the cut
        filter's alignability rule and the per-frame loss use it."""

    @abc.abstractmethod
    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Full-vocabulary log-probabilities (N, T', V), float32, and T' (N,), for CTC search."""

    def best_frame_ids(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Each frame's best class (N, T') and T' (N,): what greedy search alone needs. A
        model with a vocabulary too large for (N, T', V) log-probs computes it directly."""
        log_probs, lengths = self.log_probs(features, feature_lens)
        return log_probs.argmax(dim=-1), lengths

    def start_update(self, update: int, batch_count: float) -> None:
        """Called before each optimizer update's microbatches: ``update`` counts updates
        from 1 (randomness keyed by it stays exact on resume); ``batch_count`` is icefall's
        duration-adjusted batch count (schedules such as the Zipformer's). Default: nothing."""

    def checkpoint_state_dict(self) -> Dict[str, Tensor]:
        """What a checkpoint holds of the model (and what the running average covers).
        Default: ``state_dict()``; a model next to frozen pretrained parts holds less."""
        return self.state_dict()

    def load_checkpoint_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Inverse of :meth:`checkpoint_state_dict`."""
        self.load_state_dict(state)

    def uses_every_trained_weight(self) -> bool:
        """Whether every weight that trains takes part in every training step's loss. Under
        DDP, False (the default) has it look for unused weights after every forward pass
        (``find_unused_parameters``: a walk over the whole autograd graph, 6-9% of a
        two-process update of egs/mini's stage 10, egs/mini/RESULTS.md); a model that skips
        layers at random, as the Zipformer's schedules do, must say False. A True that is
        wrong stops the next update with DDP's error naming the unused weights."""
        return False

    def prepare_for_decoding(self) -> None:
        """Called once after the trained weights are loaded for decoding or export (e.g.
        LoRA merged into the base weights). Default: nothing."""

    def generate_ids(self, features: Tensor, feature_lens: Tensor, beam: Optional[int] = None) -> List[List[int]]:
        """Token ids per utterance by generation (:data:`GENERATION`): greedy when ``beam``
        is None."""
        raise NotDecodableBy(self, GENERATION)

    def streaming_ids(self, features: Tensor, feature_lens: Tensor, history_seconds: int, search: str,
                      beam: int = 4, token_penalty: float = 0.0, blank_penalty: float = 0.0,
                      seam_merge_seconds: float = 0.0) -> Tuple[List[List[int]], List[int]]:
        """Token ids per utterance decoded chunk by chunk (:data:`STREAMING`) with CTC
        ``search`` (``ctc-greedy-search`` / ``ctc-prefix-beam-search``, ``beam``,
        ``token_penalty`` and ``blank_penalty`` as :mod:`asr.search` reads them) and a
        history of ``history_seconds``, and each utterance's largest KV cache;
        ``seam_merge_seconds`` > 0: the seams of overlapping chunks merged over that many
        seconds on each side (``decode.seam_merge_seconds``, :mod:`asr.streaming_search`), a
        ValueError where the chunks do not overlap."""
        raise NotDecodableBy(self, STREAMING)

    def cache_bound(self, history_seconds: int) -> int:
        """The largest KV cache :meth:`streaming_ids` may hold at that history."""
        raise NotDecodableBy(self, STREAMING)


class NotDecodableBy(NotImplementedError):
    """A model was asked for a kind of decoding it does not support."""

    def __init__(self, model: nn.Module, kind: str) -> None:
        supported = ", ".join(sorted(model.decoding)) if isinstance(model, Recognizer) else "none"
        super().__init__(f"{type(model).__name__} is not decoded by {kind} (it supports: {supported})")


# The member a model must override for each kind of decoding it declares.
_MEMBER_OF_KIND = {CTC_SEARCH: "log_probs", GENERATION: "generate_ids", STREAMING: "streaming_ids"}


def check_model(model: Any, family: str) -> None:
    """TypeError naming what is missing unless ``model`` keeps the contract."""
    if not isinstance(model, Recognizer):
        raise TypeError(f"family {family!r}: build_model returned a {type(model).__name__}, which is not an "
                        "asr.family.Recognizer")
    unknown = set(model.decoding) - set(DECODING_KINDS)
    if unknown:
        raise TypeError(f"family {family!r}: {type(model).__name__}.decoding names unknown kinds {sorted(unknown)}; "
                        f"valid: {list(DECODING_KINDS)}")
    for kind in sorted(model.decoding):
        member = _MEMBER_OF_KIND[kind]
        if not _overrides(type(model), member):
            raise TypeError(f"family {family!r}: {type(model).__name__} is decoded by {kind} but does not "
                            f"define {member}()")
    if STREAMING in model.decoding and not _overrides(type(model), "cache_bound"):
        raise TypeError(f"family {family!r}: {type(model).__name__} is decoded by {STREAMING} but does not "
                        "define cache_bound()")


def _overrides(cls: type, member: str) -> bool:
    """Whether ``cls`` or a base below :class:`Recognizer` defines ``member``."""
    for klass in cls.__mro__:
        if klass is Recognizer:
            return False
        if member in vars(klass):
            return True
    return False


@dataclass(frozen=True)
class Family:
    """A model family: its name, the classes of its ``model`` and ``optim`` sections, and
    how to build its model, optimizer (with schedule) and, when the lexicon comes with
    the model (an LLM's own tokenizer), its tokenizer."""

    name: str
    model_config: type
    optim_config: type
    # (model_config, vocab_size, blank_id) -> Recognizer
    build_model: Callable[[Any, int, int], Recognizer]
    # (model, optim_config) -> (optimizer, scheduler)
    build_optimizer: Callable[[nn.Module, Any], Tuple[torch.optim.Optimizer, Any]]
    # model_config -> Tokenizer, or None: the lexicon of train.lang_dir
    build_tokenizer: Optional[Callable[[Any], Tokenizer]] = None
    # Fields of the model section that name files or folders (a pretrained LLM, an encoder
    # checkpoint): a relative one is resolved where the run was trained (asr.weights).
    path_fields: Tuple[str, ...] = ()

    def build(self, model_config: Any, vocab_size: int, blank_id: int) -> Recognizer:
        """The family's model, checked against the contract (:func:`check_model`)."""
        if not isinstance(model_config, self.model_config):
            raise TypeError(f"family {self.name!r} builds from a {self.model_config.__name__}, got a "
                            f"{type(model_config).__name__}")
        model = self.build_model(model_config, vocab_size, blank_id)
        check_model(model, self.name)
        return model

    def tokenizer(self, model_config: Any, lang_dir: PathLike) -> Tokenizer:
        """The run's lexicon: the family's own tokenizer, or ``lang_dir``'s."""
        if self.build_tokenizer is not None:
            return self.build_tokenizer(model_config)
        return load_tokenizer(lang_dir)


_LOADED: Dict[str, Family] = {}


def load_family(name: str) -> Family:
    """The :class:`Family` record of family ``name`` (its module's ``FAMILY``), checked."""
    if name in _LOADED:
        return _LOADED[name]
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; valid: {sorted(FAMILIES)}")
    module = importlib.import_module(FAMILIES[name][2])
    family = vars(module).get("FAMILY")
    if not isinstance(family, Family):
        raise TypeError(f"family {name!r}: module {module.__name__} defines no FAMILY = asr.family.Family(...)")
    if family.name != name:
        raise TypeError(f"family {name!r}: module {module.__name__} describes family {family.name!r}")
    if (family.model_config, family.optim_config) != family_config_classes(name):
        raise TypeError(f"family {name!r}: the section classes of {module.__name__}.FAMILY differ from those "
                        "registered in asr.config.FAMILIES")
    for member, value in (("build_model", family.build_model), ("build_optimizer", family.build_optimizer)):
        if not callable(value):
            raise TypeError(f"family {name!r}: FAMILY.{member} is not callable")
    _LOADED[name] = family
    return family
