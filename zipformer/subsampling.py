"""Convolutional front end: 80-dim fbank at 100 frames/s -> encoder_dim[0] at ~50 frames/s.

Layer structure of icefall's egs/librispeech/ASR/zipformer/subsampling.py (Zipformer paper):
three Conv2d layers with SwooshR, one ConvNeXt block, a linear projection of the flattened channels x frequency
bins, Whiten, BiasNorm and time-shared dropout. Output length T' = (T - 7) // 2.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor, nn

from zipformer.gradient_modifiers import Balancer, ScaleGrad, Whiten
from zipformer.scaling import (
    BiasNorm, Dropout3, FloatLike, ScheduledFloat, SwooshL, SwooshR, scaled_conv2d,
    sequence_keep_mask,
)

# Frames consumed by the three unpadded time convolutions: T' = (T - 7) // 2.
MIN_INPUT_FRAMES = 9


def subsampled_lengths(num_frames: Tensor) -> Tensor:
    """Output frames of :class:`Conv2dSubsampling` for inputs of ``num_frames`` frames."""
    return (num_frames - 7) // 2


def frequency_bins_after_subsampling(feature_dim: int) -> int:
    """80 -> 80 (3x3, freq pad 1) -> 39 (stride 2) -> 19 (stride 2)."""
    return ((feature_dim - 1) // 2 - 1) // 2


class ConvNeXt(nn.Module):
    """Depthwise 7x7, pointwise C -> 3C, SwooshL, pointwise 3C -> C (init 0.01), residual.

    The residual branch is skipped for whole utterances with probability ``layerdrop_rate``
    in training (0.2 -> 0.015 over 20k batches). x: (N, C, T, F) -> (N, C, T, F).
    """

    def __init__(self, channels: int, hidden_ratio: int = 3, kernel_size: int = 7,
                 layerdrop_rate: FloatLike = None) -> None:
        super().__init__()
        self.depthwise_conv = nn.Conv2d(channels, channels, kernel_size, groups=channels,
                                        padding=kernel_size // 2)
        self.pointwise_conv1 = nn.Conv2d(channels, hidden_ratio * channels, 1)
        self.hidden_balancer = Balancer(hidden_ratio * channels, channel_dim=1,
                                        min_positive=0.3, max_positive=1.0,
                                        min_abs=0.75, max_abs=5.0)
        self.activation = SwooshL()
        self.pointwise_conv2 = scaled_conv2d(hidden_ratio * channels, channels, 1,
                                             initial_scale=0.01)
        self.out_balancer = Balancer(channels, channel_dim=1, min_positive=0.4,
                                     max_positive=0.6, min_abs=1.0, max_abs=6.0)
        self.out_whiten = Whiten(num_groups=1, whitening_limit=5.0)
        self.layerdrop_rate = layerdrop_rate if layerdrop_rate is not None else ScheduledFloat(
            (0.0, 0.2), (20000.0, 0.015), default=0.0)

    def forward(self, x: Tensor) -> Tensor:
        # Channels-last: on CPU the depthwise 7x7 weight gradient is ~2.4x faster in this
        # layout (same values); the pointwise convolutions after it take either layout.
        branch = self.depthwise_conv(x.contiguous(memory_format=torch.channels_last))
        branch = self.hidden_balancer(self.pointwise_conv1(branch))
        branch = self.pointwise_conv2(self.activation(branch))
        if self.training:
            rate = float(self.layerdrop_rate)
            if rate > 0.0:
                branch = branch * sequence_keep_mask(x.shape[0], rate, x.device,
                                                     x.dtype).unsqueeze(-1)
        x = self.out_balancer(x + branch)
        return self.out_whiten(x.transpose(1, 3)).transpose(1, 3)


class Conv2dSubsampling(nn.Module):
    """fbank (N, T, feature_dim) + lengths (N,) -> (N, (T - 7) // 2, out_channels) + lengths.

    Frames past each utterance's length are zeroed before the padded ConvNeXt block, so
    outputs at valid frames do not depend on how much padding the batch has.
    """

    def __init__(self, in_channels: int = 80, out_channels: int = 192,
                 layer1_channels: int = 8, layer2_channels: int = 32,
                 layer3_channels: int = 128, dropout: FloatLike = 0.1) -> None:
        super().__init__()
        if in_channels < 7:
            raise ValueError(f"feature dimension must be >= 7, got {in_channels}")
        self.in_channels = in_channels
        self.conv = nn.Sequential(
            nn.Conv2d(1, layer1_channels, 3, padding=(0, 1)),
            ScaleGrad(0.2),
            Balancer(layer1_channels, channel_dim=1, max_abs=1.0),
            SwooshR(),
            nn.Conv2d(layer1_channels, layer2_channels, 3, stride=2),
            Balancer(layer2_channels, channel_dim=1, max_abs=4.0),
            SwooshR(),
            nn.Conv2d(layer2_channels, layer3_channels, 3, stride=(1, 2)),
            Balancer(layer3_channels, channel_dim=1, max_abs=4.0),
            SwooshR(),
        )
        self.convnext = ConvNeXt(layer3_channels)
        self.freq_bins = frequency_bins_after_subsampling(in_channels)
        self.out = nn.Linear(layer3_channels * self.freq_bins, out_channels)
        self.out_whiten = Whiten(num_groups=1, whitening_limit=ScheduledFloat(
            (0.0, 4.0), (20000.0, 8.0), default=4.0), prob=(0.025, 0.25), grad_scale=0.02)
        self.out_norm = BiasNorm(out_channels)
        self.dropout = Dropout3(dropout, shared_dim=1)

    def forward(self, x: Tensor, x_lens: Tensor) -> Tuple[Tensor, Tensor]:
        if x.ndim != 3 or x.shape[2] != self.in_channels:
            raise ValueError(f"expected features of shape (N, T, {self.in_channels}), "
                             f"got {tuple(x.shape)}")
        if x.shape[1] < MIN_INPUT_FRAMES:
            raise ValueError(f"need at least {MIN_INPUT_FRAMES} frames, got {x.shape[1]}")
        x = self.conv(x.unsqueeze(1))  # (N, C, T', F')
        out_lens = subsampled_lengths(x_lens)
        valid = torch.arange(x.shape[2], device=x.device)[None, :] < out_lens[:, None]
        x = x * valid[:, None, :, None].to(x.dtype)
        x = self.convnext(x)
        batch, channels, frames, bins = x.shape
        x = x.permute(0, 2, 1, 3).reshape(batch, frames, channels * bins)
        x = self.out_whiten(self.out(x))
        x = self.dropout(self.out_norm(x))
        return x, out_lens
