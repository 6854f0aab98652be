"""Projectors from speech-encoder frames to LLM input embeddings (the paper's two forms).

* :class:`StackingProjector` (SPEAR-Qwen3, App. D.3): layer norm, stack ``stack``
  consecutive frames, linear to ``hidden``, ReLU, linear to the LLM width. 50 frames/s
  in, about 10 embeddings/s out with ``stack`` 5.
* :class:`MLPProjector` (Qwen3-ASR, App. D.4): linear, GELU, linear.

Both take padded (N, T, D_enc) with lengths (N,) and return padded (N, T', D) with
lengths; rows beyond the lengths are zero.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor, nn

from llm_ctc.encoders import zero_beyond_lengths


class StackingProjector(nn.Module):
    """T' = ceil(T / stack): a final partial group is completed with zero frames, so no
    speech is dropped (utterance lengths differ within a batch; frames beyond each
    utterance's length are zeroed after the layer norm, so padding never leaks in)."""

    def __init__(self, input_dim: int, output_dim: int, hidden: int, stack: int) -> None:
        super().__init__()
        self.stack = stack
        self.norm = nn.LayerNorm(input_dim)
        self.linear1 = nn.Linear(input_dim * stack, hidden)
        self.linear2 = nn.Linear(hidden, output_dim)

    def forward(self, frames: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        batch, num_frames, dim = frames.shape
        normalized = zero_beyond_lengths(self.norm(frames), lengths)
        groups = -(-num_frames // self.stack)
        padding = groups * self.stack - num_frames
        if padding:
            normalized = torch.cat([normalized, normalized.new_zeros(batch, padding, dim)], dim=1)
        stacked = normalized.reshape(batch, groups, self.stack * dim)
        out_lens = torch.div(lengths + self.stack - 1, self.stack, rounding_mode="floor")
        out = self.linear2(torch.relu(self.linear1(stacked)))
        return zero_beyond_lengths(out, out_lens), out_lens

    def output_lengths(self, num_frames):
        """ceil(T / stack) for an int or a tensor of frame counts."""
        return (num_frames + self.stack - 1) // self.stack


class MLPProjector(nn.Module):
    """Frame by frame: T' = T."""

    def __init__(self, input_dim: int, output_dim: int, hidden: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(input_dim, hidden)
        self.linear2 = nn.Linear(hidden, output_dim)

    def forward(self, frames: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        out = self.linear2(nn.functional.gelu(self.linear1(frames)))
        return zero_beyond_lengths(out, lengths), lengths

    def output_lengths(self, num_frames):
        return num_frames

    def load_qwen3_asr_projector(self, state: Dict[str, Tensor]) -> None:
        """Start from a Qwen3-ASR checkpoint's projector (``linear_1``, ``linear_2``)."""
        renamed = {name.replace("linear_1", "linear1").replace("linear_2", "linear2"): value
                   for name, value in state.items()}
        for name, value in renamed.items():
            own = dict(self.named_parameters()).get(name)
            if own is None or own.shape != value.shape:
                raise ValueError(
                    f"model.projector_from_encoder: Qwen3-ASR projector entry {name} "
                    f"{tuple(value.shape)} does not fit this projector "
                    f"({None if own is None else tuple(own.shape)}); set model.projector_hidden "
                    "to the encoder width and use the LLM of the same Qwen3-ASR checkpoint")
        self.load_state_dict({k: v.to(self.linear1.weight.dtype) for k, v in renamed.items()})


def build_projector(config, input_dim: int, output_dim: int) -> nn.Module:
    if config.projector_type == "stack":
        return StackingProjector(input_dim, output_dim, config.projector_hidden, config.projector_stack)
    return MLPProjector(input_dim, output_dim, config.projector_hidden)
