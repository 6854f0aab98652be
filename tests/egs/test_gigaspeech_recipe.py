"""egs/gigaspeech/run.sh end to end on a miniature GigaSpeech: the data stages 0-8, then
stages 10-12 (a tiny model trained, decoded and summarized) on their data, reading every
piece of the XL subset's features."""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from references.recipe_training import EXP, TrainedRecipeChecks, trained_recipe

SUBSETS = {"XL": 3, "DEV": 1, "TEST": 1}
CHUNK_SIZE = 2
GARBAGE = {"<SIL>", "<MUSIC>", "<NOISE>", "<OTHER>"}
PUNCTUATION = {"<COMMA>", "<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>"}


@pytest.fixture(scope="module")
def recipe(recipe_copy, run_recipe, gigaspeech_corpus, musan_corpus):
    recipe = recipe_copy("gigaspeech")
    (recipe / "download" / "GigaSpeech").symlink_to(gigaspeech_corpus)
    (recipe / "download" / "musan").symlink_to(musan_corpus)
    run_recipe(recipe, "--xl-chunk-size", str(CHUNK_SIZE))
    return recipe


def _expected_training_texts(gigaspeech_corpus, subset: str) -> dict:
    """segment id -> text_tn without punctuation tags, for segments without garbage tags,
    read straight from GigaSpeech.json."""
    metadata = json.loads((gigaspeech_corpus / "GigaSpeech.json").read_text())
    texts = {}
    for audio in metadata["audios"]:
        if "{" + subset + "}" not in audio["subsets"]:
            continue
        for segment in audio["segments"]:
            words = segment["text_tn"].split()
            if not GARBAGE & set(words):
                texts[segment["sid"]] = " ".join(w for w in words if w not in PUNCTUATION)
    return texts


@pytest.mark.parametrize("subset", SUBSETS)
def test_raw_cuts_drop_garbage_segments_and_punctuation_tags(recipe, gigaspeech_corpus, subset):
    from lhotse import load_manifest

    expected = _expected_training_texts(gigaspeech_corpus, subset)
    cuts = load_manifest(recipe / f"data/fbank/gigaspeech_cuts_{subset}_raw.jsonl.gz")
    assert len(cuts) == SUBSETS[subset]
    assert {s.id: s.text for c in cuts for s in c.supervisions} == expected
    assert len(expected) == 4 * SUBSETS[subset]
    all_supervisions = load_manifest(recipe / f"data/manifests/gigaspeech_supervisions_{subset}.jsonl.gz")
    assert len(all_supervisions) == 5 * SUBSETS[subset]


@pytest.mark.parametrize("subset", ["DEV", "TEST"])
def test_eval_features_are_one_cut_per_kept_segment(recipe, gigaspeech_corpus, check_features, subset):
    from lhotse import load_manifest

    cuts_path = f"data/fbank/gigaspeech_cuts_{subset}.jsonl.gz"
    assert check_features(recipe, cuts_path) == 4 * SUBSETS[subset]
    expected = _expected_training_texts(gigaspeech_corpus, subset)
    assert {c.supervisions[0].id: c.supervisions[0].text for c in load_manifest(recipe / cuts_path)} == expected


def test_training_subset_is_split_into_pieces_with_features(recipe, gigaspeech_corpus, check_features):
    from lhotse import load_manifest

    split = recipe / "data/fbank/gigaspeech_XL_split"
    pieces = sorted(split.glob("gigaspeech_cuts_XL.*.jsonl.gz"))
    assert len(pieces) == math.ceil(SUBSETS["XL"] / CHUNK_SIZE) == 2
    assert sum(check_features(recipe, str(p.relative_to(recipe))) for p in pieces) == 4 * SUBSETS["XL"]
    texts = {c.supervisions[0].id: c.supervisions[0].text for p in pieces for c in load_manifest(p)}
    assert texts == _expected_training_texts(gigaspeech_corpus, "XL")


