"""Attention parts of a Zipformer layer (Zipformer paper; icefall's
egs/librispeech/ASR/zipformer/zipformer.py).

Attention weights are computed once per layer (:class:`RelPositionAttentionWeights`) and
reused by :class:`NonlinAttention` and two :class:`SelfAttention` modules. Layout is
batch first: x (N, T, C); weights (heads, N, T_query, T_key).
"""

from __future__ import annotations

import math
import random
from typing import Optional

import torch
from torch import Tensor, nn

from zipformer.gradient_modifiers import Balancer, Whiten, penalize_abs_values_gt
from zipformer.scaling import FloatLike, ScheduledFloat, scaled_linear, whitening_schedule

# Masked scores are set to this value (icefall's zipformer.py/scaling.py); exp(-1000) is exactly 0 in float32.
MASKED_SCORE = -1000.0
# Gradient-only penalty on attention scores beyond +-SCORE_LIMIT, applied in a fraction
# SCORE_PENALTY_PROB of training calls (icefall's egs/librispeech/ASR/zipformer/zipformer.py).
SCORE_LIMIT, SCORE_PENALTY, SCORE_PENALTY_PROB = 25.0, 1.0e-4, 0.1


class CompactRelPositionalEncoding(nn.Module):
    """Embeddings of relative offsets -(T-1), ..., T-1, shape (2T - 1, pos_dim).

    Row m embeds the offset m - (T - 1); :func:`relative_to_absolute` gives the score of
    query i and key j row T-1-i+j, i.e. the embedding of (key - query) = j - i. This is
    icefall's convention (CompactRelPositionalEncoding and the as_strided call in
    egs/librispeech/ASR/zipformer/zipformer.py), so an icefall ``linear_pos`` weight
    loads unchanged; the sine columns are odd in the offset, so the opposite convention
    would need them negated.

    The offset is log-compressed (slope 1 near 0, compression length sqrt(pos_dim)),
    squashed by atan, and then cos/sin at integer frequencies 1 .. pos_dim/2; the last
    dimension is the constant 1 (a bias). Computed in float32 with icefall's order of
    operations, so that float64 runs reproduce icefall's to rounding. No parameters: the
    embedding of an offset does not depend on the sequence length, which keeps padding
    invariance.
    """

    def __init__(self, pos_dim: int, dropout: float = 0.15) -> None:
        super().__init__()
        if pos_dim % 2 != 0:
            raise ValueError(f"pos_dim must be even, got {pos_dim}")
        self.pos_dim = pos_dim
        self.dropout = nn.Dropout(dropout)

    def embedding(self, num_frames: int, device: torch.device) -> Tensor:
        offsets = torch.arange(-(num_frames - 1), num_frames, device=device,
                               dtype=torch.float32)
        compression = math.sqrt(self.pos_dim)
        compressed = compression * offsets.sign() * (
            torch.log(offsets.abs() + compression) - math.log(compression))
        length_scale = 1.0 * self.pos_dim / (2.0 * math.pi)
        angle = torch.atan(compressed / length_scale)
        frequencies = torch.arange(1, self.pos_dim // 2 + 1, device=device, dtype=torch.float32)
        phases = angle[:, None] * frequencies[None, :]
        table = torch.stack([phases.cos(), phases.sin()], dim=-1).reshape(-1, self.pos_dim)
        table[:, -1] = 1.0
        return table

    def forward(self, num_frames: int, device: torch.device) -> Tensor:
        return self.dropout(self.embedding(num_frames, device))


def relative_to_absolute(pos_scores: Tensor) -> Tensor:
    """(..., T, 2T - 1) scores indexed by offset -> (..., T, T) indexed by key position.

    Column m of ``pos_scores`` holds offset T-1-m (query minus key), so entry (i, j)
    reads column T-1-i+j. A strided view (no copy) when running; while the model is
    traced or exported, :func:`relative_to_absolute_by_reshape`, which has a dynamic-T
    ONNX form. Both read the same elements, so the values are bit-identical.
    """
    # torch.compiler.is_exporting is torch >= 2.6; before, is_compiling (also true under
    # torch.compile, where either way is correct).
    if torch.jit.is_tracing() or getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)():
        return relative_to_absolute_by_reshape(pos_scores)
    *lead, frames, width = pos_scores.shape
    pos_scores = pos_scores.contiguous()
    strides = list(pos_scores.stride())
    return pos_scores.as_strided(
        (*lead, frames, frames), (*strides[:-2], strides[-2] - 1, strides[-1]),
        pos_scores.storage_offset() + frames - 1)


