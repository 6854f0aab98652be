"""One Zipformer layer and its feed-forward, convolution and bypass modules.

Data flow of :class:`ZipformerLayer` follows Zipformer2EncoderLayer in
icefall's egs/librispeech/ASR/zipformer/zipformer.py (the Zipformer
paper's block): three feed-forward modules, one set of attention weights shared by a
non-linear attention and two self-attention modules, two convolution modules, a
mid-layer bypass, BiasNorm at the end and a learned bypass around the whole layer.
Layout: x (N, T, C); key_padding_mask (N, T) True at padding.
"""

from __future__ import annotations

import random
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zipformer.attention import NonlinAttention, RelPositionAttentionWeights, SelfAttention
from zipformer.gradient_modifiers import Balancer, Whiten
from zipformer.scaling import (
    ActivationDropoutAndLinear, BiasNorm, FloatLike, ScheduledFloat, as_schedule,
    limit_param_value, sequence_keep_mask, whitening_schedule,
)


class FeedforwardModule(nn.Module):
    """Linear d -> F, Balancer, SwooshL, time-shared dropout, Linear F -> d (init 0.1)."""

    def __init__(self, embed_dim: int, hidden_dim: int, dropout: FloatLike) -> None:
        super().__init__()
        self.in_proj = nn.Linear(embed_dim, hidden_dim)
        self.hidden_balancer = Balancer(hidden_dim, min_positive=0.3, max_positive=1.0,
                                        min_abs=0.75, max_abs=5.0)
        self.out_proj = ActivationDropoutAndLinear(hidden_dim, embed_dim, activation="SwooshL",
                                                   dropout_p=dropout, initial_scale=0.1)
        self.out_whiten = Whiten(num_groups=1, whitening_limit=whitening_schedule(7.5),
                                 grad_scale=0.01)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_whiten(self.out_proj(self.hidden_balancer(self.in_proj(x))))


