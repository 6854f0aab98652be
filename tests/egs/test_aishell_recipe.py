"""egs/aishell/run.sh end to end on a miniature AISHELL-1: the data stages 0-5, then stages
10-12 (a tiny model trained, decoded and summarized, characters as tokens, CER) on their
data, and stage 13's ONNX export scored by sherpa-onnx."""

from __future__ import annotations

import re
import time

import pytest
import soundfile as sf

from references.recipe_training import EXP, SUFFIX, TrainedRecipeChecks, read_recogs, trained_recipe

SPLITS = {"train": 12, "dev": 5, "test": 5}


@pytest.fixture(scope="module")
def recipe(recipe_copy, run_recipe, aishell_corpus, musan_corpus):
    recipe = recipe_copy("aishell")
    (recipe / "download" / "aishell").symlink_to(aishell_corpus)
    (recipe / "download" / "musan").symlink_to(musan_corpus)
    run_recipe(recipe)
    return recipe


def _transcript(aishell_corpus) -> dict:
    """utterance id -> space-segmented words, straight from the transcript file."""
    path = aishell_corpus / "data_aishell/transcript/aishell_transcript_v0.8.txt"
    return dict(line.split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("split", SPLITS)
def test_manifests_hold_every_wav_with_its_text_without_spaces(recipe, aishell_corpus, split):
    from lhotse import load_manifest

    words = _transcript(aishell_corpus)
    wavs = {w.stem: w for w in (aishell_corpus / "data_aishell/wav" / split).rglob("*.wav")}
    supervisions = load_manifest(recipe / f"data/manifests/aishell_supervisions_{split}.jsonl.gz")
    assert len(wavs) == SPLITS[split]
    assert {s.id: s.text for s in supervisions} == {utt: words[utt].replace(" ", "") for utt in wavs}
    for supervision in supervisions:
        assert supervision.duration == pytest.approx(sf.info(str(wavs[supervision.id])).duration, abs=1e-3)
        assert supervision.speaker == wavs[supervision.id].parent.name


@pytest.mark.parametrize("split", SPLITS)
def test_features_are_80_dim_fbank_with_train_speed_perturbed(recipe, check_features, split):
    from lhotse import load_manifest

    cuts_path = f"data/fbank/aishell_cuts_{split}.jsonl.gz"
    count = check_features(recipe, cuts_path)
    ids = {c.id for c in load_manifest(recipe / cuts_path)}
    originals = {i for i in ids if "_sp" not in i}
    assert len(originals) == SPLITS[split]
    if split == "train":
        assert count == 3 * SPLITS[split]
        assert ids == originals | {f"{i}_sp0.9" for i in originals} | {f"{i}_sp1.1" for i in originals}
    else:
        assert ids == originals


def test_char_table_is_specials_then_every_training_character(recipe, aishell_corpus):
    words = _transcript(aishell_corpus)
    train_ids = {w.stem for w in (aishell_corpus / "data_aishell/wav/train").rglob("*.wav")}
    characters = sorted({c for utt in train_ids for c in words[utt] if c != " "})
    lines = (recipe / "data/lang_char/tokens.txt").read_text(encoding="utf-8").splitlines()
    assert lines == [f"{s} {i}" for i, s in enumerate(["<blk>", "<sos/eos>", "<unk>"] + characters)]
    assert len(characters) > 20


def test_rerun_skips_every_stage_and_changes_nothing(recipe, run_recipe, snapshot):
    before = snapshot(recipe / "data")
    began = time.time()
    result = run_recipe(recipe)
    # Each stage starts its program, which finds its outputs and says so.
    assert time.time() - began < 60.0
    assert snapshot(recipe / "data") == before
    assert "computing" not in result.stdout and "wrote" not in result.stdout
    output = result.stdout + result.stderr  # the data programs log to stderr
    assert len(re.findall(r"skipping|nothing to do", output)) == 2 + 1 + 1 + 3 + 1 + 1, output


# --- Stages 10-12: training, decoding and summary on the data above (references/recipe_training.py) ---

@pytest.fixture(scope="module")
def trained(recipe, recipe_copy, run_recipe):
    return trained_recipe(recipe_copy, run_recipe, recipe, "aishell")


class TestTrainingStages(TrainedRecipeChecks):
    pass


def test_stage_13_exports_to_onnx_and_scores_sherpa_onnx_like_the_decoder(trained, run_recipe):
    recipe = trained["recipe"]
    result = run_recipe(recipe, "--stage", "13", "--stop-stage", "13", "--decode-args", "decode.avg=1")
    onnx_dir = recipe / EXP / f"onnx-{SUFFIX}"
    assert {"model.onnx", "model.int8.onnx", "tokens.txt"} <= {p.name for p in onnx_dir.iterdir()}
    for model in ("model", "model.int8"):
        for name in trained["sets"]:
            assert (onnx_dir / f"wer-summary-{name}-{model}.txt").is_file()
            # Characters as references: the preset's decode.compute_cer, as asr.decode scores them.
            recogs = read_recogs(onnx_dir / f"recogs-{name}-sherpa-onnx-greedy-search-{model}.txt")
            ours = read_recogs(recipe / EXP / f"recogs-{name}-ctc-greedy-search-{SUFFIX}.txt")
            assert {cut: ref for cut, (ref, _) in recogs.items()} == {cut: ref for cut, (ref, _) in ours.items()}
    assert "real-time factor" in result.stdout