def relative_to_absolute_by_reshape(pos_scores: Tensor) -> Tensor:
    """:func:`relative_to_absolute` by pad, flatten, slice and reshape.

    The TorchScript ONNX exporter cannot express ``as_strided`` with a T-dependent offset;
    these steps all have dynamic-T ONNX forms. One zero column makes rows 2T long, so that
    in the flat layout entry (i, j) sits at T-1 + i(2T-1) + j: the 2T - 1 row stride is
    >= T even for T = 1, and column T-1-i+j <= 2T-2 never reads the padding. About 3x the
    time of the strided view (a padded copy), hence only for export.
    """
    *lead, frames, width = pos_scores.shape
    padded = torch.nn.functional.pad(pos_scores, (0, 1))  # (..., T, 2T)
    flat = padded.reshape(*lead, frames * (width + 1))
    rows = flat[..., frames - 1: frames - 1 + frames * width].reshape(*lead, frames, width)
    return rows[..., :frames]


class RelPositionAttentionWeights(nn.Module):
    """Multi-head attention weights with relative-position scores (icefall's zipformer.py/scaling.py).

    One projection gives query and key (query_head_dim each per head) and a positional
    query (pos_head_dim per head). Scores = q.k + p.proj(pos_emb); the projection's init
    scale query_head_dim^-0.25 replaces the usual 1/sqrt(d) factor.
    x: (N, T, C), pos_emb: (2T-1, pos_dim), key_padding_mask: (N, T) True at padding
    -> weights (heads, N, T, T).
    """

    def __init__(self, embed_dim: int, pos_dim: int, num_heads: int, query_head_dim: int,
                 pos_head_dim: int,
                 pos_emb_skip_rate: Optional[FloatLike] = None) -> None:
        super().__init__()
        self.num_heads, self.query_head_dim, self.pos_head_dim = (
            num_heads, query_head_dim, pos_head_dim)
        self.in_proj = scaled_linear(embed_dim, (2 * query_head_dim + pos_head_dim) * num_heads,
                                     initial_scale=query_head_dim ** -0.25)
        self.linear_pos = scaled_linear(pos_dim, num_heads * pos_head_dim, bias=False,
                                        initial_scale=0.05)
        # Keys: balancer, then whitening (the whitening limit 3 -> 6 over 20k batches);
        # attention scores beyond +-25 get a small gradient penalty in 10% of training
        # calls. Placement, limits and schedules as RelPositionMultiheadAttentionWeights
        # in icefall's egs/librispeech/ASR/zipformer/zipformer.py.
        self.key_balancer = Balancer(query_head_dim * num_heads, min_positive=0.4,
                                     max_positive=0.6, min_abs=0.0, max_abs=100.0,
                                     prob=0.025)
        self.key_whiten = Whiten(num_groups=num_heads, whitening_limit=whitening_schedule(3.0),
                                 grad_scale=0.025)
        self.pos_emb_skip_rate = pos_emb_skip_rate if pos_emb_skip_rate is not None else (
            ScheduledFloat((0.0, 0.5), (4000.0, 0.0), default=0.0))

    def forward(self, x: Tensor, pos_emb: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        batch, frames, _ = x.shape
        heads, qdim, pdim = self.num_heads, self.query_head_dim, self.pos_head_dim
        projected = self.in_proj(x)
        query = projected[..., : qdim * heads]
        key = self.key_whiten(self.key_balancer(projected[..., qdim * heads: 2 * qdim * heads]))
        pos_query = projected[..., 2 * qdim * heads:]

        query = query.reshape(batch, frames, heads, qdim).permute(2, 0, 1, 3)
        key = key.reshape(batch, frames, heads, qdim).permute(2, 0, 3, 1)
        scores = torch.matmul(query, key)  # (H, N, T, T)

        skip_pos = self.training and random.random() < float(self.pos_emb_skip_rate)
        if not skip_pos:
            pos_query = pos_query.reshape(batch, frames, heads, pdim).permute(2, 0, 1, 3)
            pos_key = self.linear_pos(pos_emb.to(x.dtype))  # (2T-1, H * pdim)
            pos_key = pos_key.reshape(-1, heads, pdim).permute(1, 2, 0)  # (H, pdim, 2T-1)
            pos_scores = torch.matmul(pos_query, pos_key.unsqueeze(1))  # (H, N, T, 2T-1)
            scores = scores + relative_to_absolute(pos_scores)

        if self.training and random.random() < SCORE_PENALTY_PROB:
            scores = penalize_abs_values_gt(scores, SCORE_LIMIT, SCORE_PENALTY)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[None, :, None, :], MASKED_SCORE)
        return scores.softmax(dim=-1)


