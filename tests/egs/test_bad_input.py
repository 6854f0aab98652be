"""Broken corpora and interrupted stages: clear messages that name the file or
folder, no half-written manifest, and reruns that finish the work."""

from __future__ import annotations

import logging
import shutil

import pytest

from local.corpus_checks import CorpusError
from local.prepare_manifests import prepare_manifests

PARTS = ("dev-clean", "test-clean")


@pytest.fixture
def tiny_librispeech(tmp_path):
    from local.make_mini_corpus import make_librispeech

    return make_librispeech(tmp_path / "download", {part: 3 for part in PARTS}, seed=7)


def _assert_no_manifest(output_dir):
    leftovers = list(output_dir.rglob("*")) if output_dir.exists() else []
    assert leftovers == [], leftovers


def test_missing_corpus_folder_says_where_to_place_it(recipe_copy, run_recipe):
    recipe = recipe_copy("librispeech")
    result = run_recipe(recipe, "--stage", "1", "--stop-stage", "1", check=False)
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{recipe}/download/LibriSpeech does not exist" in message
    assert "ln -s /path/to/your/LibriSpeech" in message
    assert not list((recipe / "data/manifests").glob("*.jsonl.gz"))


def test_corrupt_audio_file_is_named(tiny_librispeech, tmp_path):
    broken = sorted((tiny_librispeech / "dev-clean").rglob("*.flac"))[1]
    broken.write_bytes(b"not a flac file at all" * 10)
    with pytest.raises(CorpusError, match=f"audio file {broken} is not readable audio"):
        prepare_manifests("librispeech", tiny_librispeech, tmp_path / "manifests", PARTS)
    _assert_no_manifest(tmp_path / "manifests")


def test_transcript_line_without_audio_names_the_transcript_line(tiny_librispeech, tmp_path):
    missing = sorted((tiny_librispeech / "test-clean").rglob("*.flac"))[0]
    missing.unlink()
    transcript = next(missing.parent.glob("*.trans.txt"))
    with pytest.raises(CorpusError, match=f"{transcript}:1: utterance {missing.stem} has no audio file"):
        prepare_manifests("librispeech", tiny_librispeech, tmp_path / "manifests", PARTS)
    _assert_no_manifest(tmp_path / "manifests")


def test_empty_split_names_the_folder(tiny_librispeech, tmp_path):
    part_dir = tiny_librispeech / "dev-clean"
    for child in part_dir.iterdir():
        shutil.rmtree(child)
    with pytest.raises(CorpusError, match=f"{part_dir} holds no transcripts .*an empty split"):
        prepare_manifests("librispeech", tiny_librispeech, tmp_path / "manifests", PARTS)
    _assert_no_manifest(tmp_path / "manifests")


def test_missing_part_lists_the_parts_found(tiny_librispeech, tmp_path):
    with pytest.raises(CorpusError, match=r"train-clean-100 does not exist; found \['dev-clean', 'test-clean'\]"):
        prepare_manifests("librispeech", tiny_librispeech, tmp_path / "manifests", ["train-clean-100"])


def test_aishell_empty_split_and_transcript_without_audio(tmp_path, caplog):
    from local.make_mini_corpus import make_aishell

    corpus = make_aishell(tmp_path / "aishell", {"train": 3, "dev": 2, "test": 2}, seed=1)
    dev_wav = sorted((corpus / "data_aishell/wav/dev").rglob("*.wav"))[0]
    dev_wav.unlink()
    transcript = corpus / "data_aishell/transcript/aishell_transcript_v0.8.txt"
    with caplog.at_level(logging.WARNING):
        prepare_manifests("aishell", corpus, tmp_path / "manifests")
    assert f"1 lines of {transcript} have no wav file" in caplog.text and dev_wav.stem in caplog.text
    for wav in (corpus / "data_aishell/wav/test").rglob("*.wav"):
        wav.unlink()
    with pytest.raises(CorpusError, match=f"{corpus}/data_aishell/wav/test holds no wav files"):
        prepare_manifests("aishell", corpus, tmp_path / "manifests2")
    _assert_no_manifest(tmp_path / "manifests2")


def test_gigaspeech_missing_opus_is_named(tmp_path):
    from local.make_mini_corpus import make_gigaspeech

    corpus = make_gigaspeech(tmp_path / "GigaSpeech", {"XL": 1, "DEV": 1}, segments_per_recording=1, seed=1)
    opus = sorted(corpus.rglob("*.opus"))[1]
    opus.unlink()
    with pytest.raises(CorpusError, match=f"do not exist, e.g. {opus}"):
        prepare_manifests("gigaspeech", corpus, tmp_path / "manifests", ["XL", "DEV"])
    _assert_no_manifest(tmp_path / "manifests")


def test_killed_manifest_stage_leaves_nothing_a_rerun_trips_on(tiny_librispeech, tmp_path):
    manifests = tmp_path / "manifests"
    stale = manifests / ".librispeech-preparing-killed"
    stale.mkdir(parents=True)
    (stale / "librispeech_recordings_dev-clean.jsonl.gz").write_text("half")
    written = prepare_manifests("librispeech", tiny_librispeech, manifests, PARTS)
    assert sorted(p.name for p in manifests.iterdir()) == sorted(p.name for p in written)
    from lhotse import load_manifest

    assert len(load_manifest(manifests / "librispeech_recordings_dev-clean.jsonl.gz")) == 3


