"""What a loss call reports: reductions, excluded utterances and their statistics."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .inputs import PreparedBatch


class ExcludedUtteranceWarning(UserWarning):
    """Some utterances of a call contributed zero loss and zero gradient."""


@dataclass
class LossStats:
    """What a call computed and which utterances it left out (and why).

    excluded: (N,) bool; an excluded utterance has zero loss and exactly zero gradient.
    """

    num_utterances: int
    num_selected_classes: int
    num_not_alignable: int
    num_empty_lattice: int
    num_nonfinite: int
    excluded: torch.Tensor

    @property
    def num_excluded(self) -> int:
        return self.num_not_alignable + self.num_empty_lattice + self.num_nonfinite


def alignment_stats(batch: PreparedBatch, empty_lattice: torch.Tensor,
                    nonfinite: torch.Tensor, excluded: torch.Tensor) -> LossStats:
    return LossStats(
        num_utterances=batch.num_utterances,
        num_selected_classes=int(batch.selected_classes.numel()),
        num_not_alignable=int((~batch.alignable).sum()),
        num_empty_lattice=int(empty_lattice.sum()),
        num_nonfinite=int(nonfinite.sum()),
        excluded=excluded,
    )


def warn_if_excluded(stats: LossStats, caller: str) -> None:
    if stats.num_excluded:
        warnings.warn(
            f"{caller}: {stats.num_excluded} of {stats.num_utterances} utterances contribute "
            f"zero loss and zero gradient (not alignable, T_n < |y_n| + repeats: "
            f"{stats.num_not_alignable}; empty retained lattice: {stats.num_empty_lattice}; "
            f"nonfinite loss: {stats.num_nonfinite})",
            ExcludedUtteranceWarning,
            stacklevel=3,
        )


def pack_frames(encoder_out: torch.Tensor, frame_counts: torch.Tensor) -> torch.Tensor:
    """(N, T, D) padded -> (M, D), the valid frames utterance after utterance."""
    num_utterances, max_frames, dim = encoder_out.shape
    if bool((frame_counts == max_frames).all()):
        return encoder_out.reshape(num_utterances * max_frames, dim)
    valid = torch.arange(max_frames, device=encoder_out.device).unsqueeze(0) < frame_counts.unsqueeze(1)
    return encoder_out[valid]


def zero_nonfinite_frames(frames: torch.Tensor, batch: PreparedBatch):
    """(frames, finite_rows, nonfinite_utterances) of packed frames (M, D).

    An utterance with a nonfinite frame has a nonfinite loss: it is excluded
    (``nonfinite_utterances`` (N,) bool), and its nonfinite frames are replaced by zeros
    so that they stay out of the head's products (0 * nan would reach dW). ``finite_rows``
    (M,) bool is None when every frame is finite (then ``frames`` is returned as is).
    """
    nonfinite_utterances = torch.zeros(batch.num_utterances, dtype=torch.bool,
                                       device=frames.device)
    finite_rows = torch.isfinite(frames).all(dim=1)
    if bool(finite_rows.all()):
        return frames, None, nonfinite_utterances
    utterance_of_frame = torch.repeat_interleave(
        torch.arange(batch.num_utterances, device=frames.device), batch.frame_counts)
    nonfinite_utterances[utterance_of_frame[~finite_rows]] = True
    return frames.masked_fill(~finite_rows.unsqueeze(1), 0.0), finite_rows, nonfinite_utterances


def contributing_tokens(batch: PreparedBatch, excluded: torch.Tensor) -> torch.Tensor:
    """The target tokens of the contributing utterances, at least 1 ("mean"'s divisor)."""
    return batch.target_lengths.masked_fill(excluded, 0).sum().clamp(min=1)


def reduce_losses(losses: torch.Tensor, batch: PreparedBatch, excluded: torch.Tensor,
                  reduction: str) -> torch.Tensor:
    """"sum"; "mean": divided by the number of target tokens of the contributing
    utterances (at least 1); "none": the (N,) vector."""
    if reduction == "none":
        return losses
    total = losses.sum()
    if reduction == "mean":
        total = total / contributing_tokens(batch, excluded).to(total.dtype)
    return total


def utterance_weights(batch: PreparedBatch, excluded: torch.Tensor, reduction: str,
                      dtype: torch.dtype) -> torch.Tensor:
    """(N,) d loss / d L_n of reduction "sum" or "mean": 0 for excluded utterances."""
    weights = (~excluded).to(dtype)
    if reduction == "mean":
        weights = weights / contributing_tokens(batch, excluded).to(dtype)
    return weights
