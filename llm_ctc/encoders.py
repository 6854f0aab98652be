"""Frozen speech encoders behind one small interface.

A speech encoder maps padded features (N, T, F) and their lengths (N,) to padded
embeddings (N, T', D_enc) and lengths (N,). It is frozen (no gradient, always in
evaluation mode: dropout and the Zipformer's stochastic schedules off, App. D.4).
Frames beyond an utterance's length are zero, so that a padded batch and per-utterance
runs give the same projector input.

Adding an encoder: subclass :class:`SpeechEncoder` (``output_dim``, ``feature_dim``, and
the abstract ``encode`` and ``output_lengths``, the frame count the trainer's filters
need), add a
builder to :data:`ENCODER_BUILDERS` and its name to ``llm_ctc.config.ENCODER_TYPES``.
"""

from __future__ import annotations

import abc
import logging
from pathlib import Path
from typing import Callable, Dict, List, Tuple, Union

import torch
from torch import Tensor, nn


def zero_beyond_lengths(values: Tensor, lengths: Tensor) -> Tensor:
    """(N, T, D) with rows t >= lengths[n] set to zero."""
    valid = torch.arange(values.shape[1], device=values.device)[None, :] < lengths[:, None]
    return values * valid.unsqueeze(-1).to(values.dtype)


FrameCount = Union[int, Tensor]


