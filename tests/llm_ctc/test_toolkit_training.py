"""LLM-CTC and LLM-CE through the shared trainer and decoder (asr.train, asr.decode):
a tiny random Qwen3 with the real 151,936-row head and the real tokenizer, a tiny
Zipformer checkpoint as the frozen encoder, the tiny cut corpus."""

import shutil
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from asr.decode import main as decode
from asr.train import main as train
from references.tiny_llm import tiny_llm_training_arguments

@pytest.fixture(scope="module")
def corpus(small_training_corpus) -> Dict[str, Path]:
    return small_training_corpus


def arguments(corpus, ctc_config, exp_dir: Path, *extra: str) -> List[str]:
    return tiny_llm_training_arguments(corpus, ctc_config, exp_dir, *extra)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def uninterrupted(corpus, ctc_config, tmp_path_factory) -> Path:
    exp_dir = tmp_path_factory.mktemp("llm_exp")
    train(arguments(corpus, ctc_config, exp_dir))
    return exp_dir


def trainable_names(ctc_config, qwen3_tokenizer) -> set:
    from llm_ctc.model import LLMCTCModel

    model = LLMCTCModel(ctc_config, tokenizer=qwen3_tokenizer)
    return {name for name, p in model.named_parameters() if p.requires_grad}


def test_checkpoint_holds_the_trainable_parameters_only(uninterrupted, ctc_config, qwen3_tokenizer) -> None:
    final = load(uninterrupted / "epoch-2.pt")
    expected = trainable_names(ctc_config, qwen3_tokenizer)
    assert set(final["model"]) == expected == set(final["model_avg"])
    assert all(tensor.dtype == torch.float64 for tensor in final["model_avg"].values())
    # The frozen 151,936 x 64 head / embedding alone has 9.7 M values; LoRA + projector + q + eta far fewer.
    stored = sum(tensor.numel() for tensor in final["model"].values())
    assert stored < 151_936 * 64 / 10
    assert final["config"]["family"] == "llm_ctc" and final["config"]["model"]["blank_id"] == 151_669


@pytest.mark.parametrize("resume_argument", ["train.start_batch=2", "train.start_epoch=2"])
def test_resumed_training_matches_uninterrupted_bit_for_bit(corpus, ctc_config, uninterrupted, tmp_path,
                                                            resume_argument) -> None:
    assert load(uninterrupted / "epoch-1.pt")["batch_idx_train"] > 2  # checkpoint-2.pt is mid-epoch
    for name in ("checkpoint-2.pt", "epoch-1.pt"):
        shutil.copy(uninterrupted / name, tmp_path / name)
    train(arguments(corpus, ctc_config, tmp_path, resume_argument))
    first, second = load(uninterrupted / "epoch-2.pt"), load(tmp_path / "epoch-2.pt")
    for entry in ("model", "model_avg"):
        for name, tensor in first[entry].items():
            assert torch.equal(tensor, second[entry][name]), f"{entry}.{name} differs"
    assert first["optimizer"]["state"].keys() == second["optimizer"]["state"].keys()


def test_frozen_parts_get_no_update_and_the_trainable_ones_do(corpus, ctc_config, tmp_path) -> None:
    """After every optimizer step of asr.train, the head, encoder and base LLM weights
    equal those just loaded from their files and have no gradient; LoRA, projector, q and
    eta move between the first step and the end."""
    from llm_ctc.family import build_model, build_tokenizer

    tokenizer = build_tokenizer(ctc_config)
    reference = build_model(ctc_config, tokenizer.vocab_size, tokenizer.blank_id)
    pretrained = {name: p.detach().clone() for name, p in reference.named_parameters() if not p.requires_grad}
    after_first_step: Dict[str, torch.Tensor] = {}
    checked = []

    def after_step(run, batch, state) -> None:
        model = run.model
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        if not after_first_step:
            after_first_step.update({name: p.detach().clone() for name, p in model.named_parameters()
                                     if p.requires_grad})
        for name, parameter in model.named_parameters():
            if name in trainable:
                continue
            assert parameter.grad is None
            assert torch.equal(parameter, pretrained[name]), f"frozen {name} changed"
        checked.append(state.batch_idx_train)

    train(arguments(corpus, ctc_config, tmp_path, "train.num_epochs=1"), after_step=after_step)
    assert len(checked) > 2
    final = load(tmp_path / "epoch-1.pt")["model"]
    moved = {name for name, value in final.items() if not torch.equal(value, after_first_step[name])}
    assert {"blank_offset", "query", "projector.linear1.weight"} <= moved
    assert any("lora_B" in name for name in moved)


def test_decoding_writes_wer_files_of_the_checkpoint_weights(corpus, ctc_config, uninterrupted,
                                                             qwen3_tokenizer) -> None:
    from llm_ctc.build import build_model
    from llm_ctc.decoding import recognize

    rates = decode([f"--exp-dir={uninterrupted}", "--epoch=2", "--avg=1", "--use-averaged-model=false",
                    f"--test-cuts=valid={corpus['valid']}", "--num-workers=0", "--token-penalty=0.3",
                    "--method", "ctc-greedy-search", "ctc-prefix-beam-search"])
    suffix = "epoch-2_avg-1"
    summary = (uninterrupted / f"wer-summary-valid-{suffix}.txt").read_text().splitlines()
    assert {line.split("\t")[0]: float(line.split("\t")[1]) for line in summary[1:]} == rates["valid"]
    for key in ("ctc-greedy-search", "ctc-prefix-beam-search_beam-4_token-penalty-0.3"):
        for kind in ("recogs", "errs"):
            assert (uninterrupted / f"{kind}-valid-{key}-{suffix}.txt").is_file()
    # The greedy hypothesis is that of the checkpoint's weights, decoded by llm_ctc itself.
    model = build_model(ctc_config, tokenizer=qwen3_tokenizer)
    model.load_checkpoint_state_dict(load(uninterrupted / "epoch-2.pt")["model"])
    model.prepare_for_decoding()
    batch = next(iter(valid_batches(corpus)))
    _, texts = recognize(model.eval(), batch["features"], batch["feature_lens"])
    recogs = (uninterrupted / f"recogs-valid-ctc-greedy-search-{suffix}.txt").read_text()
    assert f"hyp={texts[0].split()}" in recogs
    assert "ref=['valid']" in recogs