def test_interrupted_feature_stage_completes_on_rerun(tiny_librispeech, tmp_path):
    from local.compute_fbank import compute_fbank_of_parts

    manifests, fbank = tmp_path / "manifests", tmp_path / "fbank"
    prepare_manifests("librispeech", tiny_librispeech, manifests, PARTS)
    audio = sorted((tiny_librispeech / "test-clean").rglob("*.flac"))[2]
    good = audio.read_bytes()
    audio.write_bytes(good[: len(good) // 3])  # truncated mid-stage: extraction fails on it
    with pytest.raises(RuntimeError, match=f"could not be computed .*{audio}"):
        compute_fbank_of_parts("librispeech", manifests, fbank, PARTS)
    first = fbank / "librispeech_cuts_dev-clean.jsonl.gz"
    assert first.is_file() and not (fbank / "librispeech_cuts_test-clean.jsonl.gz").exists()
    assert not list(fbank.glob("*partial*"))
    finished_at = first.stat().st_mtime_ns
    audio.write_bytes(good)
    outputs = compute_fbank_of_parts("librispeech", manifests, fbank, PARTS)
    from lhotse import load_manifest

    assert [len(load_manifest(path)) for path in outputs] == [3, 3]
    assert first.stat().st_mtime_ns == finished_at


def test_failed_download_says_how_to_place_a_copy(tmp_path, monkeypatch):
    import lhotse.recipes

    from local.download_corpus import DownloadError, download_corpus

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(lhotse.recipes, "download_librispeech", offline)
    with pytest.raises(DownloadError, match=f"ln -s /path/to/your/LibriSpeech {tmp_path}/LibriSpeech"):
        download_corpus("librispeech", tmp_path, ["dev-clean"])
    with pytest.raises(DownloadError, match=f"write it into {tmp_path}/password"):
        download_corpus("gigaspeech", tmp_path, ["XL"])
    assert not (tmp_path / "GigaSpeech").exists() and not (tmp_path / "LibriSpeech").exists()


def test_a_stage_the_recipe_does_not_have_is_refused(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    result = run_recipe(recipe, "--stage", "12", "--stop-stage", "12", check=False)
    assert result.returncode != 0
    assert "--stage 12: this recipe's stages are 0..11" in result.stdout + result.stderr
    backwards = run_recipe(recipe, "--stage", "5", "--stop-stage", "4", check=False)
    assert backwards.returncode != 0 and "no stage would run" in backwards.stdout + backwards.stderr


def test_a_missing_llm_preset_is_named_by_its_own_option(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    result = run_recipe(recipe, "--stage", "8", "--stop-stage", "8", "--llm-config", "conf/nope.yaml", check=False)
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "--llm-config: file not found: conf/nope.yaml" in message and "--train-config" not in message


def test_a_training_folder_given_in_train_args_is_the_one_announced(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    result = run_recipe(recipe, "--stage", "8", "--stop-stage", "8", "--train-args", "train.exp_dir=exp/mine",
                        check=False)  # fails later: stages 0-7 did not run
    assert "on the frozen Zipformer into exp/mine" in result.stdout + result.stderr


def test_a_training_folder_for_the_llm_stages_leaves_the_zipformers_folder_alone(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    result = run_recipe(recipe, "--stage", "7", "--stop-stage", "8", "--train-args", "train.exp_dir=exp/mine",
                        check=False)  # fails later: stages 0-6 did not run
    message = result.stdout + result.stderr
    assert "the decoding weights of exp/full_pruned_ctc as exp/full_pruned_ctc/decoding.pt" in message
    assert "exp/mine/decoding.pt" not in message


def test_the_llm_and_its_preset_go_together(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    for args, expected in [
        (["--llm", "smollm3"], "--llm must be tiny or smollm2, got 'smollm3'"),
        (["--llm", "smollm2", "--llm-config", "conf/llm_ctc.yaml"],
         "--llm-config conf/llm_ctc.yaml is a preset for --llm tiny, not --llm smollm2"),
        (["--llm-config", "conf/llm_ce_smollm2.yaml"],
         "--llm-config conf/llm_ce_smollm2.yaml is a preset for --llm smollm2, not --llm tiny"),
    ]:
        result = run_recipe(recipe, "--stage", "8", "--stop-stage", "8", *args, check=False)
        assert result.returncode != 0 and expected in result.stdout + result.stderr, args
    # --llm smollm2 alone takes SmolLM2's LLM-CTC preset and trains into its own folder.
    result = run_recipe(recipe, "--stage", "8", "--stop-stage", "8", "--llm", "smollm2", check=False)
    assert "Stage 8: train the LLM (conf/llm_ctc_smollm2.yaml) on the frozen Zipformer into " \
           "exp/full_llm_ctc_smollm2" in result.stdout + result.stderr


def test_stage_10_names_its_two_folders_and_needs_stages_7_and_8(recipe_copy, run_recipe):
    recipe = recipe_copy("mini")
    result = run_recipe(recipe, "--stage", "10", "--stop-stage", "10", check=False)
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "into exp/full_llm_ctc_streaming_lookahead0.32 on exp/full_pruned_ctc fine-tuned on chunk windows " \
           "(exp/full_pruned_ctc_streaming_lookahead0.32)" in message
    assert "stage 10 needs stage 7's exp/full_pruned_ctc/decoding.pt (run --stage 7 first)" in message
    # With stage 7's encoder weights but no stage-8 LLM to start from.
    (recipe / "exp" / "full_pruned_ctc").mkdir(parents=True)
    (recipe / "exp" / "full_pruned_ctc" / "decoding.pt").write_bytes(b"")
    result = run_recipe(recipe, "--stage", "10", "--stop-stage", "10", check=False)
    message = result.stdout + result.stderr
    assert result.returncode != 0
    assert "stage 10 starts from stage 8's LLM-CTC in exp/full_llm_ctc (run --stage 8 first)" in message