class SpeechEncoder(nn.Module, metaclass=abc.ABCMeta):
    """Base class: frozen (unless :meth:`unfreeze`), evaluation mode whatever ``train()`` says."""

    output_dim: int
    feature_dim: int
    trainable = False

    def freeze(self) -> None:
        for parameter in self.parameters():
            parameter.requires_grad_(False)
        self.trainable = False
        super().train(False)

    def unfreeze(self, top_blocks: int = 0) -> None:
        """Let gradients reach the weights (``model.encoder_lr_scale`` > 0); still no dropout.
        ``top_blocks`` > 0 (``model.encoder_trained_blocks``) trains only the last that many
        of :meth:`blocks` and what follows them: the blocks below run without a graph, so
        the backward pass stops at the lowest trained block."""
        if top_blocks == 0:
            trained = list(self.parameters())
        else:
            blocks, after = self.blocks()
            if not 0 < top_blocks <= len(blocks):
                raise ValueError(f"model.encoder_trained_blocks must be between 0 (all) and this encoder's "
                                 f"{len(blocks)} blocks, got {top_blocks}")
            trained = [p for module in list(blocks[len(blocks) - top_blocks:]) + list(after)
                       for p in module.parameters()]
        for parameter in trained:
            parameter.requires_grad_(True)
        self.trainable = True

    def blocks(self) -> Tuple[List[nn.Module], List[nn.Module]]:
        """The encoder's blocks from input to output, and the modules after the last one
        (what ``model.encoder_trained_blocks`` counts)."""
        raise ValueError(f"model.encoder_trained_blocks: {type(self).__name__} does not name its blocks; "
                         "set it to 0 to train the whole encoder")

    def train(self, mode: bool = True) -> "SpeechEncoder":
        # A frozen encoder stays in evaluation mode even when the whole model trains.
        return super().train(False)

    @abc.abstractmethod
    def encode(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Embeddings (N, T', D_enc) and T' (N,) of features (N, T, F) and lengths (N,)."""

    @abc.abstractmethod
    def output_lengths(self, num_frames: FrameCount) -> FrameCount:
        """T' for ``num_frames`` feature frames (an int or a tensor), without running the encoder."""

    def forward(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        if features.dim() != 3 or features.shape[2] != self.feature_dim:
            raise ValueError(f"features must have shape (N, T, {self.feature_dim}), got "
                             f"{tuple(features.shape)}")
        if feature_lens.shape != (features.shape[0],):
            raise ValueError(f"feature_lens must have shape ({features.shape[0]},), got "
                             f"{tuple(feature_lens.shape)}")
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.trainable):
            embeddings, lengths = self.encode(features, feature_lens)
        return zero_beyond_lengths(embeddings, lengths), lengths


class ZipformerSpeechEncoder(SpeechEncoder):
    """The encoder of a Zipformer CTC checkpoint written by ``asr.train``: 80-dim
    fbank in, encoder output (before the CTC head) at 25 frames per second."""

    def __init__(self, checkpoint_path: str, entry: str = "model", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from zipformer.model import load_ctc_checkpoint

        try:
            model = load_ctc_checkpoint(checkpoint_path, entry, "model.encoder_path")
        except KeyError as error:
            raise KeyError(f"{error.args[0]} (model.encoder_checkpoint_entry)") from None
        self.zipformer = model.encoder.to(dtype)
        self.output_dim = model.config.output_dim
        self.feature_dim = model.config.feature_dim
        self.freeze()

    def encode(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        dtype = next(self.zipformer.parameters()).dtype
        out, out_lens = self.zipformer(features.to(dtype), feature_lens)
        return out, out_lens

    def blocks(self) -> Tuple[List[nn.Module], List[nn.Module]]:
        """The Zipformer's stacks (6 in every preset but ``tiny``) and its output downsampling."""
        return list(self.zipformer.stacks), [self.zipformer.downsample_output]

    def output_lengths(self, num_frames: FrameCount) -> FrameCount:
        from zipformer.encoder import encoder_output_lengths

        return encoder_output_lengths(num_frames)


class Qwen3ASRSpeechEncoder(SpeechEncoder):
    """The audio encoder of a Qwen3-ASR checkpoint through transformers' own classes:
    128-bin log-mel features (N, T, 128) at 100 frames per second in, about 13
    embeddings per second out (windows of ``2 * n_window`` mel frames, each giving 13)."""

    def __init__(self, name_or_path: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from transformers import Qwen3ASRForConditionalGeneration

        full = Qwen3ASRForConditionalGeneration.from_pretrained(name_or_path, dtype=dtype)
        self.audio_tower = full.model.audio_tower
        # Kept so that an "mlp" projector can start from Qwen3-ASR's own (App. D.4).
        self.pretrained_projector_state = {
            name: value.detach().clone() for name, value in full.model.multi_modal_projector.state_dict().items()}
        self.output_dim = int(full.config.audio_config.d_model)
        self.feature_dim = int(full.config.audio_config.num_mel_bins)
        self.window = 2 * int(full.config.audio_config.n_window)
        del full
        self.freeze()

    def encode(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        batch, frames, bins = features.shape
        padded = -(-frames // self.window) * self.window
        dtype = next(self.audio_tower.parameters()).dtype
        mel = torch.zeros(batch, bins, padded, dtype=dtype, device=features.device)
        mel[:, :, :frames] = features.transpose(1, 2).to(dtype)
        mask = (torch.arange(padded, device=features.device)[None, :] < feature_lens[:, None]).long()
        packed = self.audio_tower(input_features=mel, input_features_mask=mask).last_hidden_state
        # The tower packs the valid outputs utterance after utterance; each window of
        # mel frames gives its own post-convolution length.
        per_window = mask.view(batch, padded // self.window, self.window).sum(-1)
        lengths = self.audio_tower._post_cnn_length(per_window.reshape(-1)).view(batch, -1).sum(-1)
        if int(lengths.sum()) != packed.shape[0]:
            raise RuntimeError(f"Qwen3-ASR encoder returned {packed.shape[0]} frames, expected "
                               f"{int(lengths.sum())} from the window lengths")
        out = packed.new_zeros(batch, int(lengths.max()), packed.shape[1])
        valid = torch.arange(out.shape[1], device=out.device)[None, :] < lengths[:, None]
        out[valid] = packed
        return out, lengths

    def blocks(self) -> Tuple[List[nn.Module], List[nn.Module]]:
        """The audio tower's transformer layers and its final layer norm."""
        return list(self.audio_tower.layers), [self.audio_tower.ln_post]

    def output_lengths(self, num_frames: FrameCount) -> FrameCount:
        """Windows of ``window`` mel frames, each convolved on its own."""
        as_tensor = torch.as_tensor(num_frames)
        full, rest = as_tensor // self.window, as_tensor % self.window
        post = self.audio_tower._post_cnn_length
        lengths = full * post(torch.full_like(as_tensor, self.window)) + torch.where(
            rest > 0, post(rest.clamp(min=1)), torch.zeros_like(rest))
        return lengths if isinstance(num_frames, Tensor) else int(lengths)


class SpearSpeechEncoder(SpeechEncoder):
    """SPEAR (the paper's Table 3 encoder, App. D.3) from its icefall checkpoint, run by
    this project's Zipformer (zipformer/spear.py): 128-dim fbank at 100 frames/s in,
    1280-dim embeddings at 50 frames/s out for SPEAR-XLarge v2."""

    def __init__(self, checkpoint_path: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from zipformer.spear import load_spear_encoder

        encoder, config = load_spear_encoder(Path(checkpoint_path))
        self.zipformer = encoder.to(dtype)
        self.config = config
        self.output_dim = config.output_dim
        self.feature_dim = config.feature_dim
        self.freeze()

    def encode(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        dtype = next(self.zipformer.parameters()).dtype
        return self.zipformer(features.to(dtype), feature_lens)

    def blocks(self) -> Tuple[List[nn.Module], List[nn.Module]]:
        """SPEAR's Zipformer stacks and its output downsampling."""
        return list(self.zipformer.stacks), [self.zipformer.downsample_output]

    def output_lengths(self, num_frames):
        """Embeddings for ``num_frames`` fbank frames (an int or a tensor)."""
        from zipformer.spear import spear_output_lengths

        return spear_output_lengths(num_frames, self.config)


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


ENCODER_BUILDERS: Dict[str, Callable[..., SpeechEncoder]] = {
    "zipformer": lambda config: ZipformerSpeechEncoder(
        config.encoder_path, entry=config.encoder_checkpoint_entry, dtype=_torch_dtype(config.encoder_dtype)),
    "qwen3_asr": lambda config: Qwen3ASRSpeechEncoder(
        config.encoder_path, dtype=_torch_dtype(config.encoder_dtype)),
    "spear": lambda config: SpearSpeechEncoder(config.encoder_path, dtype=_torch_dtype(config.encoder_dtype)),
}


def build_speech_encoder(config) -> SpeechEncoder:
    """The encoder named by ``config.encoder_type`` / ``config.encoder_path``, frozen
    unless ``config.encoder_lr_scale`` > 0."""
    if not config.encoder_path:
        raise ValueError("model.encoder_path is empty: name the speech encoder's checkpoint")
    encoder = ENCODER_BUILDERS[config.encoder_type](config)
    if config.encoder_lr_scale > 0:
        encoder.unfreeze(config.encoder_trained_blocks)
    trained = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    logging.info("speech encoder %s from %s: output width %d, %d parameters (%s)",
                 config.encoder_type, config.encoder_path, encoder.output_dim,
                 sum(p.numel() for p in encoder.parameters()),
                 (f"{trained} trained at {config.encoder_lr_scale:g} x optim.lr"
                  + (f": the top {config.encoder_trained_blocks} blocks" if config.encoder_trained_blocks else ""))
                 if encoder.trainable else "frozen")
    return encoder
