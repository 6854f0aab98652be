"""The Zipformer encoder (Zipformer2): fbank -> (N, ((T - 7) // 2 + 1) // 2, max(encoder_dim)).

Zipformer paper (overall structure) and icefall's egs/librispeech/ASR/zipformer/zipformer.py:
a Conv2dSubsampling front end at 50 frames/s, then stacks at 50, 25, 12.5, 6.25, 12.5,
25 Hz (downsampling 1, 2, 4, 8, 4, 2 for the M preset), each stack's channels truncated or zero-padded from the previous one,
the output assembled from the last stack plus the higher channels of the most recent
stack that has them, then a final downsampling by 2 to 25 frames/s.

Every module honours the padding masks: outputs at valid frames do not depend on how
many padding frames follow them. On unpadded input the encoder computes what icefall's
Zipformer2 (egs/librispeech/ASR/zipformer/zipformer.py) computes, in eval and training
mode, so icefall weights load by name (zipformer.icefall_import); in a padded batch
icefall's outputs at valid frames change with the padding (its SimpleDownsample, ConvNeXt
and downsampled stacks see padded frames), ours equal each utterance's output alone.
"""

from __future__ import annotations

from typing import List, Optional, Tuple, TypeVar

import torch
from torch import Tensor, nn

from zipformer.attention import CompactRelPositionalEncoding
from zipformer.layer import BypassModule, ZipformerLayer
from zipformer.presets import ZipformerConfig
from zipformer.scaling import ScheduledFloat
from zipformer.subsampling import MIN_INPUT_FRAMES, Conv2dSubsampling, subsampled_lengths

# Feature (channel) masking probabilities (icefall's zipformer.py/scaling.py).
FEATURE_MASK_PROB = 0.125
INITIAL_LAYERDROP_RATE = 0.5
# Every stochastic regularizer inside the encoder, by the attribute that holds its
# probability: whole-module skipping, layer skipping (bypass; the front end's ConvNeXt
# layerdrop), positional-embedding skipping, the constant-attention substitution and the
# dropouts (Dropout3.p, ActivationDropoutAndLinear.dropout_p; nn.Dropout by its type).
REGULARIZER_ATTRIBUTES = (
    "attention_skip_rate", "conv_skip_rate", "ff2_skip_rate", "ff3_skip_rate",
    "const_attention_rate", "skip_rate", "layerdrop_rate", "pos_emb_skip_rate", "p", "dropout_p",
)


def scale_regularization(module: nn.Module, factor: float) -> None:
    """Multiply every regularizer's probability in ``module`` by ``factor`` (once).

    Shared schedules are replaced per owner by scaled copies, so each is scaled once.
    """
    for owner in list(module.modules()):
        if isinstance(owner, nn.Dropout):
            owner.p *= factor
            continue
        for name in REGULARIZER_ATTRIBUTES:
            schedule = getattr(owner, name, None)
            if isinstance(schedule, ScheduledFloat):
                setattr(owner, name, schedule.scaled(factor))


def padding_mask(lengths: Tensor, num_frames: int) -> Tensor:
    """(N, num_frames) bool, True at frames >= the utterance's length."""
    return torch.arange(num_frames, device=lengths.device)[None, :] >= lengths[:, None]


class SimpleDownsample(nn.Module):
    """Weighted sum of each group of ``factor`` frames, weights softmax(learned bias).

    Frames past each utterance's end are replaced by its last valid frame first (the
    unpadded sequence is right-padded the same way), so valid outputs ignore the batch's
    padding. x: (N, T, C), lengths: (N,) -> (N, ceil(T / factor), C), ceil(lengths / factor).
    """

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.bias = nn.Parameter(torch.zeros(factor))

    def forward(self, x: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor]:
        batch, frames, channels = x.shape
        out_frames = (frames + self.factor - 1) // self.factor
        positions = torch.arange(out_frames * self.factor, device=x.device)
        last_valid = (lengths - 1).clamp(min=0)
        index = torch.minimum(positions[None, :], last_valid[:, None])
        x = torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, channels))
        x = x.reshape(batch, out_frames, self.factor, channels)
        weights = self.bias.softmax(dim=0).to(x.dtype)
        x = torch.einsum("ntfc,f->ntc", x, weights)
        return x, (lengths + self.factor - 1) // self.factor


class SimpleUpsample(nn.Module):
    """Repeats each frame ``factor`` times: (N, T, C) -> (N, T * factor, C)."""

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: Tensor) -> Tensor:
        return x.repeat_interleave(self.factor, dim=1)


