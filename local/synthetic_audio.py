"""Speakers and signals for synthesized corpora: espeak-ng voices with random rate,
pitch, gain and background noise, plus music-like and noise-like signals for MUSAN.

All randomness comes from a ``random.Random`` the caller seeds, so a corpus is a
function of its seed.
"""

from __future__ import annotations

import random
from typing import List, NamedTuple, Sequence

import numpy as np

from local.espeak_tts import TARGET_SAMPLE_RATE, EspeakSynthesizer, Voice

ENGLISH_ACCENTS = (
    "en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-us-nyc",
    "en-gb-x-gbclan", "en-gb-x-gbcwmd",
)
MANDARIN_ACCENTS = ("cmn",)
VOICE_VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m5", "+m6", "+f1", "+f2", "+f3", "+f4", "+klatt")
RATE_RANGE = (130, 190)  # words per minute
PITCH_RANGE = (25, 75)  # espeak-ng pitch 0-100
GAIN_DB_RANGE = (-6.0, 6.0)
SNR_DB_RANGE = (20.0, 45.0)


def random_voice(rng: random.Random, accents: Sequence[str]) -> Voice:
    return Voice(
        name=rng.choice(accents) + rng.choice(VOICE_VARIANTS),
        rate=rng.randint(*RATE_RANGE),
        pitch=rng.randint(*PITCH_RANGE),
    )


class Rendering(NamedTuple):
    """The random choices of one utterance besides its voice (drawn by :meth:`Speaker.draw`)."""

    synthesis_seed: int
    gain_db: float
    snr_db: float
    noise_seed: int


class Speaker:
    """Renders text with one voice, then applies a random gain and white noise."""

    def __init__(self, synthesizer: EspeakSynthesizer, rng: random.Random) -> None:
        self.synthesizer = synthesizer
        self.rng = rng

    def draw(self) -> Rendering:
        """This utterance's random choices, in the order :meth:`say` has always drawn them."""
        synthesis_seed = self.rng.randrange(2**31)
        gain_db = self.rng.uniform(*GAIN_DB_RANGE)
        snr_db = self.rng.uniform(*SNR_DB_RANGE)
        return Rendering(synthesis_seed, gain_db, snr_db, self.rng.randrange(2**31))

    def say(self, text: str, voice: Voice) -> np.ndarray:
        return render(self.synthesizer, text, voice, self.draw())


def render(synthesizer: EspeakSynthesizer, text: str, voice: Voice, rendering: Rendering) -> np.ndarray:
    """``text`` in ``voice`` with the gain and white noise of ``rendering``, float32 at 16 kHz."""
    wave = synthesizer.synthesize(text, voice, seed=rendering.synthesis_seed)
    wave = wave * 10.0 ** (rendering.gain_db / 20.0)
    signal_power = float(np.mean(wave**2)) + 1e-12
    noise_rng = np.random.default_rng(rendering.noise_seed)
    noise = noise_rng.standard_normal(len(wave)) * np.sqrt(signal_power / 10.0 ** (rendering.snr_db / 10.0))
    return np.clip(wave + noise, -1.0, 1.0).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * TARGET_SAMPLE_RATE)), dtype=np.float32)


def music_like(seconds: float, rng: random.Random) -> np.ndarray:
    """A melody of harmonic notes with a soft attack, at 16 kHz."""
    note_seconds = rng.uniform(0.2, 0.5)
    num_samples = int(round(seconds * TARGET_SAMPLE_RATE))
    note_samples = int(note_seconds * TARGET_SAMPLE_RATE)
    wave = np.zeros(num_samples, dtype=np.float64)
    time = np.arange(note_samples) / TARGET_SAMPLE_RATE
    envelope = np.minimum(1.0, time / 0.02) * np.exp(-3.0 * time)
    for start in range(0, num_samples, note_samples):
        frequency = 220.0 * 2.0 ** (rng.randint(0, 24) / 12.0)
        note = sum(np.sin(2 * np.pi * frequency * k * time) / k for k in (1, 2, 3))
        end = min(num_samples, start + note_samples)
        wave[start:end] = (note * envelope)[: end - start]
    return (0.3 * wave / (np.abs(wave).max() + 1e-9)).astype(np.float32)


def noise_like(seconds: float, rng: random.Random) -> np.ndarray:
    """Brownish noise with slow loudness changes, at 16 kHz."""
    noise_rng = np.random.default_rng(rng.randrange(2**31))
    num_samples = int(round(seconds * TARGET_SAMPLE_RATE))
    white = noise_rng.standard_normal(num_samples)
    colored = np.cumsum(white)
    colored -= np.convolve(colored, np.ones(400) / 400, mode="same")
    loudness = 0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * np.arange(num_samples) / TARGET_SAMPLE_RATE)
    wave = colored * loudness
    return (0.3 * wave / (np.abs(wave).max() + 1e-9)).astype(np.float32)


def join_with_pauses(pieces: List[np.ndarray], rng: random.Random) -> np.ndarray:
    """Concatenates waves with 0.2-0.6 s of silence between them."""
    out: List[np.ndarray] = []
    for piece in pieces:
        out.append(piece)
        out.append(silence(rng.uniform(0.2, 0.6)))
    return np.concatenate(out)
