"""Features computed per chunk of audio, for streaming models (paper App. D.4, "Streaming
inputs": feature extraction, normalization and SpecAugment operate independently on each
2-second chunk; final partial chunks keep their actual lengths, padded only as the
analysis window and hop require).

The frontend is the one the offline pipeline stores (``local/compute_fbank.py``): Lhotse's
``Fbank`` (25 ms window, 10 ms hop, Kaldi-style ``snip_edges=False``, no dither) with the
features' number of mel bins (80 for the Zipformer, 128 for Qwen3-ASR and SPEAR). Applied
to a chunk of s samples it gives (s + 80) // 160 frames (200 for a full 2-second chunk;
none for a tail under 5 ms), and every frame's 400-sample window is reflected at the
chunk's own edges, so no sample outside the chunk enters its features. This frontend
has no statistics over time (no CMVN, no per-utterance maximum): the only quantity that
depends on more than one frame is SpecAugment's mask value, the mean of what it masks,
and that is taken over the chunk alone because each chunk is augmented on its own.

The same :class:`ChunkFbank` serves the training data (:class:`PerChunkFeatures`, used by
:class:`asr.data.AsrDataset` with ``data.feature_chunk_seconds``) and streaming
inference (``llm_ctc.streaming.recognizer``), so a chunk's training features are the
recognizer's for the same audio.
"""

from __future__ import annotations

import math
import warnings
from typing import List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from asr.constants import SAMPLE_RATE
HOP_SAMPLES, WINDOW_SAMPLES = 160, 400  # 10 ms hop, 25 ms window
# Lhotse's Fbank fails on inputs of fewer samples than this (its edge padding needs
# more); below it a chunk has at most one frame, built here by the same Kaldi rule.
SHORT_CHUNK_SAMPLES = 240
DEFAULT_MEL_BINS = 80