class ZipformerStack(nn.Module):
    """``num_layers`` Zipformer layers at one frame rate sharing a positional encoding.

    Multiplies by the feature mask at the input and after every layer; staggers the
    layers' skip-rate schedules over [warmup_begin, warmup_end] batches (icefall's zipformer.py/scaling.py).
    x: (N, T, d), lengths: (N,), feature_mask: (N, 1, d) or None -> (N, T, d).
    """

    def __init__(self, num_layers: int, embed_dim: int, pos_dim: int, num_heads: int,
                 query_head_dim: int, pos_head_dim: int, value_head_dim: int,
                 feedforward_dim: int, cnn_module_kernel: int, dropout,
                 warmup_begin: float, warmup_end: float, final_layerdrop_rate: float) -> None:
        super().__init__()
        self.pos_encoding = CompactRelPositionalEncoding(pos_dim, dropout=0.15)
        self.layers = nn.ModuleList([
            ZipformerLayer(embed_dim, pos_dim, num_heads, query_head_dim, pos_head_dim,
                           value_head_dim, feedforward_dim, cnn_module_kernel, dropout)
            for _ in range(num_layers)])
        step = (warmup_end - warmup_begin) / num_layers
        for i, layer in enumerate(self.layers):
            begin = warmup_begin + i * step
            layer.bypass.skip_rate = ScheduledFloat(
                (begin, INITIAL_LAYERDROP_RATE), (begin + step, final_layerdrop_rate),
                default=0.0)

    def forward(self, x: Tensor, lengths: Tensor, feature_mask: Optional[Tensor]) -> Tensor:
        key_padding_mask = padding_mask(lengths, x.shape[1])
        pos_emb = self.pos_encoding(x.shape[1], x.device)
        if feature_mask is not None:
            x = x * feature_mask
        for layer in self.layers:
            x = layer(x, pos_emb, key_padding_mask)
            if feature_mask is not None:
                x = x * feature_mask
        return x


class DownsampledStack(nn.Module):
    """SimpleDownsample -> stack -> SimpleUpsample -> crop -> bypass with the input."""

    def __init__(self, stack: ZipformerStack, embed_dim: int, factor: int) -> None:
        super().__init__()
        self.downsample = SimpleDownsample(factor)
        self.stack = stack
        self.upsample = SimpleUpsample(factor)
        self.out_combiner = BypassModule(embed_dim)

    def forward(self, x: Tensor, lengths: Tensor, feature_mask: Optional[Tensor]) -> Tensor:
        x_orig = x
        x, low_rate_lengths = self.downsample(x, lengths)
        x = self.stack(x, low_rate_lengths, feature_mask)
        x = self.upsample(x)[:, : x_orig.shape[1]]
        return self.out_combiner(x_orig, x)


def convert_num_channels(x: Tensor, num_channels: int) -> Tensor:
    """Truncate or zero-pad the last dimension to ``num_channels`` (icefall's zipformer.py/scaling.py)."""
    if num_channels <= x.shape[-1]:
        return x[..., :num_channels]
    return nn.functional.pad(x, (0, num_channels - x.shape[-1]))


