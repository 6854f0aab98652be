"""Fixtures shared by the whole suite: miniature Lhotse corpora for the data-module,
training and decoding tests.

``make_cut_corpus(root, train={cut_id: (seconds, text)}, valid={...})`` synthesizes one
wav per cut (a sine plus noise at 16 kHz), computes 80-dim fbank stored with
``LilcomChunkyWriter`` and writes ``<name>_cuts.jsonl.gz`` manifests, plus a MUSAN-like
noise manifest and a letter table ``tokens.txt`` (``<blk>`` 0, ``<sos/eos>`` 1,
``<unk>`` 2, A-Z from 3). Cut ids are the keys given.
"""

import os
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pytest
import soundfile
from lhotse import CutSet, Fbank, FbankConfig, LilcomChunkyWriter, Recording, SupervisionSegment

SAMPLE_RATE = 16000


@pytest.fixture(scope="session", autouse=True)
def in_process_programs_keep_their_threads():
    """asr.train and asr.decode, which many tests run in this process, take their torch
    threads from the cores idle at their start unless OMP_NUM_THREADS is set
    (asr/threads.py); two runs that a test compares bit for bit (a resumed training against
    an uninterrupted one) must use the same number whatever the other test workers load, so
    the suite sets it (one thread also for the programs the tests start as processes)."""
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    if saved is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = saved


CutItems = Dict[str, Tuple[float, str]]


def _synthesize(path: Path, duration: float, frequency: float, seed: int) -> None:
    time = np.arange(int(round(duration * SAMPLE_RATE))) / SAMPLE_RATE
    noise = np.random.default_rng(seed).normal(scale=0.05, size=time.shape)
    soundfile.write(path, 0.3 * np.sin(2 * np.pi * frequency * time) + noise, SAMPLE_RATE)


def _write_cuts(root: Path, items: CutItems, name: str) -> Path:
    wav_dir = root / f"{name}_wav"  # per manifest: a valid cut may reuse a training cut's id
    wav_dir.mkdir(exist_ok=True)
    cuts = []
    for index, (cut_id, (duration, text)) in enumerate(items.items()):
        wav = wav_dir / f"{cut_id}.wav"
        _synthesize(wav, duration, 200.0 + 40 * index, seed=index)
        cut = Recording.from_file(wav, recording_id=cut_id).to_cut()
        cut.supervisions = [
            SupervisionSegment(id=cut_id, recording_id=cut_id, start=0.0, duration=cut.duration, text=text)
        ]
        cuts.append(cut)
    cuts = CutSet.from_cuts(cuts).compute_and_store_features(
        extractor=Fbank(FbankConfig(num_mel_bins=80)), storage_path=root / f"{name}_feats",
        storage_type=LilcomChunkyWriter, num_jobs=1,
    )
    manifest = root / f"{name}_cuts.jsonl.gz"
    cuts.to_file(manifest)
    return manifest


def build_cut_corpus(root: Path, train: CutItems, valid: CutItems, musan: Optional[CutItems] = None) -> Dict[str, Path]:
    """Write the corpus under ``root``; returns paths keyed train, valid, musan, tokens and
    lang (a lang dir holding a copy of the letter table, as train.lang_dir)."""
    letters = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    tokens = root / "tokens.txt"
    tokens.write_text("\n".join(f"{s} {i}" for i, s in enumerate(["<blk>", "<sos/eos>", "<unk>"] + letters)) + "\n")
    (root / "lang").mkdir(exist_ok=True)
    (root / "lang" / "tokens.txt").write_text(tokens.read_text())
    return {
        "lang": root / "lang",
        "train": _write_cuts(root, train, "train"),
        "valid": _write_cuts(root, valid, "valid"),
        "musan": _write_cuts(root, musan or {"noise-1": (3.0, ""), "noise-2": (5.0, "")}, "musan"),
        "tokens": tokens,
    }


@pytest.fixture(scope="session")
def make_cut_corpus() -> Callable[..., Dict[str, Path]]:
    return build_cut_corpus


# Six short training cuts and one validation cut: a few batches of a tiny model per epoch.
SMALL_TRAIN = {
    "utt-a": (1.2, "HELLO WORLD"),
    "utt-b": (1.4, "PRUNED CTC"),
    "utt-c": (1.6, "A SMALL TEST"),
    "utt-d": (1.8, "QUICK BROWN FOX"),
    "utt-e": (2.0, "JUMPS OVER"),
    "utt-f": (2.2, "THE LAZY DOG"),
}
SMALL_VALID = {"utt-v": (1.5, "VALID")}


@pytest.fixture(scope="session")
def small_training_corpus(tmp_path_factory) -> Dict[str, Path]:
    """The training tests' corpus (tests/asr/test_train.py, tests/llm_ctc/test_toolkit_training.py), built once."""
    return build_cut_corpus(tmp_path_factory.mktemp("small_training_corpus"), train=SMALL_TRAIN, valid=SMALL_VALID)
