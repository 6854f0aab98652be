"""local.fbank_bins: 128-bin fbank of raw cut manifests (SPEAR and Qwen3-ASR inputs),
checked against Lhotse's Fbank of the audio."""

from __future__ import annotations

import numpy as np
import pytest
from lhotse import CutSet, Fbank, FbankConfig, Recording, SupervisionSegment, load_manifest

from local.fbank_bins import compute, main, outputs_of


@pytest.fixture(scope="module")
def raw_manifest(tmp_path_factory):
    """Whole recordings with two supervisions each, named as the GigaSpeech stages name them."""
    from local.make_mini_corpus import make_librispeech

    root = tmp_path_factory.mktemp("corpus")
    corpus = make_librispeech(root / "audio", {"dev-clean": 2}, seed=4)
    cuts = []
    for path in sorted(corpus.rglob("*.flac")):
        cut = Recording.from_file(path).to_cut()
        half = cut.duration / 2
        cut.supervisions = [SupervisionSegment(f"{cut.id}-{i}", cut.recording_id, i * half, half, text="A")
                            for i in range(2)]
        cuts.append(cut)
    manifest = root / "gigaspeech_cuts_DEV_raw.jsonl.gz"
    CutSet.from_cuts(cuts).to_file(manifest)
    return manifest


def test_output_names_follow_the_raw_manifest(tmp_path):
    out = tmp_path / "fbank128"
    assert outputs_of(tmp_path / "gigaspeech_cuts_DEV_raw.jsonl.gz", out) == (
        out / "gigaspeech_cuts_DEV.jsonl.gz", out / "gigaspeech_feats_DEV")
    assert outputs_of(tmp_path / "gigaspeech_cuts_XL_raw.00000003.jsonl.gz", out) == (
        out / "gigaspeech_cuts_XL.00000003.jsonl.gz", out / "gigaspeech_feats_XL_00000003")


def test_features_are_128_bin_fbank_of_each_supervision(raw_manifest, tmp_path):
    (output,) = compute([raw_manifest], tmp_path / "fbank128", num_mel_bins=128)
    cuts = load_manifest(output)
    raw = load_manifest(raw_manifest)
    assert sorted(c.supervisions[0].id for c in cuts) == sorted(s.id for c in raw for s in c.supervisions)
    extractor = Fbank(FbankConfig(num_mel_bins=128))
    for cut in cuts:
        features = cut.load_features()
        assert features.shape == (cut.num_frames, 128)
        whole = extractor.extract(cut.recording.load_audio()[0], cut.sampling_rate)
        first = int(round(cut.start * 100))
        best = min(float(np.median(np.abs(whole[o:o + len(features)] - features)))
                   for o in range(max(0, first - 1), first + 2) if o + len(features) <= len(whole))
        assert best < 0.05


def test_missing_manifest_is_named(tmp_path):
    with pytest.raises(SystemExit, match="gigaspeech_cuts_TEST_raw.jsonl.gz"):
        main(["--out-dir", str(tmp_path), str(tmp_path / "gigaspeech_cuts_TEST_raw.jsonl.gz")])


def test_unexpected_name_is_refused(tmp_path, raw_manifest):
    other = tmp_path / "dev.jsonl.gz"
    other.write_bytes(raw_manifest.read_bytes())
    with pytest.raises(SystemExit, match="expected a name like"):
        main(["--out-dir", str(tmp_path / "out"), str(other)])
