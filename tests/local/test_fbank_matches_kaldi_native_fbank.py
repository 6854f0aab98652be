"""Our fbank (lhotse, as local/compute_fbank.py and zipformer/data.py compute it) against
kaldi-native-fbank with the options sherpa-onnx uses for Zipformer CTC models, so that an
exported model sees at run time the features it was trained on."""

import numpy as np
import pytest

from local.compute_fbank import NUM_MEL_BINS
from local.espeak_tts import EspeakSynthesizer, Voice
from references.kaldi_fbank import kaldi_native_fbank

knf = pytest.importorskip("kaldi_native_fbank")
lhotse = pytest.importorskip("lhotse")

SAMPLE_RATE = 16000
# The worst bin may differ by about 1e-3 (a low-energy bin near the log floor, where float32
# rounding of a tiny energy moves its log most); the mean difference is far smaller.
WORST_BIN_TOLERANCE = 2e-3
MEAN_TOLERANCE = 1e-4


def our_fbank(wave: np.ndarray) -> np.ndarray:
    return lhotse.Fbank(lhotse.FbankConfig(num_mel_bins=NUM_MEL_BINS)).extract(wave, SAMPLE_RATE)


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
    ours, theirs = our_fbank(wave), kaldi_native_fbank(wave)
    assert ours.shape == theirs.shape == (int(round(len(wave) / 160)), NUM_MEL_BINS)
    difference = np.abs(ours - theirs)
    assert difference.max() <= WORST_BIN_TOLERANCE
    assert difference.mean() <= MEAN_TOLERANCE


def test_digital_silence_gives_the_same_log_floor():
    wave = np.zeros(SAMPLE_RATE, dtype=np.float32)
    ours, theirs = our_fbank(wave), kaldi_native_fbank(wave)
    assert ours.shape == theirs.shape
    # log(FLT_EPSILON): both floor zero energies at float32 epsilon.
    np.testing.assert_allclose(ours, np.log(np.finfo(np.float32).eps), atol=1e-5)
    np.testing.assert_allclose(theirs, np.log(np.finfo(np.float32).eps), atol=1e-5)


@pytest.mark.parametrize("level", [1e-5, 1e-3])
def test_near_silence_features_match(level):
    wave = np.random.default_rng(7).normal(scale=level, size=SAMPLE_RATE).astype(np.float32)
    ours, theirs = our_fbank(wave), kaldi_native_fbank(wave)
    assert ours.shape == theirs.shape
    assert ours.max() > np.log(np.finfo(np.float32).eps) + 1.0  # above the floor: a real comparison
    assert np.abs(ours - theirs).max() <= WORST_BIN_TOLERANCE
