"""egs/librispeech/run.sh end to end on a miniature LibriSpeech: the data stages 0-5, then
stages 10-12 (a tiny model trained, decoded and summarized) on their data, including a
training that resumes where it was stopped."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import soundfile as sf

from references.recipe_training import DATA_OPTIONS, EXP, TINY, TrainedRecipeChecks, trained_recipe, training_copy

PARTS = ("train-clean-100", "dev-clean", "test-clean")
TRAIN = "train-clean-100"


@pytest.fixture(scope="module")
def recipe(recipe_copy, run_recipe, librispeech_corpus, musan_corpus):
    recipe = recipe_copy("librispeech")
    (recipe / "download" / "LibriSpeech").symlink_to(librispeech_corpus)
    (recipe / "download" / "musan").symlink_to(musan_corpus)
    run_recipe(recipe, "--parts", " ".join(PARTS), "--train-parts", TRAIN)
    return recipe


def _transcripts(part_dir: Path) -> dict:
    """utterance id -> text, read straight from the *.trans.txt files."""
    texts = {}
    for transcript in part_dir.rglob("*.trans.txt"):
        for line in transcript.read_text().splitlines():
            utt_id, text = line.split(" ", 1)
            texts[utt_id] = text
    return texts


@pytest.mark.parametrize("part", PARTS)
def test_manifests_hold_every_utterance_with_its_text_and_duration(recipe, librispeech_corpus, part):
    from lhotse import load_manifest

    expected = _transcripts(librispeech_corpus / part)
    supervisions = load_manifest(recipe / f"data/manifests/librispeech_supervisions_{part}.jsonl.gz")
    recordings = load_manifest(recipe / f"data/manifests/librispeech_recordings_{part}.jsonl.gz")
    assert {s.id: s.text for s in supervisions} == expected
    assert len(recordings) == len(expected) >= 6
    for recording in recordings:
        flac = next(librispeech_corpus.joinpath(part).rglob(f"{recording.id}.flac"))
        assert recording.duration == pytest.approx(sf.info(str(flac)).duration, abs=1e-3)
        assert recording.sampling_rate == 16000


@pytest.mark.parametrize("part", PARTS)
def test_features_are_80_dim_fbank_of_the_audio(recipe, check_features, part):
    count = check_features(recipe, f"data/fbank/librispeech_cuts_{part}.jsonl.gz")
    assert count == (18 * 2 if part == TRAIN else 6)


def test_training_cuts_are_speed_perturbed_by_0_9_and_1_1(recipe):
    from lhotse import load_manifest

    cuts = {c.id: c for c in load_manifest(recipe / f"data/fbank/librispeech_cuts_{TRAIN}.jsonl.gz")}
    originals = [c for cut_id, c in cuts.items() if "_sp" not in cut_id]
    assert len(originals) == 12 and len(cuts) == 36
    for cut in originals:
        slow, fast = cuts[f"{cut.id}_sp0.9"], cuts[f"{cut.id}_sp1.1"]
        assert slow.duration == pytest.approx(cut.duration / 0.9, abs=2e-3)
        assert fast.duration == pytest.approx(cut.duration / 1.1, abs=2e-3)
        assert slow.supervisions[0].text == fast.supervisions[0].text == cut.supervisions[0].text
    dev_ids = [c.id for c in load_manifest(recipe / "data/fbank/librispeech_cuts_dev-clean.jsonl.gz")]
    assert not any("_sp" in cut_id for cut_id in dev_ids)


def test_bpe_tokens_have_special_ids_and_round_trip_the_training_text(recipe, librispeech_corpus):
    import sentencepiece as spm

    lang = recipe / "data/lang_bpe_500"
    processor = spm.SentencePieceProcessor(model_file=str(lang / "bpe.model"))
    lines = (lang / "tokens.txt").read_text().splitlines()
    table = dict(line.split() for line in lines)
    assert (table["<blk>"], table["<sos/eos>"], table["<unk>"]) == ("0", "1", "2")
    assert [line.split()[0] for line in lines] == [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    for text in _transcripts(librispeech_corpus / TRAIN).values():
        ids = processor.encode(text)
        assert 0 not in ids and 1 not in ids and 2 not in ids
        assert processor.decode(ids) == text
    # An unseen character maps to <unk> rather than failing.
    assert 2 in processor.encode("Q9 §")


def test_musan_is_cut_into_10_second_windows_keeping_those_over_5_seconds(recipe, musan_corpus):
    from lhotse import load_manifest

    durations = [sf.info(str(wav)).duration for wav in musan_corpus.rglob("*.wav")]
    expected = sum(int(d // 10) + (d % 10 > 5) for d in durations)
    cuts = load_manifest(recipe / "data/fbank/musan_cuts.jsonl.gz")
    assert len(cuts) == expected
    assert all(5.0 < c.duration <= 10.0 for c in cuts)
    assert sum(c.duration < 10.0 for c in cuts) == sum(d % 10 > 5 for d in durations) > 0


def test_rerun_skips_every_stage_and_changes_nothing(recipe, run_recipe, snapshot):
    before = snapshot(recipe / "data")
    began = time.time()
    result = run_recipe(recipe, "--parts", " ".join(PARTS), "--train-parts", TRAIN)
    # Each stage starts its program, which finds its outputs and says so.
    assert time.time() - began < 60.0
    assert snapshot(recipe / "data") == before
    for stage in range(6):
        assert f"Stage {stage}:" in result.stdout
    output = result.stdout + result.stderr  # the data programs log to stderr
    assert len(re.findall(r"skipping|nothing to do", output)) == 2 + 1 + 1 + len(PARTS) + 1 + 1, output
    assert "computing" not in result.stdout


def test_stage_options_select_stages(recipe, run_recipe):
    result = run_recipe(recipe, "--stage", "4", "--stop-stage", "4", "--parts", " ".join(PARTS))
    assert "Stage 4:" in result.stdout
    assert "Stage 3:" not in result.stdout and "Stage 5:" not in result.stdout


def test_manifests_equal_those_of_lhotses_own_recipe_function(recipe, librispeech_corpus):
    from lhotse import load_manifest
    from lhotse.recipes import prepare_librispeech

    reference = prepare_librispeech(librispeech_corpus, dataset_parts=list(PARTS), output_dir=None)
    for part in PARTS:
        ours = load_manifest(recipe / f"data/manifests/librispeech_supervisions_{part}.jsonl.gz")
        theirs = reference[part]["supervisions"]
        assert sorted((s.id, s.text, s.duration) for s in ours) == sorted((s.id, s.text, s.duration) for s in theirs)


# --- Stages 10-12: training, decoding and summary on the data above (references/recipe_training.py) ---

@pytest.fixture(scope="module")
def trained(recipe, recipe_copy, run_recipe):
    """Trained in two runs: the first stops after one batch, the second resumes."""
    return trained_recipe(recipe_copy, run_recipe, recipe, "librispeech", stopped_first=True)


class TestTrainingStages(TrainedRecipeChecks):
    pass


def test_an_interrupted_training_resumes_from_its_checkpoint(trained):
    stopped, finished = trained["stopped"], trained["finished"]
    assert stopped.returncode != 0  # no epoch to decode after the first batch
    assert f"'last' asks for the newest epoch-*.pt of {EXP}, but there is none" in stopped.stderr
    assert f"resumed from {EXP}/checkpoint-1.pt: epoch 1, global batch 1" in finished.stdout
    assert "epoch 1, batch 1 (global 1)" not in finished.stdout  # the first batch is not trained again


@pytest.mark.slow
def test_a_resumed_training_ends_with_the_weights_of_an_uninterrupted_one(recipe, trained, recipe_copy, run_recipe):
    import torch

    uninterrupted = training_copy(recipe_copy, recipe, "librispeech")
    run_recipe(uninterrupted, *DATA_OPTIONS["librispeech"], "--stage", "10", "--stop-stage", "10",
               "--train-args", TINY)
    resumed = torch.load(trained["recipe"] / EXP / "epoch-2.pt", map_location="cpu", weights_only=False)
    straight = torch.load(uninterrupted / EXP / "epoch-2.pt", map_location="cpu", weights_only=False)
    assert resumed["batch_idx_train"] == straight["batch_idx_train"]
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