def chunk_frame_count(num_samples: int) -> int:
    """Frames of ``num_samples`` samples (``snip_edges=False``: one per started hop,
    rounded to the nearest: (s + 80) // 160)."""
    return (num_samples + HOP_SAMPLES // 2) // HOP_SAMPLES


def reflected_window(samples: np.ndarray, frame: int) -> np.ndarray:
    """The 400 samples of ``frame`` (centred on ``frame`` * 160 + 80), indices outside
    [0, s) reflected back into it as often as needed (Kaldi's ExtractWindow rule for
    ``snip_edges=False``)."""
    size = samples.shape[0]
    index = np.arange(WINDOW_SAMPLES) + frame * HOP_SAMPLES + HOP_SAMPLES // 2 - WINDOW_SAMPLES // 2
    while True:
        below, above = index < 0, index >= size
        if not (below.any() or above.any()):
            return samples[index]
        index = np.where(below, -index - 1, np.where(above, 2 * size - 1 - index, index))


class ChunkFbank:
    """Log-mel fbank of one chunk's samples (16 kHz, float) -> (frames, bins) float32."""

    def __init__(self, num_mel_bins: int = DEFAULT_MEL_BINS) -> None:
        from lhotse import Fbank, FbankConfig

        if num_mel_bins < 1:
            raise ValueError(f"num_mel_bins must be >= 1, got {num_mel_bins}")
        self.num_mel_bins = num_mel_bins
        self.extractor = Fbank(FbankConfig(num_mel_bins=num_mel_bins))
        with warnings.catch_warnings():
            # One exact 400-sample window in, one frame out: snip_edges is what we want here.
            warnings.simplefilter("ignore")
            self.one_window = Fbank(FbankConfig(num_mel_bins=num_mel_bins, snip_edges=True))

    def __call__(self, samples) -> Tensor:
        samples = np.asarray(samples.numpy() if isinstance(samples, Tensor) else samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"a chunk's samples must be one channel (S,), got shape {samples.shape}")
        frames = chunk_frame_count(samples.shape[0])
        if frames == 0:
            return torch.zeros(0, self.num_mel_bins)
        if samples.shape[0] < SHORT_CHUNK_SAMPLES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                features = self.one_window.extract(reflected_window(samples, 0), SAMPLE_RATE)
        else:
            features = self.extractor.extract(samples, SAMPLE_RATE)
        if features.shape[0] != frames:
            raise RuntimeError(f"fbank of {samples.shape[0]} samples gave {features.shape[0]} frames, "
                               f"expected {frames}")
        return torch.from_numpy(np.ascontiguousarray(features))


def split_into_chunks(samples, chunk_seconds: int) -> List:
    """Consecutive pieces of ``chunk_seconds`` * 16000 samples, the last one shorter."""
    if chunk_seconds < 1:
        raise ValueError(f"chunk_seconds must be >= 1 (whole seconds), got {chunk_seconds}")
    size = chunk_seconds * SAMPLE_RATE
    return [samples[start:start + size] for start in range(0, len(samples), size)]


def min_spec_augment_frames(spec_augment) -> int:
    """The shortest chunk Lhotse's SpecAugment can time-mask: its largest mask,
    floor(max_frames_mask_fraction * T), must reach one frame."""
    return math.ceil(1.0 / spec_augment.max_frames_mask_fraction)


class PerChunkFeatures:
    """Padded (N, T, bins) features of a batch of cuts, each cut's audio cut into
    chunks of ``chunk_seconds`` and each chunk's fbank computed (and, with
    ``spec_augment``, time-warped and masked) on its own, then concatenated in order.
    The caller seeds the random generators SpecAugment draws from (python's, numpy's
    and torch's); chunks draw one after another, so each has its own masks."""

    def __init__(self, chunk_seconds: int) -> None:
        if chunk_seconds < 1:
            raise ValueError(f"data.feature_chunk_seconds must be >= 1 (whole seconds), got {chunk_seconds}")
        self.chunk_seconds = chunk_seconds
        self.frontends = {}

    def frontend(self, num_mel_bins: int) -> ChunkFbank:
        if num_mel_bins not in self.frontends:
            self.frontends[num_mel_bins] = ChunkFbank(num_mel_bins)
        return self.frontends[num_mel_bins]

    def cut_features(self, cut, spec_augment=None) -> Tensor:
        """One cut's (T, bins) features, chunk by chunk."""
        if cut.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"cut {cut.id}: per-chunk features need {SAMPLE_RATE} Hz audio, "
                             f"got {cut.sampling_rate} Hz")
        if not cut.has_recording:
            raise ValueError(f"cut {cut.id} has no recording: per-chunk features (data.feature_chunk_seconds) "
                             "are computed from the audio")
        # The stored features' number of bins, so that the chunks replace them in kind.
        bins = cut.num_features if cut.has_features else DEFAULT_MEL_BINS
        audio = cut.load_audio()
        if audio.ndim == 2:
            if audio.shape[0] != 1:
                raise ValueError(f"cut {cut.id}: per-chunk features need one channel, got {audio.shape[0]}")
            audio = audio[0]
        frontend = self.frontend(bins)
        chunks = [frontend(piece) for piece in split_into_chunks(audio, self.chunk_seconds)]
        if spec_augment is not None:
            shortest = min_spec_augment_frames(spec_augment)
            chunks = [spec_augment(chunk[None])[0] if chunk.shape[0] >= shortest else chunk for chunk in chunks]
        return torch.cat(chunks)

    def __call__(self, cuts: Sequence, spec_augment=None) -> Tuple[Tensor, Tensor]:
        per_cut = [self.cut_features(cut, spec_augment) for cut in cuts]
        bins = {features.shape[1] for features in per_cut}
        if len(bins) > 1:
            raise ValueError(f"cuts {[cut.id for cut in cuts]} mix features of {sorted(bins)} mel bins in one batch")
        return pad_features(per_cut)


def pad_features(per_cut: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """(N, T max, bins) with zeros after each cut's frames, and the frame counts (N,)."""
    lens = torch.tensor([features.shape[0] for features in per_cut], dtype=torch.int64)
    if int(lens.min()) == 0:
        raise ValueError("a cut shorter than 5 ms has no feature frames")
    batch = per_cut[0].new_zeros(len(per_cut), int(lens.max()), per_cut[0].shape[1])
    for n, features in enumerate(per_cut):
        batch[n, :features.shape[0]] = features
    return batch, lens


__all__ = ["ChunkFbank", "PerChunkFeatures", "chunk_frame_count", "reflected_window", "split_into_chunks",
           "pad_features", "min_spec_augment_frames", "SAMPLE_RATE"]