def valid_batches(corpus):
    from asr.config import DataOptions
    from asr.data import build_valid_dataloader

    return build_valid_dataloader(DataOptions(valid_cuts=str(corpus["valid"]), num_workers=0))


def test_llm_ce_trains_and_decodes_by_generation(corpus, ctc_config, tmp_path) -> None:
    train(arguments(corpus, ctc_config, tmp_path, "model.objective=ce", "model.max_new_tokens=4",
                    "train.num_epochs=1"))
    rates = decode([f"--exp-dir={tmp_path}", "--epoch=1", "--avg=1", "--use-averaged-model=false",
                    f"--test-cuts=valid={corpus['valid']}", "--num-workers=0", "--beam-size=2",
                    "--method", "llm-greedy-search", "llm-beam-search"])
    assert set(rates["valid"]) == {"llm-greedy-search", "llm-beam-search_beam-2"}
    assert (tmp_path / "recogs-valid-llm-beam-search_beam-2-epoch-1_avg-1.txt").is_file()
    with pytest.raises(SystemExit, match="ctc-greedy-search needs a model decoded by ctc-search"):
        decode([f"--exp-dir={tmp_path}", "--epoch=1", "--avg=1", "--use-averaged-model=false",
                f"--test-cuts=valid={corpus['valid']}", "--num-workers=0", "--method", "ctc-greedy-search"])


def test_bf16_autocast_trains_with_finite_weights(corpus, ctc_config, tmp_path) -> None:
    train(arguments(corpus, ctc_config, tmp_path, "train.precision=bf16", "train.max_batches=2"))
    state = load(tmp_path / "checkpoint-2.pt")
    assert state["config"]["train"]["precision"] == "bf16"
    assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())
    assert all(tensor.dtype == torch.float32 for tensor in state["model"].values())


def test_greedy_decoding_alone_takes_no_log_softmax_and_finds_the_same_words(corpus, uninterrupted, tmp_path,
                                                                             monkeypatch) -> None:
    from llm_ctc.model import LLMCTCModel

    suffix = "epoch-2_avg-1"
    recogs = {}
    for name, methods in (("both", ["ctc-greedy-search", "ctc-prefix-beam-search"]), ("alone", ["ctc-greedy-search"])):
        exp_dir = tmp_path / name
        exp_dir.mkdir()
        shutil.copy(uninterrupted / "epoch-2.pt", exp_dir / "epoch-2.pt")
        with monkeypatch.context() as patch:
            if name == "alone":
                patch.setattr(LLMCTCModel, "log_probs", lambda *_: pytest.fail("log_probs taken for greedy alone"))
            decode([f"--exp-dir={exp_dir}", "--epoch=2", "--avg=1", "--use-averaged-model=false",
                    f"--test-cuts=train={corpus['train']}", "--num-workers=0", "--method", *methods])
        recogs[name] = (exp_dir / f"recogs-train-ctc-greedy-search-{suffix}.txt").read_text()
    assert recogs["alone"] == recogs["both"] and "hyp=" in recogs["alone"]


def test_init_from_a_speech_readout_run_starts_a_query_readout_run(corpus, ctc_config, uninterrupted,
                                                                     tmp_path) -> None:
    """train.init_from across readouts (egs/mini stage 10 starts streaming query-readout
    LLM-CTC from stage 8's speech readout): LoRA, projector and eta come from the
    checkpoint, q (which the speech readout lacks) keeps its initialization; a learning
    rate of 1e-30 leaves both there after the first update. The other way round, the
    checkpoint's q has no place in a speech-readout model: a named error."""
    tiny = ("optim.lr=1e-30", "train.max_batches=1", "train.num_epochs=1")
    train(arguments(corpus, ctc_config, tmp_path / "speech", "model.readout=speech", "train.max_batches=2"))
    source = load(tmp_path / "speech" / "checkpoint-2.pt")["model"]
    assert "query" not in source
    train(arguments(corpus, ctc_config, tmp_path / "query", f"train.init_from={tmp_path / 'speech' / 'checkpoint-2.pt'}",
                    *tiny))
    started = load(tmp_path / "query" / "checkpoint-1.pt")["model"]
    train(arguments(corpus, ctc_config, tmp_path / "fresh", *tiny))
    fresh = load(tmp_path / "fresh" / "checkpoint-1.pt")["model"]
    assert set(started) == set(source) | {"query"}
    for name, tensor in source.items():
        torch.testing.assert_close(started[name], tensor, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(started["query"], fresh["query"], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(fresh["projector.linear1.weight"], source["projector.linear1.weight"])
    with pytest.raises(SystemExit, match=r"train.init_from: the weights of .*checkpoint-2.pt do not fit this model: "
                                         r"weights this model lacks: \['query'\]"):
        train(arguments(corpus, ctc_config, tmp_path / "back", "model.readout=speech",
                        f"train.init_from={uninterrupted / 'checkpoint-2.pt'}", *tiny))