class SelfAttention(nn.Module):
    """Applies precomputed attention weights to a value projection (icefall's zipformer.py/scaling.py).

    x: (N, T, C), weights: (heads, N, T, T) -> (N, T, C).
    """

    def __init__(self, embed_dim: int, num_heads: int, value_head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.value_head_dim = num_heads, value_head_dim
        self.in_proj = nn.Linear(embed_dim, num_heads * value_head_dim)
        self.out_proj = scaled_linear(num_heads * value_head_dim, embed_dim, initial_scale=0.05)
        self.whiten = Whiten(num_groups=1, whitening_limit=whitening_schedule(7.5, ratio=3.0),
                             grad_scale=0.01)

    def forward(self, x: Tensor, attn_weights: Tensor) -> Tensor:
        batch, frames, _ = x.shape
        values = self.in_proj(x).reshape(batch, frames, self.num_heads, self.value_head_dim)
        values = values.permute(2, 0, 1, 3)  # (H, N, T, vdim)
        attended = torch.matmul(attn_weights.to(values.dtype), values)
        attended = attended.permute(1, 2, 0, 3).reshape(batch, frames, -1)
        return self.whiten(self.out_proj(attended))


class NonlinAttention(nn.Module):
    """Like the convolution module, with attention weights in place of the convolution.

    d -> 3 x (3d/4) split into s, x, y; x * tanh(s) mixed over time by the first head's
    weights, times y, projected back to d (init 0.05). Gradient-only modules as icefall's
    NonlinAttention: a balancer on s, whitening of x before the gate and of the output.
    x: (N, T, C), attn_weights: (N, T, T) -> (N, T, C).
    """

    def __init__(self, embed_dim: int, hidden_channels: int) -> None:
        super().__init__()
        self.hidden_channels = hidden_channels
        self.in_proj = nn.Linear(embed_dim, 3 * hidden_channels)
        self.gate_balancer = Balancer(
            hidden_channels, min_positive=ScheduledFloat((0.0, 0.25), (20000.0, 0.05)),
            max_positive=ScheduledFloat((0.0, 0.75), (20000.0, 0.95)),
            min_abs=0.5, max_abs=5.0)
        self.out_proj = scaled_linear(hidden_channels, embed_dim, initial_scale=0.05)
        self.whiten_hidden = Whiten(num_groups=1, whitening_limit=whitening_schedule(5.0),
                                    grad_scale=0.01)
        self.whiten_out = Whiten(num_groups=1, whitening_limit=whitening_schedule(5.0, ratio=3.0),
                                 grad_scale=0.01)

    def forward(self, x: Tensor, attn_weights: Tensor) -> Tensor:
        gate, hidden, out_gate = self.in_proj(x).chunk(3, dim=-1)
        hidden = self.whiten_hidden(hidden) * torch.tanh(self.gate_balancer(gate))
        hidden = torch.matmul(attn_weights.to(hidden.dtype), hidden)
        return self.whiten_out(self.out_proj(hidden * out_gate))
