"""Our fbank (lhotse, as local/compute_fbank.py and zipformer/data.py compute it) against
kaldi-native-fbank with the options sherpa-onnx uses for Zipformer CTC models, so that an
exported model sees at run time the features it was trained on."""

import numpy as np
import pytest

from local.compute_fbank import NUM_MEL_BINS
from local.espeak_tts import EspeakSynthesizer, Voice

knf = pytest.importorskip("kaldi_native_fbank")
lhotse = pytest.importorskip("lhotse")

SAMPLE_RATE = 16000
# The worst bin may differ by about 1e-3 (a low-energy bin near the log floor, where float32
# rounding of a tiny energy moves its log most); the mean difference is far smaller.
WORST_BIN_TOLERANCE = 2e-3
MEAN_TOLERANCE = 1e-4


def our_fbank(wave: np.ndarray) -> np.ndarray:
    return lhotse.Fbank(lhotse.FbankConfig(num_mel_bins=NUM_MEL_BINS)).extract(wave, SAMPLE_RATE)


def sherpa_fbank(wave: np.ndarray) -> np.ndarray:
    """kaldi-native-fbank as sherpa-onnx configures it (sherpa-onnx/csrc/features.cc):
    no dither, frames centred (snip_edges false), mel bins from 20 Hz to Nyquist - 400 Hz."""
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.dither = 0.0
    options.frame_opts.snip_edges = False
    options.mel_opts.num_bins = 80
    options.mel_opts.low_freq = 20.0
    options.mel_opts.high_freq = -400.0
    fbank = knf.OnlineFbank(options)
    fbank.accept_waveform(SAMPLE_RATE, wave.astype(np.float32).tolist())
    fbank.input_finished()
    return np.stack([np.asarray(fbank.get_frame(i)) for i in range(fbank.num_frames_ready)])


@pytest.fixture(scope="module")
def synthesizer():
    return EspeakSynthesizer()


@pytest.mark.parametrize("text, voice", [
    ("the quick brown fox jumps over the lazy dog", Voice("en-us", rate=160)),
    ("she sells sea shells by the sea shore", Voice("en-us+f3", rate=140, pitch=60)),
    ("numbers like seventeen and forty two", Voice("en-us+m3", rate=185, pitch=30)),
])
def test_speech_features_match_to_about_1e_3(synthesizer, text, voice):
    wave = synthesizer.synthesize(text, voice)
    ours, theirs = our_fbank(wave), sherpa_fbank(wave)
    assert ours.shape == theirs.shape == (int(round(len(wave) / 160)), NUM_MEL_BINS)
    difference = np.abs(ours - theirs)
    assert difference.max() <= WORST_BIN_TOLERANCE
    assert difference.mean() <= MEAN_TOLERANCE


def test_digital_silence_gives_the_same_log_floor():
    wave = np.zeros(SAMPLE_RATE, dtype=np.float32)
    ours, theirs = our_fbank(wave), sherpa_fbank(wave)
    assert ours.shape == theirs.shape
    # log(FLT_EPSILON): both floor zero energies at float32 epsilon.
    np.testing.assert_allclose(ours, np.log(np.finfo(np.float32).eps), atol=1e-5)
    np.testing.assert_allclose(theirs, np.log(np.finfo(np.float32).eps), atol=1e-5)


@pytest.mark.parametrize("level", [1e-5, 1e-3])
def test_near_silence_features_match(level):
    wave = np.random.default_rng(7).normal(scale=level, size=SAMPLE_RATE).astype(np.float32)
    ours, theirs = our_fbank(wave), sherpa_fbank(wave)
    assert ours.shape == theirs.shape
    assert ours.max() > np.log(np.finfo(np.float32).eps) + 1.0  # above the floor: a real comparison
    assert np.abs(ours - theirs).max() <= WORST_BIN_TOLERANCE
