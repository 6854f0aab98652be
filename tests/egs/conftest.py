"""Fixtures of the recipe tests: miniature corpora in the real layouts, and copies of
a recipe folder (run.sh + conf) wired to this checkout's egs/shared/ and local/."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[2]


def _copy_recipe(root: Path, corpus: str) -> Path:
    (root / "egs").mkdir(parents=True, exist_ok=True)
    recipe = root / "egs" / corpus
    shutil.copytree(REPO / "egs" / corpus, recipe, ignore=shutil.ignore_patterns("data", "download", "exp"))
    for shared in ("egs/shared", "local"):
        if not (root / shared).exists():
            (root / shared).symlink_to(REPO / shared)
    (recipe / "download").mkdir()
    return recipe


def _run_recipe(recipe: Path, *options: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs ``recipe/run.sh --nj 1 OPTIONS`` with this interpreter's bin folder first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # One torch thread: on a shared machine two threads wait on each other and train
    # several times slower than one (benchmarks/training); the tests check results, not speed.
    env.setdefault("OMP_NUM_THREADS", "1")
    result = subprocess.run(
        ["bash", str(recipe / "run.sh"), "--nj", "1", *options],
        cwd=recipe, env=env, capture_output=True, text=True, timeout=1200,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"run.sh {' '.join(options)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="session")
def run_recipe() -> Callable[..., subprocess.CompletedProcess]:
    return _run_recipe


@pytest.fixture(scope="session")
def recipe_copy(tmp_path_factory) -> Callable[[str], Path]:
    def make(corpus: str) -> Path:
        return _copy_recipe(tmp_path_factory.mktemp(f"recipe-{corpus}"), corpus)

    return make


@pytest.fixture(scope="session")
def musan_corpus(tmp_path_factory) -> Path:
    from local.make_mini_corpus import make_musan

    return make_musan(tmp_path_factory.mktemp("musan"), files_per_part=2, seed=5)


@pytest.fixture(scope="session")
def librispeech_corpus(tmp_path_factory) -> Path:
    from local.make_mini_corpus import make_librispeech

    parts = {"train-clean-100": 12, "dev-clean": 6, "test-clean": 6}
    return make_librispeech(tmp_path_factory.mktemp("librispeech"), parts, speakers_per_part=2, seed=1)


@pytest.fixture(scope="session")
def aishell_corpus(tmp_path_factory) -> Path:
    from local.make_mini_corpus import make_aishell

    splits = {"train": 12, "dev": 5, "test": 5}
    return make_aishell(tmp_path_factory.mktemp("aishell"), splits, speakers_per_split=2, seed=2)


@pytest.fixture(scope="session")
def gigaspeech_corpus(tmp_path_factory) -> Path:
    from local.make_mini_corpus import make_gigaspeech

    subsets = {"XL": 3, "DEV": 1, "TEST": 1}
    return make_gigaspeech(tmp_path_factory.mktemp("gigaspeech"), subsets, segments_per_recording=4, seed=3)


def _check_features(recipe: Path, cuts_path: str) -> int:
    """Every cut's stored features are (num_frames, 80) with num_frames about
    duration x 100, and for cuts of unmodified audio equal (up to lilcom's compression)
    to fbank of the samples read with soundfile. Runs from the recipe folder, which
    the storage paths are relative to. Returns the number of cuts."""
    from lhotse import Fbank, load_manifest

    extractor = Fbank()
    with contextlib.chdir(recipe):
        cuts = load_manifest(cuts_path)
        for cut in cuts:
            _check_cut_features(cut, extractor)
    return len(cuts)


def _check_cut_features(cut, extractor) -> None:
    import numpy as np
    import soundfile as sf

    features = cut.load_features()
    assert features.shape == (cut.num_frames, 80), cut.id
    assert abs(cut.num_frames - cut.duration * 100) <= 1.0, (cut.id, cut.num_frames, cut.duration)
    if cut.recording.transforms:
        return
    # Features of trimmed cuts were computed on the whole recording: compare with the
    # matching frames of the whole recording's fbank.
    source = cut.recording.sources[0].source
    samples, sampling_rate = sf.read(source, dtype="float32")
    reference = extractor.extract(samples, sampling_rate)
    first = int(round(cut.start * 100))
    best = min(
        float(np.median(np.abs(reference[offset : offset + len(features)] - features)))
        for offset in range(max(0, first - 1), first + 2)
        if offset + len(features) <= len(reference)
    )
    assert best < 0.05, (cut.id, best)


def _snapshot(folder: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def check_features() -> Callable[[Path, str], int]:
    return _check_features


@pytest.fixture(scope="session")
def snapshot() -> Callable[[Path], dict]:
    return _snapshot
