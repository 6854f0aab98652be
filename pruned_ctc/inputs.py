"""Validation and normalization of one loss call.

Turns the user's arguments into a :class:`PreparedBatch`: frame counts, targets in one
flat tensor, the selected classes U (blank first, then the sorted distinct labels of the
batch, paper Alg. 1 lines 2-3), targets relabeled into [0, K), and which utterances are
structurally alignable (T_n >= |y_n| + r_n, paper App. B.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

Targets = Union[torch.Tensor, Sequence[Sequence[int]]]

# The paper's chunk width C (Sec. 3.2) and alignment beam (Sec. 3.3), the defaults of
# every public call.
DEFAULT_CHUNK_SIZE = 4096
DEFAULT_BEAM = 100.0

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass
class PreparedBatch:
    """Everything the loss needs about one batch, on the device of ``encoder_out``.

    Attributes:
        frame_counts: (N,) int64, T_n.
        target_lengths: (N,) int64, |y_n|.
        flat_targets: (sum_n |y_n|,) int64, the original class ids, utterance after utterance.
        selected_classes: (K,) int64, vocabulary ids of U; ``selected_classes[0]`` is blank.
        relabeled_targets: (N, max_n |y_n|) int64, targets as indices into U (1..K-1),
            padded with 0.
        alignable: (N,) bool, T_n >= |y_n| + r_n.
    """

    frame_counts: torch.Tensor
    target_lengths: torch.Tensor
    flat_targets: torch.Tensor
    selected_classes: torch.Tensor
    relabeled_targets: torch.Tensor
    alignable: torch.Tensor

    @property
    def num_utterances(self) -> int:
        return int(self.frame_counts.numel())


def _check_integer_tensor(name: str, value: torch.Tensor) -> None:
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")


def check_head_inputs(
    encoder_out: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]
) -> None:
    """Checks shapes, dtypes and devices of the head input and the head parameters."""
    for name, value in (("encoder_out", encoder_out), ("weight", weight), ("bias", bias)):
        if value is None and name == "bias":
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype not in SUPPORTED_FLOAT_DTYPES:
            raise TypeError(
                f"{name} has unsupported dtype {value.dtype}; expected one of "
                f"{[str(d) for d in SUPPORTED_FLOAT_DTYPES]}"
            )
    if encoder_out.dim() != 3:
        raise ValueError(
            f"encoder_out must have shape (N, T, D), got {tuple(encoder_out.shape)}"
        )
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (V, D), got {tuple(weight.shape)}")
    if weight.shape[1] != encoder_out.shape[2]:
        raise ValueError(
            f"weight has D = {weight.shape[1]} columns but encoder_out has D = "
            f"{encoder_out.shape[2]} (weight {tuple(weight.shape)}, encoder_out "
            f"{tuple(encoder_out.shape)})"
        )
    if weight.shape[0] < 1:
        raise ValueError(f"weight must have at least one row (V >= 1), got {tuple(weight.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(
            f"bias must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}"
        )
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None and value.device != encoder_out.device:
            raise ValueError(
                f"{name} is on {value.device} but encoder_out is on {encoder_out.device}; "
                "put them on the same device"
            )


def check_beam(beam: Optional[float]) -> None:
    if beam is not None:
        if isinstance(beam, bool) or not isinstance(beam, (int, float)):
            raise TypeError(f"beam must be a positive float or None, got {beam!r}")
        if not math.isfinite(beam) or beam <= 0:
            raise ValueError(f"beam must be a positive finite float or None, got {beam!r}")


def check_reduction(reduction: str) -> None:
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f'reduction must be "sum", "mean" or "none", got {reduction!r}')


def check_options(chunk_size: int, beam: Optional[float], blank_id: int, vocab_size: int,
                  reduction: str) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    check_beam(beam)
    if isinstance(blank_id, bool) or not isinstance(blank_id, int):
        raise TypeError(f"blank_id must be an int, got {blank_id!r}")
    if not 0 <= blank_id < vocab_size:
        raise ValueError(f"blank_id must be in [0, V) = [0, {vocab_size}), got {blank_id}")
    check_reduction(reduction)


def _as_lengths(name: str, value, device: torch.device) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{name} must be a 1-D integer tensor, got {value!r}") from error
    _check_integer_tensor(name, value)
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    return value.to(device=device, dtype=torch.int64)


def flatten_targets(
    targets: Targets,
    target_lengths,
    num_utterances: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (flat_targets, target_lengths) for the three accepted target formats.

    - a list of N integer sequences (``target_lengths`` must be None);
    - a padded (N, U) tensor with ``target_lengths`` (torch ``ctc_loss`` convention);
    - a concatenated 1-D tensor with ``target_lengths``.
    """
    if isinstance(targets, torch.Tensor):
        _check_integer_tensor("targets", targets)
        if target_lengths is None:
            raise ValueError(
                "target_lengths is required when targets is a tensor "
                f"(targets has shape {tuple(targets.shape)})"
            )
        lengths = _as_lengths("target_lengths", target_lengths, device)
        if lengths.numel() != num_utterances:
            raise ValueError(
                f"target_lengths has {lengths.numel()} entries but encoder_out has "
                f"N = {num_utterances} utterances"
            )
        if lengths.numel() and int(lengths.min()) < 0:
            raise ValueError(f"target_lengths must be >= 0, got {lengths.tolist()}")
        targets = targets.to(device=device, dtype=torch.int64)
        if targets.dim() == 2:
            if targets.shape[0] != num_utterances:
                raise ValueError(
                    f"padded targets have {targets.shape[0]} rows but encoder_out has "
                    f"N = {num_utterances} utterances"
                )
            if lengths.numel() and int(lengths.max()) > targets.shape[1]:
                raise ValueError(
                    f"target_lengths max {int(lengths.max())} exceeds the padded targets' "
                    f"width {targets.shape[1]}"
                )
            positions = torch.arange(targets.shape[1], device=device)
            flat = targets[positions.unsqueeze(0) < lengths.unsqueeze(1)]
        elif targets.dim() == 1:
            if int(lengths.sum()) != targets.numel():
                raise ValueError(
                    f"concatenated targets have {targets.numel()} entries but target_lengths "
                    f"sum to {int(lengths.sum())}"
                )
            flat = targets
        else:
            raise ValueError(
                f"targets tensor must be (N, U) padded or 1-D concatenated, got shape "
                f"{tuple(targets.shape)}"
            )
        return flat, lengths

    if target_lengths is not None:
        raise ValueError("target_lengths must be None when targets is a list of sequences")
    if not isinstance(targets, (list, tuple)):
        raise TypeError(
            "targets must be a tensor or a list of integer sequences, got "
            f"{type(targets).__name__}"
        )
    if len(targets) != num_utterances:
        raise ValueError(
            f"targets has {len(targets)} sequences but encoder_out has N = {num_utterances}"
        )
    pieces = []
    for index, sequence in enumerate(targets):
        piece = torch.as_tensor(sequence) if not isinstance(sequence, torch.Tensor) else sequence
        if piece.numel() == 0:
            piece = piece.reshape(0).to(torch.int64)
        _check_integer_tensor(f"targets[{index}]", piece)
        if piece.dim() != 1:
            raise ValueError(f"targets[{index}] must be a 1-D sequence, got shape {tuple(piece.shape)}")
        pieces.append(piece.to(device=device, dtype=torch.int64))
    lengths = torch.tensor([p.numel() for p in pieces], dtype=torch.int64, device=device)
    flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64, device=device)
    return flat, lengths