def test_bpe_is_trained_on_the_normalized_training_text(recipe, gigaspeech_corpus):
    import sentencepiece as spm

    lang = recipe / "data/lang_bpe_500"
    transcript = (lang / "transcript_words.txt").read_text().splitlines()
    assert sorted(transcript) == sorted(_expected_training_texts(gigaspeech_corpus, "XL").values())
    processor = spm.SentencePieceProcessor(model_file=str(lang / "bpe.model"))
    assert [processor.id_to_piece(i) for i in range(3)] == ["<blk>", "<sos/eos>", "<unk>"]
    assert all(processor.decode(processor.encode(line)) == line for line in transcript)
    assert not any(tag in " ".join(transcript) for tag in GARBAGE | PUNCTUATION)


def test_interrupted_piece_is_completed_by_a_rerun_of_its_range(recipe, run_recipe, snapshot, check_features):
    split = recipe / "data/fbank/gigaspeech_XL_split"
    first, second = sorted(split.glob("gigaspeech_cuts_XL.*.jsonl.gz"))
    # An interruption leaves the piece's storage but no finished cuts manifest.
    second.unlink()
    (split / second.name.replace("_XL.", "_XL.partial.")).write_text("half")
    untouched = snapshot(split)
    result = run_recipe(recipe, "--stage", "6", "--stop-stage", "6", "--start", "1", "--stop", "2")
    assert "piece 2/2" in result.stdout + result.stderr
    after = snapshot(split)
    assert after[str(first)] == untouched[str(first)]
    assert second.is_file() and not (split / second.name.replace("_XL.", "_XL.partial.")).exists()
    assert check_features(recipe, str(second.relative_to(recipe))) > 0


def test_rerun_skips_every_stage_and_changes_nothing(recipe, run_recipe, snapshot):
    before = snapshot(recipe / "data")
    began = time.time()
    result = run_recipe(recipe, "--xl-chunk-size", str(CHUNK_SIZE))
    # Each stage starts its program, which finds its outputs and says so.
    assert time.time() - began < 60.0
    assert snapshot(recipe / "data") == before
    assert "computing" not in result.stdout
    for stage in range(9):
        assert f"Stage {stage}:" in result.stdout


def test_one_bpe_model_per_vocabulary_size(recipe, run_recipe):
    run_recipe(recipe, "--stage", "8", "--stop-stage", "8", "--vocab-sizes", "40 70")
    for size in (40, 70):
        lines = (recipe / f"data/lang_bpe_{size}/tokens.txt").read_text().splitlines()
        assert len(lines) == size and lines[:3] == ["<blk> 0", "<sos/eos> 1", "<unk> 2"]


# --- Stages 10-12: training, decoding and summary on the data above (references/recipe_training.py) ---

@pytest.fixture(scope="module")
def trained(recipe, recipe_copy, run_recipe):
    return trained_recipe(recipe_copy, run_recipe, recipe, "gigaspeech")


class TestTrainingStages(TrainedRecipeChecks):
    pass


def test_training_reads_every_feature_piece(trained):
    from lhotse import load_manifest

    from asr.data import load_cuts_lazy

    recipe = trained["recipe"]
    pieces = sorted((recipe / "data/fbank/gigaspeech_XL_split").glob("gigaspeech_cuts_XL.*.jsonl.gz"))
    assert len(pieces) == 2
    expected = sorted(c.id for p in pieces for c in load_manifest(p))
    pattern = str(recipe / "data/fbank/gigaspeech_XL_split/gigaspeech_cuts_XL.[0-9]*.jsonl.gz")
    assert sorted(c.id for c in load_cuts_lazy(pattern)) == expected
    log = "\n".join(p.read_text() for p in (recipe / EXP / "log").glob("log-train-*"))
    kept = [int(n) for n in re.findall(r"cut filter: kept (\d+) of", log)]
    assert kept and all(k == len(expected) for k in kept)
