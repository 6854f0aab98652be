"""Reading one audio file as the models hear it: mono float32 samples at 16 kHz.

Any file soundfile reads (WAV of any PCM or float format, FLAC, OGG/Opus) is accepted;
several channels are mixed down (their mean) and other sample rates are resampled
(polyphase filtering, scipy), each said in the log. What cannot be read gets one error
naming the file and what was expected.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from asr.constants import SAMPLE_RATE


def read_audio(path: Path, argument: str = "audio") -> np.ndarray:
    """Samples (S,) float32 in [-1, 1] at :data:`SAMPLE_RATE`; ``argument`` names the
    option the path came from in errors."""
    import soundfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{argument}: no such file: {path}")
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError, TypeError) as error:
        raise ValueError(f"{argument} {path}: cannot read it as audio ({error}); expected a file soundfile "
                         "reads: WAV (PCM or float), FLAC, OGG/Opus") from None
    if samples.shape[0] == 0:
        raise ValueError(f"{argument} {path}: the file holds no samples")
    if samples.shape[1] > 1:
        logging.info("%s: %d channels mixed down to mono", path, samples.shape[1])
    mono = samples.mean(axis=1)
    if rate != SAMPLE_RATE:
        from scipy.signal import resample_poly

        logging.info("%s: resampled from %d Hz to %d Hz", path, rate, SAMPLE_RATE)
        common = math.gcd(int(rate), SAMPLE_RATE)
        mono = resample_poly(mono, SAMPLE_RATE // common, int(rate) // common).astype(np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32)