def count_repeats(flat_targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """r_n: the number of adjacent equal label pairs inside each target (App. B.1)."""
    num_utterances = target_lengths.numel()
    repeats = torch.zeros(num_utterances, dtype=torch.int64, device=target_lengths.device)
    if flat_targets.numel() < 2:
        return repeats
    utterance_of_token = torch.repeat_interleave(
        torch.arange(num_utterances, device=target_lengths.device), target_lengths
    )
    same_utterance = utterance_of_token[1:] == utterance_of_token[:-1]
    equal = (flat_targets[1:] == flat_targets[:-1]) & same_utterance
    repeats.index_add_(0, utterance_of_token[1:], equal.to(torch.int64))
    return repeats


def check_target_ids(flat: torch.Tensor, vocab_size: int, blank_id: int) -> None:
    """Every id of the concatenated targets a class in [0, V) other than blank."""
    if flat.numel():
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"targets contain id {bad}, outside [0, V) = [0, {vocab_size})")
        if bool((flat == blank_id).any()):
            raise ValueError(f"targets contain the blank id {blank_id}; targets must be blank-free")


def prepare_batch(
    encoder_out: torch.Tensor,
    vocab_size: int,
    targets: Targets,
    encoder_out_lens,
    target_lengths,
    blank_id: int,
) -> PreparedBatch:
    """Validates the targets and lengths of a call and builds the reduced problem."""
    num_utterances, max_frames, _ = encoder_out.shape
    if num_utterances == 0 or max_frames == 0:
        raise ValueError(f"encoder_out {tuple(encoder_out.shape)} holds no frames: the loss needs "
                         f"N >= 1 utterances of T >= 1 frames")
    device = encoder_out.device
    frame_counts = _as_lengths("encoder_out_lens", encoder_out_lens, device)
    if frame_counts.numel() != num_utterances:
        raise ValueError(
            f"encoder_out_lens has {frame_counts.numel()} entries but encoder_out has "
            f"N = {num_utterances} utterances"
        )
    if num_utterances and (int(frame_counts.min()) < 1 or int(frame_counts.max()) > max_frames):
        raise ValueError(
            f"encoder_out_lens must lie in [1, T] = [1, {max_frames}], got "
            f"{frame_counts.tolist()}"
        )
    flat, lengths = flatten_targets(targets, target_lengths, num_utterances, device)
    check_target_ids(flat, vocab_size, blank_id)

    labels = torch.unique(flat, sorted=True)
    selected_classes = torch.cat(
        [torch.tensor([blank_id], dtype=torch.int64, device=device), labels]
    )
    relabeled_flat = torch.searchsorted(labels, flat) + 1
    max_length = int(lengths.max()) if num_utterances else 0
    relabeled = torch.zeros(num_utterances, max_length, dtype=torch.int64, device=device)
    positions = torch.arange(max_length, device=device)
    relabeled[positions.unsqueeze(0) < lengths.unsqueeze(1)] = relabeled_flat

    alignable = frame_counts >= lengths + count_repeats(flat, lengths)
    return PreparedBatch(
        frame_counts=frame_counts,
        target_lengths=lengths,
        flat_targets=flat,
        selected_classes=selected_classes,
        relabeled_targets=relabeled,
        alignable=alignable,
    )


def check_blank_offset(blank_offset: Optional[torch.Tensor], encoder_out: torch.Tensor) -> None:
    if blank_offset is None:
        return
    if not isinstance(blank_offset, torch.Tensor) or not blank_offset.is_floating_point():
        raise TypeError(f"blank_offset must be a floating-point torch.Tensor or None, got "
                        f"{type(blank_offset).__name__}")
    if blank_offset.numel() != 1:
        raise ValueError(f"blank_offset must hold one value (a scalar added to the blank "
                         f"logit), got shape {tuple(blank_offset.shape)}")
    if blank_offset.device != encoder_out.device:
        raise ValueError(f"blank_offset is on {blank_offset.device}, encoder_out on "
                         f"{encoder_out.device}")


def bias_with_blank_offset(bias: Optional[torch.Tensor], blank_offset: torch.Tensor,
                           blank_id: int, weight: torch.Tensor) -> torch.Tensor:
    """bias + blank_offset e_blank (V,), differentiable in both."""
    base = bias if bias is not None else weight.new_zeros(weight.shape[0],
                                                           dtype=blank_offset.dtype)
    one_hot = torch.zeros_like(base)
    one_hot[blank_id] = 1
    return base + blank_offset.reshape(()).to(base.dtype) * one_hot
