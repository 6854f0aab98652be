"""local.compute_fbank: fbank of any CutSet, serial or in worker processes."""

from __future__ import annotations

import numpy as np
import pytest
from lhotse import CutSet, Recording, load_manifest

from local.compute_fbank import compute_fbank


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    from local.make_mini_corpus import make_librispeech

    corpus = make_librispeech(tmp_path_factory.mktemp("corpus"), {"dev-clean": 4}, seed=9)
    recordings = [Recording.from_file(path) for path in sorted(corpus.rglob("*.flac"))]
    return CutSet.from_cuts(r.to_cut() for r in recordings)


def test_workers_give_the_same_features_as_one_process(cuts, tmp_path):
    serial = compute_fbank(cuts, tmp_path / "serial_cuts.jsonl.gz", tmp_path / "serial", num_jobs=1)
    parallel = compute_fbank(cuts, tmp_path / "parallel_cuts.jsonl.gz", tmp_path / "parallel", num_jobs=2)
    by_id = {c.id: c for c in load_manifest(parallel)}
    serial_cuts = load_manifest(serial)
    assert sorted(by_id) == sorted(c.id for c in serial_cuts) and len(serial_cuts) == 4
    for cut in serial_cuts:
        np.testing.assert_array_equal(cut.load_features(), by_id[cut.id].load_features())


def test_speed_perturbation_adds_one_copy_per_factor(cuts, tmp_path):
    output = compute_fbank(cuts, tmp_path / "c.jsonl.gz", tmp_path / "f", speed_factors=(0.9, 1.1))
    result = {c.id: c for c in load_manifest(output)}
    assert len(result) == 12
    for cut in cuts:
        assert result[f"{cut.id}_sp0.9"].num_frames == pytest.approx(cut.duration / 0.9 * 100, abs=1)
        assert result[f"{cut.id}_sp1.1"].num_frames == pytest.approx(cut.duration / 1.1 * 100, abs=1)


def test_existing_output_is_kept(cuts, tmp_path):
    output = tmp_path / "c.jsonl.gz"
    output.write_text("finished earlier")
    assert compute_fbank(cuts, output, tmp_path / "f") == output
    assert output.read_text() == "finished earlier" and not (tmp_path / "f.lca").exists()


def test_empty_cut_set_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no cuts to compute features for"):
        compute_fbank(CutSet.from_cuts([]), tmp_path / "c.jsonl.gz", tmp_path / "f")
