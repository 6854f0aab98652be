"""Speech synthesis with espeak-ng through the ``espeakng-loader`` wheel (ctypes).

The wheel ships ``libespeak-ng`` and its voice data, so no system package or root is
needed. espeak-ng keeps global state, so one :class:`EspeakSynthesizer` per process is
the intended use. Output is mono float32 at 16 kHz in [-1, 1].
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List

import numpy as np
from scipy.signal import resample_poly

from asr.constants import SAMPLE_RATE

TARGET_SAMPLE_RATE = SAMPLE_RATE
ESPEAK_SAMPLE_RATE = 22050

# Values of the espeak_AUDIO_OUTPUT, espeak_PARAMETER and position enums in speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_PARAM_RATE = 1
_PARAM_VOLUME = 2
_PARAM_PITCH = 3
_POSITION_CHARACTER = 1
_CHARS_UTF8 = 1

_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


def _private_library_copy(library_path: str) -> ctypes.CDLL:
    """Loads a private copy of libespeak-ng. The library keeps synthesis state in
    globals (oscillator phases, flutter) that carry from one utterance into the next
    and survive re-initialization; a fresh copy starts every synthesizer from the same
    state, so a corpus depends only on its seed."""
    folder = Path(tempfile.mkdtemp(prefix="espeak-ng-"))
    copy = folder / "libespeak-ng.so"
    shutil.copyfile(library_path, copy)
    try:
        return ctypes.CDLL(str(copy))
    finally:
        # The loaded mapping stays valid once the file is gone.
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Voice:
    """One speaker: an espeak-ng voice name (``en-us+m3``), words per minute and pitch 0-100."""

    name: str
    rate: int = 160
    pitch: int = 50


class EspeakSynthesizer:
    """Text to 16 kHz waveform with espeak-ng; deterministic for equal text and voice."""

    def __init__(self) -> None:
        import espeakng_loader

        self._lib = _private_library_copy(espeakng_loader.get_library_path())
        self._libc = ctypes.CDLL(None)
        data_path = espeakng_loader.get_data_path().encode()
        self._lib.espeak_Initialize.restype = ctypes.c_int
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, 0)
        if rate != ESPEAK_SAMPLE_RATE:
            raise RuntimeError(
                f"espeak-ng initialization returned sample rate {rate}, "
                f"expected {ESPEAK_SAMPLE_RATE} (data path {data_path.decode()})"
            )
        self._chunks: List[np.ndarray] = []
        # Keep a reference: ctypes frees the trampoline when the Python object dies.
        self._callback = _SYNTH_CALLBACK(self._collect)
        self._lib.espeak_SetSynthCallback(self._callback)
        self._current_voice = ""

    def _collect(self, samples, num_samples, events) -> int:
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(samples, shape=(num_samples,)).copy())
        return 0

    def _select_voice(self, voice: Voice) -> None:
        if voice.name != self._current_voice:
            status = self._lib.espeak_SetVoiceByName(voice.name.encode())
            if status != 0:
                raise ValueError(f"espeak-ng has no voice named {voice.name!r}")
            self._current_voice = voice.name
        self._lib.espeak_SetParameter(_PARAM_RATE, int(voice.rate), 0)
        self._lib.espeak_SetParameter(_PARAM_PITCH, int(voice.pitch), 0)
        self._lib.espeak_SetParameter(_PARAM_VOLUME, 100, 0)

    def synthesize(self, text: str, voice: Voice, seed: int = 0) -> np.ndarray:
        """Returns float32 samples at 16 kHz (shape (num_samples,)).

        espeak-ng draws random numbers (pitch flutter, noise); ``seed`` fixes them. A
        fixed sequence of calls on a new synthesizer gives equal samples; a single call
        may differ by a few samples depending on the utterances before it.
        """
        self._select_voice(voice)
        self._lib.espeak_ng_SetRandSeed(ctypes.c_long(seed))
        # Parts of espeak-ng draw from the C library's rand() instead.
        self._libc.srand(ctypes.c_uint(seed & 0xFFFFFFFF))
        self._chunks = []
        encoded = text.encode("utf-8") + b"\0"
        status = self._lib.espeak_Synth(
            encoded, len(encoded), 0, _POSITION_CHARACTER, 0, _CHARS_UTF8, None, None
        )
        if status != 0:
            raise RuntimeError(f"espeak-ng failed (status {status}) on text {text!r}")
        self._lib.espeak_Synchronize()
        if not self._chunks:
            raise RuntimeError(f"espeak-ng produced no audio for text {text!r}")
        wave = np.concatenate(self._chunks).astype(np.float32) / 32768.0
        # 22,050 Hz * 320 / 441 = 16,000 Hz.
        resampled = resample_poly(wave, 320, 441).astype(np.float32)
        return np.clip(resampled, -1.0, 1.0)
