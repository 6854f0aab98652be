"""local.musan: MUSAN windows and their fbank with the bin count of the training features
they are mixed into (80, or 128 for SPEAR / Qwen3-ASR), checked against Lhotse's Fbank of
the audio."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from lhotse import Fbank, FbankConfig, Recording, RecordingSet, load_manifest

from local.musan import MUSAN_PARTS, compute_musan_fbank, main

RATE = 16_000


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory):
    """One recording per MUSAN part, 12, 17 and 8 s long: windows of 10 s, 2 s (dropped),
    10 s, 7 s and 8 s."""
    root = tmp_path_factory.mktemp("musan")
    generator = np.random.default_rng(7)
    for part, seconds in zip(MUSAN_PARTS, (12.0, 17.0, 8.0)):
        path = root / f"{part}-0000.wav"
        sf.write(path, 0.1 * generator.standard_normal(int(seconds * RATE)).astype(np.float32), RATE)
        RecordingSet.from_recordings([Recording.from_file(path)]).to_file(root / f"musan_recordings_{part}.jsonl.gz")
    return root


@pytest.fixture(scope="module")
def musan128(manifest_dir, tmp_path_factory):
    return compute_musan_fbank(manifest_dir, tmp_path_factory.mktemp("fbank128"), num_mel_bins=128)


def test_windows_longer_than_5_s_get_128_bin_fbank_of_their_audio(musan128):
    cuts = load_manifest(musan128)
    assert sorted(round(c.duration, 2) for c in cuts) == [7.0, 8.0, 10.0, 10.0]
    extractor = Fbank(FbankConfig(num_mel_bins=128))
    for cut in cuts:
        features = cut.load_features()
        assert features.shape == (cut.num_frames, 128)
        reference = extractor.extract(cut.load_audio()[0], RATE)
        frames = min(len(reference), len(features))
        assert float(np.median(np.abs(reference[:frames] - features[:frames]))) < 0.05, cut.id


def test_existing_features_of_another_bin_count_are_refused_by_name(manifest_dir, musan128):
    with pytest.raises(ValueError, match=r"musan_cuts.jsonl.gz holds 128-bin features, not the 80 asked for"):
        compute_musan_fbank(manifest_dir, musan128.parent, num_mel_bins=80)
    assert compute_musan_fbank(manifest_dir, musan128.parent, num_mel_bins=128) == musan128  # done: skipped


def test_bad_bin_count_is_refused(manifest_dir, tmp_path):
    with pytest.raises(SystemExit, match="--num-mel-bins must be >= 1, got 0"):
        main([str(manifest_dir), str(tmp_path), "--num-mel-bins", "0"])
