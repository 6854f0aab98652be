"""local.espeak_tts: espeak-ng speech at 16 kHz through ctypes."""

import numpy as np
import pytest

from local.espeak_tts import EspeakSynthesizer, Voice

TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def synthesizer():
    return EspeakSynthesizer()


def test_output_is_16_khz_float_speech_of_plausible_length(synthesizer):
    wave = synthesizer.synthesize(TEXT, Voice("en-us", rate=160))
    assert wave.dtype == np.float32 and wave.ndim == 1
    # Nine words at 160 words per minute: about 3.4 s, plus pauses at the edges.
    assert 2.0 < len(wave) / 16000 < 5.0
    assert 0.05 < np.abs(wave).max() <= 1.0


def test_slower_rate_gives_longer_speech(synthesizer):
    slow = synthesizer.synthesize(TEXT, Voice("en-us", rate=120))
    fast = synthesizer.synthesize(TEXT, Voice("en-us", rate=200))
    assert len(slow) > 1.3 * len(fast)


def test_equal_calls_on_new_synthesizers_give_equal_samples():
    calls = [(TEXT, Voice("en-us+m3", 150, 40), 1), ("你好 世界", Voice("cmn", 170, 60), 2)]
    first = [EspeakSynthesizer().synthesize(*call) for call in calls[:1]]
    runs = []
    for _ in range(2):
        synthesizer = EspeakSynthesizer()
        runs.append([synthesizer.synthesize(*call) for call in calls])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert np.array_equal(first[0], runs[0][0])


def test_mandarin_voice_speaks_chinese_characters(synthesizer):
    wave = synthesizer.synthesize("今天天气很好我们去公园", Voice("cmn"))
    assert len(wave) / 16000 > 1.0


def test_unknown_voice_is_named(synthesizer):
    with pytest.raises(ValueError, match="no voice named 'xx-nowhere'"):
        synthesizer.synthesize(TEXT, Voice("xx-nowhere"))
