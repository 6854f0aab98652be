"""local/corpus_checks.py refuses audio the features cannot take, naming the file."""

import numpy as np
import pytest
import soundfile

from local.corpus_checks import CorpusError, check_audio_files


def write(path, rate, channels):
    soundfile.write(path, np.zeros((rate // 10, channels), dtype=np.float32), rate)
    return path


def test_16_khz_mono_passes(tmp_path):
    check_audio_files([write(tmp_path / "a.flac", 16000, 1)], "test")


@pytest.mark.parametrize("rate, channels", [(8000, 1), (16000, 2), (44100, 2)])
def test_other_rates_and_channels_are_refused_naming_the_file(tmp_path, rate, channels):
    path = write(tmp_path / "b.flac", rate, channels)
    with pytest.raises(CorpusError, match=f"audio file {path} is {rate} Hz with {channels} channel\\(s\\); .* "
                                          "expect 16000 Hz mono"):
        check_audio_files([write(tmp_path / "a.flac", 16000, 1), path], "test")