class ZipformerEncoder(nn.Module):
    """fbank (N, T, feature_dim) + lengths (N,) -> (N, T_out, output_dim) + lengths.

    T_out = ((T - 7) // 2 + 1) // 2: 25 frames per second for 100 input frames per second
    (output_downsampling_factor 2; SPEAR's 1 keeps (T - 7) // 2, 50 frames per second).
    """

    def __init__(self, config: ZipformerConfig) -> None:
        super().__init__()
        self.config = config
        dropout = ScheduledFloat((0.0, 0.3), (20000.0, 0.1), default=0.1)
        self.encoder_embed = Conv2dSubsampling(config.feature_dim, config.encoder_dim[0],
                                               *config.subsampling_channels, dropout=dropout)
        stacks = []
        num_stacks = config.num_stacks
        for i in range(num_stacks):
            factor = config.downsampling_factor[i]
            stack = ZipformerStack(
                config.num_encoder_layers[i], config.encoder_dim[i], config.pos_dim,
                config.num_heads[i], config.query_head_dim, config.pos_head_dim,
                config.value_head_dim, config.feedforward_dim[i], config.cnn_module_kernel[i],
                dropout,
                warmup_begin=config.layer_warmup_batches * (i + 1) / (num_stacks + 1),
                warmup_end=config.layer_warmup_batches * (i + 2) / (num_stacks + 1),
                final_layerdrop_rate=0.035 * factor ** 0.5)
            stacks.append(stack if factor == 1 else
                          DownsampledStack(stack, config.encoder_dim[i], factor))
        self.stacks = nn.ModuleList(stacks)
        self.downsample_output = SimpleDownsample(config.output_downsampling_factor)
        self.feature_mask_prob = FEATURE_MASK_PROB * config.regularization_scale
        if config.regularization_scale != 1.0:
            scale_regularization(self, config.regularization_scale)

    @property
    def output_dim(self) -> int:
        return self.config.output_dim

    def _check_inputs(self, features: Tensor, feature_lens: Tensor) -> None:
        dim = self.config.feature_dim
        if features.ndim != 3 or features.shape[-1] != dim:
            raise ValueError(f"expected features of shape (N, T, {dim}), got "
                             f"{tuple(features.shape)}")
        if feature_lens.ndim != 1 or feature_lens.shape[0] != features.shape[0]:
            raise ValueError(f"feature_lens must have shape ({features.shape[0]},), got "
                             f"{tuple(feature_lens.shape)}")
        if feature_lens.dtype.is_floating_point:
            raise ValueError(f"feature_lens must be integers, got {feature_lens.dtype}")
        # torch.compiler.is_exporting is torch >= 2.6; before, is_compiling (also true under
        # torch.compile, where either way is correct).
        if torch.jit.is_tracing() or getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)():
            # The checks below read the lengths' values, which an exported graph cannot
            # branch on (torch.export stops at the data-dependent guard; tracing would
            # freeze them); the graph's user passes lengths from real audio.
            return
        longest, shortest = int(feature_lens.max()), int(feature_lens.min())
        if longest > features.shape[1]:
            raise ValueError(f"feature_lens has a length of {longest} frames, longer than the "
                             f"batch's {features.shape[1]} frames")
        if shortest < MIN_INPUT_FRAMES:
            raise ValueError(f"feature_lens has a length of {shortest} frames; the encoder "
                             f"needs at least {MIN_INPUT_FRAMES}")

    def _feature_masks(self, batch: int, device: torch.device,
                       dtype: torch.dtype) -> List[Optional[Tensor]]:
        """Per-utterance channel masks (N, 1, d_i), the same draws for every stack.

        Channels [u, u + (d - u) / 2) drop with probability p = 0.125 x
        regularization_scale; the top half [u + (d - u) / 2, d) drops with them and also
        with an independent p.
        """
        if not self.training or self.feature_mask_prob == 0.0:
            return [None] * self.config.num_stacks
        keep_low = (torch.rand(batch, 1, 1, device=device) >= self.feature_mask_prob).to(dtype)
        keep_high = keep_low * (torch.rand(batch, 1, 1, device=device)
                                >= self.feature_mask_prob).to(dtype)
        masks = []
        for dim, unmasked in zip(self.config.encoder_dim, self.config.encoder_unmasked_dim):
            middle = unmasked + (dim - unmasked) // 2
            mask = torch.ones(batch, 1, dim, device=device, dtype=dtype)
            mask[..., unmasked:middle] = keep_low.expand(-1, -1, middle - unmasked)
            mask[..., middle:] = keep_high.expand(-1, -1, dim - middle)
            masks.append(mask)
        return masks

    def _assemble_output(self, outputs: List[Tensor]) -> Tensor:
        """Last stack's output plus, for channels it lacks, the most recent stack's."""
        pieces = [outputs[-1]]
        have = self.config.encoder_dim[-1]
        for i in range(self.config.num_stacks - 2, -1, -1):
            dim = self.config.encoder_dim[i]
            if dim > have:
                pieces.append(outputs[i][..., have:dim])
                have = dim
        return torch.cat(pieces, dim=-1)

    def forward(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        self._check_inputs(features, feature_lens)
        x, lengths = self.encoder_embed(features, feature_lens)
        masks = self._feature_masks(x.shape[0], x.device, x.dtype)
        outputs = []
        for stack, dim, mask in zip(self.stacks, self.config.encoder_dim, masks):
            x = stack(convert_num_channels(x, dim), lengths, mask)
            outputs.append(x)
        x = self._assemble_output(outputs)
        return self.downsample_output(x, lengths)


FrameCount = TypeVar("FrameCount", int, Tensor)


def encoder_output_lengths(num_frames: FrameCount, output_downsampling_factor: int = 2) -> FrameCount:
    """Encoder output frames for ``num_frames`` input frames (an int or a tensor of
    lengths): ((T - 7) // 2 + 1) // 2 (factor 2), (T - 7) // 2 (factor 1); 0 for T < 7."""
    factor = output_downsampling_factor
    frames = (subsampled_lengths(num_frames) + factor - 1) // factor
    return frames.clamp(min=0) if isinstance(frames, Tensor) else max(frames, 0)
