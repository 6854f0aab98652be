"""Which training cuts a CTC model can learn from.

Two rules, as icefall's recipes apply them before batching:

* duration: keep cuts within ``[min_duration, max_duration]`` seconds (1-20 s by
  default; AISHELL-1 uses 1-12 s);
* alignability: after the model's subsampling, a cut of T feature frames has
  ``output_frames(T)`` frames (the model's own formula, e.g. ``((T - 7) // 2 + 1) // 2``
  for the Zipformer), and a CTC path over targets y needs at least
  ``len(y) + r`` frames, r being the number of adjacent equal target pairs (each
  needs a blank between the two labels). Cuts that fail cannot be aligned: their
  loss would be infinite (paper Section 3, the caller-visible exclusion).

The filter is a predicate for ``CutSet.filter`` on a lazily read manifest, so it
counts as the sampler reads: :meth:`TrainingCutFilter.summary` says how many cuts
each rule dropped so far.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

from lhotse.cut import Cut
from lhotse.utils import compute_num_frames

from asr.constants import FRAME_SHIFT_SECONDS
from asr.tokenizer import Tokenizer


def num_adjacent_repeats(token_ids: Sequence[int]) -> int:
    """Number of positions i with ``token_ids[i] == token_ids[i + 1]``."""
    return sum(1 for left, right in zip(token_ids, token_ids[1:]) if left == right)


def is_alignable(num_output_frames: int, token_ids: Sequence[int]) -> bool:
    """True if a CTC alignment of ``token_ids`` fits in ``num_output_frames`` model frames
    (paper Sec. 3: T_n >= |y_n| + r_n)."""
    return num_output_frames >= len(token_ids) + num_adjacent_repeats(token_ids)


def cut_text(cut: Cut) -> str:
    """The transcript of a cut: its supervisions' texts joined by spaces."""
    return " ".join((s.text or "").strip() for s in cut.supervisions).strip()


def cut_num_frames(cut: Cut) -> int:
    """Feature frames of a cut (10 ms shift), from its features or its duration."""
    if cut.has_features and cut.num_frames is not None:
        return int(cut.num_frames)
    return compute_num_frames(cut.duration, FRAME_SHIFT_SECONDS, cut.sampling_rate)


@dataclass
class TrainingCutFilter:
    """Predicate keeping cuts that satisfy the duration and alignability rules.

    Args:
        tokenizer: turns a cut's text into the targets whose length matters.
        output_frames: the model's output frames for a number of feature frames.
        min_duration: shortest kept cut in seconds (inclusive).
        max_duration: longest kept cut in seconds (inclusive).
    """

    tokenizer: Tokenizer
    output_frames: Callable[[int], int]
    min_duration: float = 1.0
    max_duration: float = 20.0
    kept: int = 0
    dropped_too_short: int = 0
    dropped_too_long: int = 0
    dropped_unalignable: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_duration <= self.max_duration:
            raise ValueError(
                f"need 0 <= min_duration <= max_duration, got min_duration={self.min_duration}, "
                f"max_duration={self.max_duration}"
            )

    def __call__(self, cut: Cut) -> bool:
        if cut.duration < self.min_duration:
            self.dropped_too_short += 1
            logging.debug("dropping %s: %.2f s shorter than %.2f s", cut.id, cut.duration, self.min_duration)
            return False
        if cut.duration > self.max_duration:
            self.dropped_too_long += 1
            logging.debug("dropping %s: %.2f s longer than %.2f s", cut.id, cut.duration, self.max_duration)
            return False
        token_ids = self.tokenizer.encode([cut_text(cut)])[0]
        num_frames = int(self.output_frames(cut_num_frames(cut)))
        if not is_alignable(num_frames, token_ids):
            self.dropped_unalignable += 1
            logging.debug(
                "dropping %s: %d model frames < %d tokens + %d repeats",
                cut.id, num_frames, len(token_ids), num_adjacent_repeats(token_ids),
            )
            return False
        self.kept += 1
        return True

    @property
    def dropped(self) -> int:
        """Cuts dropped by any rule so far."""
        return self.dropped_too_short + self.dropped_too_long + self.dropped_unalignable

    def reset(self) -> None:
        """Zero the counters (e.g. at the start of an epoch)."""
        self.kept = self.dropped_too_short = self.dropped_too_long = self.dropped_unalignable = 0

    def summary(self) -> str:
        """One line: how many cuts were kept and dropped by each rule."""
        seen = self.kept + self.dropped
        return (
            f"cut filter: kept {self.kept} of {seen} cuts, dropped {self.dropped} "
            f"({self.dropped_too_short} shorter than {self.min_duration:g} s, "
            f"{self.dropped_too_long} longer than {self.max_duration:g} s, "
            f"{self.dropped_unalignable} with more tokens than model frames)"
        )

    def log_summary(self) -> None:
        """Log :meth:`summary` at INFO level."""
        logging.info(self.summary())