class ConvolutionModule(nn.Module):
    """Linear d -> 2d, x * sigmoid(s), depthwise Conv1d, SwooshR, Linear d -> d (init 0.05).

    Padding frames are zeroed before the convolution so that they never reach valid ones.
    Gradient-only modules as icefall's ConvolutionModule: a balancer on the gate's input
    (min_abs 1.5), a balancer after the convolution, whitening (7.5 -> 15).
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"cnn_module_kernel must be odd, got {kernel_size}")
        self.in_proj = nn.Linear(channels, 2 * channels)
        self.gate_balancer = Balancer(
            channels, min_positive=ScheduledFloat((0.0, 0.05), (8000.0, 0.025)),
            max_positive=1.0, min_abs=1.5,
            max_abs=ScheduledFloat((0.0, 5.0), (8000.0, 10.0), default=1.0))
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size,
                                        padding=kernel_size // 2, groups=channels)
        self.conv_balancer = Balancer(
            channels, min_positive=ScheduledFloat((0.0, 0.1), (8000.0, 0.05)),
            max_positive=1.0, min_abs=ScheduledFloat((0.0, 0.2), (20000.0, 0.5)), max_abs=10.0)
        self.whiten = Whiten(num_groups=1, whitening_limit=whitening_schedule(7.5),
                             grad_scale=0.01)
        self.out_proj = ActivationDropoutAndLinear(channels, channels, activation="SwooshR",
                                                   dropout_p=0.0, initial_scale=0.05)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        x, gate = self.in_proj(x).chunk(2, dim=-1)
        x = x * torch.sigmoid(self.gate_balancer(gate))
        if key_padding_mask is not None:
            x = x.masked_fill(key_padding_mask.unsqueeze(-1), 0.0)
        x = depthwise_conv_time_major(self.depthwise_conv, x)
        x = self.whiten(self.conv_balancer(x))
        return self.out_proj(x)


def depthwise_conv_time_major(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """``conv`` (depthwise, odd kernel, 'same' padding) over time of x: (N, T, C) -> (N, T, C).

    Computed as a (1, k) Conv2d on x viewed as a channels-last (N, C, 1, T) image: the same
    values as ``conv(x.transpose(1, 2)).transpose(1, 2)`` without the two layout copies,
    and on CPU the channels-last depthwise kernels take about half the time of Conv1d's
    forward and backward (measured at the mini preset's shapes).
    """
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        # The exporters get the plain Conv1d: torch.export specializes the channels-last
        # form's T to the example's parity, and onnxruntime then fails on the other.
        return conv(x.transpose(1, 2)).transpose(1, 2)
    image = x.transpose(1, 2).unsqueeze(2)  # (N, C, 1, T), channel stride 1
    if not image.is_contiguous(memory_format=torch.channels_last):
        image = image.contiguous(memory_format=torch.channels_last)
    # unsqueeze(1), not (2): the weight gradient then comes back with the parameter's own
    # strides (DDP copies a gradient whose strides differ from its bucket view's, and warns).
    out = F.conv2d(image, conv.weight.unsqueeze(1), conv.bias, padding=(0, conv.padding[0]),
                   groups=conv.groups)
    return out.squeeze(2).transpose(1, 2)


class BypassModule(nn.Module):
    """y = x0 + c * (x - x0) with learned per-channel c (init 0.5), as icefall's BypassModule.

    In training, :func:`limit_param_value` pulls c back into [scale_min, 1] (scale_min
    0.9 -> 0.2 over 20k batches) through its gradient only: the forward pass uses c as
    it is, even out of range (icefall's BypassModule). c is set to 0 for whole utterances
    with probability ``skip_rate`` (layer skipping).
    """

    def __init__(self, embed_dim: int, skip_rate: FloatLike = 0.0,
                 scale_min: Optional[FloatLike] = None, scale_max: float = 1.0) -> None:
        super().__init__()
        self.bypass_scale = nn.Parameter(torch.full((embed_dim,), 0.5))
        self.skip_rate = as_schedule(skip_rate)
        self.scale_min = scale_min if scale_min is not None else ScheduledFloat(
            (0.0, 0.9), (20000.0, 0.2), default=0.0)
        self.scale_max = scale_max

    def forward(self, x_orig: Tensor, x: Tensor) -> Tensor:
        scale = self.bypass_scale
        if self.training:
            scale = limit_param_value(scale, float(self.scale_min), self.scale_max)
            skip_rate = float(self.skip_rate)
            if skip_rate > 0.0:
                scale = scale * sequence_keep_mask(x.shape[0], skip_rate, x.device, scale.dtype)
        return x_orig + (x - x_orig) * scale.to(x.dtype)


class ZipformerLayer(nn.Module):
    """One Zipformer block, x (N, T, d) -> (N, T, d), data flow of icefall's Zipformer2EncoderLayer."""

    def __init__(self, embed_dim: int, pos_dim: int, num_heads: int, query_head_dim: int,
                 pos_head_dim: int, value_head_dim: int, feedforward_dim: int,
                 cnn_module_kernel: int, dropout: FloatLike = 0.1) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        # Whole-utterance dropouts inside the layer (icefall's zipformer.py/scaling.py).
        self.attention_skip_rate = ScheduledFloat((0.0, 0.2), (4000.0, 0.05), (16000.0, 0.0),
                                                  default=0.0)
        self.conv_skip_rate = ScheduledFloat((0.0, 0.2), (4000.0, 0.05), (16000.0, 0.0),
                                             default=0.0)
        self.ff2_skip_rate = ScheduledFloat((0.0, 0.1), (4000.0, 0.01), (50000.0, 0.0),
                                            default=0.0)
        self.ff3_skip_rate = ScheduledFloat((0.0, 0.1), (4000.0, 0.01), (50000.0, 0.0),
                                            default=0.0)
        self.const_attention_rate = ScheduledFloat((0.0, 0.25), (4000.0, 0.025), default=0.0)

        self.bypass = BypassModule(embed_dim)  # skip_rate set by the stack
        self.bypass_mid = BypassModule(embed_dim)
        self.attention_weights = RelPositionAttentionWeights(
            embed_dim, pos_dim, num_heads, query_head_dim, pos_head_dim)
        self.self_attn1 = SelfAttention(embed_dim, num_heads, value_head_dim)
        self.self_attn2 = SelfAttention(embed_dim, num_heads, value_head_dim)
        self.feed_forward1 = FeedforwardModule(embed_dim, feedforward_dim * 3 // 4, dropout)
        self.feed_forward2 = FeedforwardModule(embed_dim, feedforward_dim, dropout)
        self.feed_forward3 = FeedforwardModule(embed_dim, feedforward_dim * 5 // 4, dropout)
        self.nonlin_attention = NonlinAttention(embed_dim, hidden_channels=3 * embed_dim // 4)
        self.conv_module1 = ConvolutionModule(embed_dim, cnn_module_kernel)
        self.conv_module2 = ConvolutionModule(embed_dim, cnn_module_kernel)
        # Gradient-only modules where icefall's Zipformer2EncoderLayer has them: on the
        # outputs of the non-linear attention and of FF2 and FF3 (prob 0.05), before the
        # norm, and after the layer's bypass followed by whitening (limit 4 -> 12).
        self.nonlin_balancer = Balancer(
            embed_dim, min_positive=0.3, max_positive=0.7,
            min_abs=ScheduledFloat((0.0, 0.004), (4000.0, 0.02)), prob=0.05)
        self.ff2_balancer = Balancer(
            embed_dim, min_positive=0.3, max_positive=0.7,
            min_abs=ScheduledFloat((0.0, 0.0), (4000.0, 0.1), default=0.0), max_abs=2.0,
            prob=0.05)
        self.ff3_balancer = Balancer(
            embed_dim, min_positive=0.3, max_positive=0.7,
            min_abs=ScheduledFloat((0.0, 0.0), (4000.0, 0.2), default=0.0), max_abs=4.0,
            prob=0.05)
        self.norm_balancer = Balancer(embed_dim, min_positive=0.45, max_positive=0.55,
                                      min_abs=0.2, max_abs=4.0)
        self.norm = BiasNorm(embed_dim)
        self.out_balancer = Balancer(embed_dim, min_positive=0.45, max_positive=0.55,
                                     min_abs=0.1, max_abs=4.0)
        self.out_whiten = Whiten(num_groups=1, whitening_limit=whitening_schedule(4.0, ratio=3.0),
                                 grad_scale=0.01)

    def _keep_mask(self, x: Tensor, rate: FloatLike) -> Optional[Tensor]:
        """(N, 1, 1) whole-utterance keep mask in training, or None (keep all)."""
        if not self.training:
            return None
        rate = float(rate)
        return sequence_keep_mask(x.shape[0], rate, x.device, x.dtype) if rate > 0.0 else None

    @staticmethod
    def _add(x: Tensor, branch: Tensor, keep: Optional[Tensor]) -> Tensor:
        return x + (branch if keep is None else branch * keep)

    def _nonlin_weights(self, attn_weights: Tensor) -> Tensor:
        """First head's weights; in training sometimes a uniform average over valid keys."""
        weights = attn_weights[0]
        if self.training and random.random() < float(self.const_attention_rate):
            uniform = (weights > 0.0).to(weights.dtype)
            weights = uniform / uniform.sum(dim=-1, keepdim=True)
        return weights

    def forward(self, x: Tensor, pos_emb: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        x_orig = x
        attn_weights = self.attention_weights(x, pos_emb, key_padding_mask)
        attn_keep = self._keep_mask(x, self.attention_skip_rate)
        conv_keep = self._keep_mask(x, self.conv_skip_rate)

        x = x + self.feed_forward1(x)
        nonlin = self.nonlin_attention(x, self._nonlin_weights(attn_weights))
        x = self._add(x, self.nonlin_balancer(nonlin), attn_keep)
        x = self._add(x, self.self_attn1(x, attn_weights), attn_keep)
        x = self._add(x, self.conv_module1(x, key_padding_mask), conv_keep)
        x = self._add(x, self.ff2_balancer(self.feed_forward2(x)),
                      self._keep_mask(x, self.ff2_skip_rate))
        x = self.bypass_mid(x_orig, x)
        x = self._add(x, self.self_attn2(x, attn_weights), attn_keep)
        x = self._add(x, self.conv_module2(x, key_padding_mask), conv_keep)
        x = self._add(x, self.ff3_balancer(self.feed_forward3(x)),
                      self._keep_mask(x, self.ff3_skip_rate))
        x = self.norm(self.norm_balancer(x))
        x = self.bypass(x_orig, x)
        return self.out_whiten(self.out_balancer(x))
