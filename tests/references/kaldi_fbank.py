"""kaldi-native-fbank as sherpa-onnx configures it (sherpa-onnx/csrc/features.cc), the
independent reference for our fbank: no dither, frames centred (snip_edges false), mel
bins from 20 Hz to Nyquist - 400 Hz (also Lhotse's defaults)."""

import numpy as np
import pytest

SAMPLE_RATE = 16000


def kaldi_native_fbank(samples: np.ndarray, num_bins: int = 80) -> np.ndarray:
    knf = pytest.importorskip("kaldi_native_fbank")
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.dither = 0.0
    options.frame_opts.snip_edges = False
    options.mel_opts.num_bins = num_bins
    options.mel_opts.low_freq = 20.0
    options.mel_opts.high_freq = -400.0
    fbank = knf.OnlineFbank(options)
    fbank.accept_waveform(SAMPLE_RATE, samples.astype(np.float32).tolist())
    fbank.input_finished()
    return np.stack([np.asarray(fbank.get_frame(i)) for i in range(fbank.num_frames_ready)])
