"""Specification of asr.decode: checkpoint choice, search, icefall result files, bad input."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import kaldialign
import pytest
import torch
from lhotse import CutSet, load_manifest

from asr.averaging import make_averaged_model, update_averaged_model
from asr.checkpoint import epoch_checkpoint_path, iteration_checkpoint_path, save_checkpoint
from asr.decode import main
from asr.test_sets import parse_test_sets
from zipformer.model import CTCModel
from zipformer.presets import get_preset
from asr.config import load_run_config
from asr.search import ctc_greedy_search
from asr.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEST = {
    "utt-1": (1.3, "HELLO WORLD"),
    "utt-2": (1.7, "PRUNED CTC"),
    "utt-3": (2.1, "A SMALL TEST"),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, make_cut_corpus) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("decode_corpus")
    paths = make_cut_corpus(root, train={"t-1": (1.2, "HI")}, valid=TEST)
    empty = root / "empty_cuts.jsonl.gz"
    CutSet.from_cuts([]).to_file(empty)
    return {**paths, "test": paths["valid"], "empty": empty}


def run_config(corpus: Dict[str, Path], exp_dir: Path, *overrides: str):
    """The configuration asr.train saves: the preset, with the lexicon's 29 letters."""
    config = load_run_config(None, [
        "model.preset=tiny", f"train.exp_dir={exp_dir}",
        f"train.lang_dir={corpus['lang']}", f"data.train_cuts={corpus['train']}",
        f"data.valid_cuts={corpus['valid']}", "data.max_duration=3", "train.average_period=2", *overrides,
    ])
    config.model = dataclasses.replace(config.model, vocab_size=29)
    return config


def write_epochs(corpus: Dict[str, Path], exp_dir: Path, epochs: int = 2, overrides_of_epoch: Dict[int, List[str]] = None) -> None:
    """epoch-1.pt ... epoch-<epochs>.pt as train.py writes them: random weights that change
    between epochs, the running average updated every 2 batches, 4 batches an epoch."""
    torch.manual_seed(0)
    config = run_config(corpus, exp_dir)
    model = CTCModel(config.model)
    model_avg = make_averaged_model(model)
    for epoch in range(1, epochs + 1):
        for batch in range(4 * epoch - 3, 4 * epoch + 1):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.01 * torch.randn_like(parameter))
            update_averaged_model(model_avg, model, batch, 2)
        saved = config
        if overrides_of_epoch and epoch in overrides_of_epoch:
            saved = run_config(corpus, exp_dir, *overrides_of_epoch[epoch])
        save_checkpoint(epoch_checkpoint_path(exp_dir, epoch), model=model, config=saved.to_dict(),
                        batch_idx_train=4 * epoch, epoch=epoch, model_avg=model_avg, average_period=2)


@pytest.fixture(scope="module")
def exp_dir(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    exp_dir = tmp_path_factory.mktemp("exp")
    write_epochs(corpus, exp_dir)
    return exp_dir


def decode(exp_dir: Path, test_cuts: Path, *extra: str) -> dict:
    return main(["--exp-dir", str(exp_dir), "--test-cuts", str(test_cuts), "--device", "cpu", *extra])


def parse_recogs(path: Path) -> Dict[str, Dict[str, list]]:
    """cut id -> {"ref": [...], "hyp": [...]} from an icefall recogs- file."""
    parsed: Dict[str, Dict[str, list]] = {}
    for line in path.read_text().splitlines():
        cut_id, _, rest = line.partition(":\t")
        kind, _, words = rest.partition("=")
        parsed.setdefault(cut_id, {})[kind] = ast.literal_eval(words)
    return parsed


@pytest.fixture(scope="module")
def decoded(exp_dir: Path, corpus: Dict[str, Path]) -> dict:
    rates = decode(exp_dir, corpus["test"], "--epoch", "2", "--avg", "1", "--use-averaged-model", "false",
                   "--method", "ctc-greedy-search", "ctc-prefix-beam-search", "--compute-cer", "false")
    return rates


def test_writes_icefall_files_for_each_method(decoded: dict, exp_dir: Path) -> None:
    assert set(decoded) == {"valid"}
    assert set(decoded["valid"]) == {"ctc-greedy-search", "ctc-prefix-beam-search_beam-4"}
    for key in decoded["valid"]:
        for kind in ("recogs", "errs"):
            assert (exp_dir / f"{kind}-valid-{key}-epoch-2_avg-1.txt").is_file()
    summary = (exp_dir / "wer-summary-valid-epoch-2_avg-1.txt").read_text().splitlines()
    assert summary[0] == "settings\tWER"
    assert {line.split("\t")[0]: float(line.split("\t")[1]) for line in summary[1:]} == decoded["valid"]


@pytest.mark.parametrize("key", ["ctc-greedy-search", "ctc-prefix-beam-search_beam-4"])
def test_recogs_hold_references_and_wer_agrees_with_kaldialign(decoded: dict, exp_dir: Path, corpus, key: str) -> None:
    recogs = parse_recogs(exp_dir / f"recogs-valid-{key}-epoch-2_avg-1.txt")
    assert {cut_id: pair["ref"] for cut_id, pair in recogs.items()} == {k: v[1].split() for k, v in TEST.items()}
    errors = sum(kaldialign.edit_distance(pair["ref"], pair["hyp"])["total"] for pair in recogs.values())
    words = sum(len(pair["ref"]) for pair in recogs.values())
    expected = round(100.0 * errors / words, 2)
    assert decoded["valid"][key] == pytest.approx(expected)
    errs = (exp_dir / f"errs-valid-{key}-epoch-2_avg-1.txt").read_text()
    assert re.match(r"%WER = (\S+)", errs).group(1) == f"{expected:.2f}"


def test_greedy_hypotheses_are_those_of_the_chosen_checkpoint(decoded: dict, exp_dir: Path, corpus) -> None:
    checkpoint = torch.load(exp_dir / "epoch-2.pt", map_location="cpu", weights_only=False)
    model = CTCModel(get_preset("tiny", vocab_size=29))
    model.load_state_dict(checkpoint["model"])
    model.eval()
    tokenizer = load_tokenizer(corpus["lang"])
    expected = {}
    with torch.no_grad():
        for cut in load_manifest(corpus["test"]):
            features = torch.from_numpy(cut.load_features()).unsqueeze(0)
            log_probs, lengths = model.log_probs(features, torch.tensor([features.size(1)]))
            expected[cut.id] = tokenizer.decode(ctc_greedy_search(log_probs, lengths)[0]).split()
    recogs = parse_recogs(exp_dir / "recogs-valid-ctc-greedy-search-epoch-2_avg-1.txt")
    assert {cut_id: pair["hyp"] for cut_id, pair in recogs.items()} == expected


def test_each_blank_penalty_is_a_setting_with_the_penalized_greedy_hypotheses(exp_dir: Path, corpus) -> None:
    """--blank-penalty 0 -4: two settings from one pass, the second the greedy search of the
    log-probs with 4 added to blank at every frame (computed here from the checkpoint)."""
    rates = decode(exp_dir, corpus["test"], "--epoch", "1", "--avg", "1", "--use-averaged-model", "false",
                   "--method", "ctc-greedy-search", "--blank-penalty", "0", "-4", "--compute-cer", "false")
    assert set(rates["valid"]) == {"ctc-greedy-search", "ctc-greedy-search_blank-penalty--4"}
    checkpoint = torch.load(exp_dir / "epoch-1.pt", map_location="cpu", weights_only=False)
    model = CTCModel(get_preset("tiny", vocab_size=29))
    model.load_state_dict(checkpoint["model"])
    model.eval()
    tokenizer = load_tokenizer(corpus["lang"])
    expected: Dict[str, Dict[str, list]] = {"ctc-greedy-search": {}, "ctc-greedy-search_blank-penalty--4": {}}
    with torch.no_grad():
        for cut in load_manifest(corpus["test"]):
            features = torch.from_numpy(cut.load_features()).unsqueeze(0)
            log_probs, lengths = model.log_probs(features, torch.tensor([features.size(1)]))
            expected["ctc-greedy-search"][cut.id] = tokenizer.decode(ctc_greedy_search(log_probs, lengths)[0]).split()
            penalized = log_probs.clone()
            penalized[..., 0] += 4.0
            expected["ctc-greedy-search_blank-penalty--4"][cut.id] = tokenizer.decode(
                ctc_greedy_search(penalized, lengths)[0]).split()
    assert expected["ctc-greedy-search"] != expected["ctc-greedy-search_blank-penalty--4"]
    for key, hypotheses in expected.items():
        recogs = parse_recogs(exp_dir / f"recogs-valid-{key}-epoch-1_avg-1.txt")
        assert {cut_id: pair["hyp"] for cut_id, pair in recogs.items()} == hypotheses


@pytest.mark.parametrize("side", ["tail", "lead"])
def test_padding_decodes_each_cut_beside_the_fbank_of_silence(exp_dir: Path, corpus, side) -> None:
    """--tail-padding-seconds 0.4 (--lead-padding-seconds 0.4): the setting named so, its
    hypotheses the greedy search of each cut's features followed (preceded) by 40 frames
    of Lhotse's fbank of zero samples."""
    from lhotse import Fbank, FbankConfig

    rates = decode(exp_dir, corpus["test"], "--epoch", "1", "--avg", "1", "--use-averaged-model", "false",
                   "--method", "ctc-greedy-search", f"--{side}-padding-seconds", "0.4", "--compute-cer", "false")
    assert set(rates["valid"]) == {f"ctc-greedy-search_{side}-padding-0.4s"}
    checkpoint = torch.load(exp_dir / "epoch-1.pt", map_location="cpu", weights_only=False)
    model = CTCModel(get_preset("tiny", vocab_size=29))
    model.load_state_dict(checkpoint["model"])
    model.eval()
    tokenizer = load_tokenizer(corpus["lang"])
    silence = torch.from_numpy(Fbank(FbankConfig(num_mel_bins=80)).extract(torch.zeros(16000).numpy(), 16000))[:40]
    expected, plain = {}, {}
    with torch.no_grad():
        for cut in load_manifest(corpus["test"]):
            stored = torch.from_numpy(cut.load_features())
            padded = torch.cat([stored, silence] if side == "tail" else [silence, stored])
            for features, into in ((padded, expected), (stored, plain)):
                log_probs, lengths = model.log_probs(features[None], torch.tensor([features.shape[0]]))
                into[cut.id] = tokenizer.decode(ctc_greedy_search(log_probs, lengths)[0]).split()
    assert expected != plain  # the silence changes what this random model writes
    recogs = parse_recogs(exp_dir / f"recogs-valid-ctc-greedy-search_{side}-padding-0.4s-epoch-1_avg-1.txt")
    assert {cut_id: pair["hyp"] for cut_id, pair in recogs.items()} == expected
    with pytest.raises(SystemExit, match=f"decode.{side}_padding_seconds must be a finite number of seconds >= 0"):
        decode(exp_dir, corpus["test"], f"--{side}-padding-seconds", "-1")


def test_averaged_model_and_cer_from_a_character_table(exp_dir: Path, corpus, capsys) -> None:
    rates = decode(exp_dir, f"mine={corpus['test']}", "--epoch", "2", "--avg", "1", "--method", "ctc-greedy-search")
    assert set(rates["mine"]) == {"ctc-greedy-search"}
    assert (exp_dir / "wer-summary-mine-epoch-2_avg-1_use-averaged-model.txt").is_file()
    recogs = parse_recogs(exp_dir / "recogs-mine-ctc-greedy-search-epoch-2_avg-1_use-averaged-model.txt")
    assert recogs["utt-1"]["ref"] == list("HELLOWORLD")  # the letters table scores characters
    assert "CER" in capsys.readouterr().out


def test_checkpoint_of_another_configuration_names_the_field(corpus, tmp_path: Path) -> None:
    write_epochs(corpus, tmp_path, overrides_of_epoch={1: ["model.cnn_module_kernel=5,5,5"]})
    with pytest.raises(SystemExit, match=r"model\.cnn_module_kernel.*epoch-1\.pt|epoch-1\.pt.*model\.cnn_module_kernel"):
        decode(tmp_path, corpus["test"], "--epoch", "2", "--avg", "2", "--use-averaged-model", "false")


def test_missing_checkpoint_for_averaging_names_the_file(exp_dir: Path, corpus) -> None:
    with pytest.raises(SystemExit, match=r"epoch-0\.pt|epoch-3\.pt"):
        decode(exp_dir, corpus["test"], "--epoch", "3", "--avg", "1")
    with pytest.raises(SystemExit, match=r"checkpoint-7\.pt"):
        decode(exp_dir, corpus["test"], "--iter", "7", "--avg", "1")


def test_lexicon_of_another_size_names_vocab_size(exp_dir: Path, corpus, tmp_path: Path) -> None:
    table = "".join(f"{s} {i}\n" for i, s in enumerate(["<blk>", "<sos/eos>", "<unk>", "A", "B"]))
    (tmp_path / "tokens.txt").write_text(table)
    with pytest.raises(SystemExit, match=r"model\.vocab_size"):
        decode(exp_dir, corpus["test"], "--epoch", "2", "--avg", "1", "--lang-dir", str(tmp_path))


def test_empty_test_set_gives_a_message(exp_dir: Path, corpus, capsys) -> None:
    rates = decode(exp_dir, f"nothing={corpus['empty']}", "--epoch", "2", "--avg", "1")
    assert rates == {}
    assert "has no cuts" in capsys.readouterr().out
    assert not list(exp_dir.glob("*-nothing-*"))


def test_missing_test_manifest_and_bad_options_are_named(exp_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cut manifest not found: .*absent.jsonl.gz"):
        decode(exp_dir, tmp_path / "absent.jsonl.gz", "--epoch", "2", "--avg", "1")
    with pytest.raises(SystemExit, match="experiment folder not found"):
        decode(tmp_path / "no-exp", tmp_path / "x.jsonl.gz")
    with pytest.raises(SystemExit):
        decode(exp_dir, tmp_path / "x.jsonl.gz", "--beam-size", "0")


def test_rerun_with_a_token_penalty_decodes_nothing_the_second_time(exp_dir: Path, corpus, capsys) -> None:
    options = ("--epoch", "last", "--avg", "1", "--method", "ctc-prefix-beam-search", "--token-penalty", "0.5")
    first = decode(exp_dir, f"penalty={corpus['test']}", *options)
    key = "ctc-prefix-beam-search_beam-4_token-penalty-0.5"
    assert set(first["penalty"]) == {key}
    recogs = exp_dir / f"recogs-penalty-{key}-epoch-2_avg-1_use-averaged-model.txt"
    written = recogs.stat().st_mtime_ns
    capsys.readouterr()
    second = decode(exp_dir, f"penalty={corpus['test']}", *options)
    assert second == first and recogs.stat().st_mtime_ns == written
    output = capsys.readouterr().out
    assert key in output and "epoch-2_avg-1_use-averaged-model" in output  # 'last' is epoch 2


def test_decode_section_of_the_training_preset_is_used(exp_dir: Path, corpus, tmp_path: Path) -> None:
    preset = tmp_path / "train.yaml"
    preset.write_text(f"model:\n  preset: tiny\ntrain:\n  exp_dir: {exp_dir}\n  lang_dir: {corpus['lang']}\n"
                      "decode:\n  epoch: last\n  avg: 2\n  use_averaged_model: false\n  methods: [ctc-greedy-search]\n")
    rates = main(["--config", str(preset), f"decode.test_cuts=preset={corpus['test']}", "decode.device=cpu"])
    assert set(rates["preset"]) == {"ctc-greedy-search"}
    assert (exp_dir / "wer-summary-preset-epoch-2_avg-2.txt").is_file()


def test_test_set_names_come_from_manifest_names(tmp_path: Path) -> None:
    for name in ("librispeech_cuts_test-clean.jsonl.gz", "other.jsonl"):
        (tmp_path / name).write_text("")
    parsed = parse_test_sets(f"{tmp_path}/librispeech_cuts_test-clean.jsonl.gz, dev={tmp_path}/other.jsonl")
    assert [name for name, _ in parsed] == ["test-clean", "dev"]


def test_an_explicit_epoch_wins_over_the_iteration_the_run_saved(corpus, tmp_path: Path) -> None:
    """A run whose saved decode section names ``iter=last`` (as egs/mini's presets do):
    --epoch 1 and --epoch 2 must decode those epochs, not the saved choice."""
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    write_epochs(corpus, exp_dir, overrides_of_epoch={2: ["decode.iter=last"], 1: ["decode.iter=last"]})
    save_checkpoint(iteration_checkpoint_path(exp_dir, 8), model=CTCModel(run_config(corpus, exp_dir).model),
                    config=run_config(corpus, exp_dir, "decode.iter=last").to_dict(), batch_idx_train=8, epoch=2)
    for epoch in (1, 2):
        decode(exp_dir, corpus["test"], "--epoch", str(epoch), "--avg", "1", "--use-averaged-model", "false",
               "--method", "ctc-greedy-search")
    first = exp_dir / "recogs-valid-ctc-greedy-search-epoch-1_avg-1.txt"
    second = exp_dir / "recogs-valid-ctc-greedy-search-epoch-2_avg-1.txt"
    assert first.is_file() and second.is_file()
    assert not list(exp_dir.glob("recogs-*iter-*"))
    # The two epochs' weights differ (write_epochs moves them), and so do the log-probs decoded.
    weights = [torch.load(exp_dir / f"epoch-{e}.pt", weights_only=False)["model"] for e in (1, 2)]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_two_processes_share_a_test_set_and_write_the_files_of_one(exp_dir: Path, corpus, tmp_path: Path) -> None:
    """Under torchrun each rank decodes every other batch; rank 0 writes recogs, errs and
    summary identical to one process's."""
    options = ["--test-cuts", str(corpus["test"]), "--device", "cpu", "--epoch", "2", "--avg", "1",
               "--use-averaged-model", "false", "--method", "ctc-greedy-search", "ctc-prefix-beam-search",
               "--compute-cer", "false", "--max-duration", "2.2"]  # one cut per batch: three batches
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        shutil.copytree(exp_dir, folder, ignore=shutil.ignore_patterns("log", "*.txt"))
    main(["--exp-dir", str(one), *options])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "asr.decode", "--exp-dir", str(two), *options],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = sorted(path.name for path in one.glob("*.txt"))
    assert len(written) == 5 and sorted(path.name for path in two.glob("*.txt")) == written
    for name in written:
        assert (two / name).read_text() == (one / name).read_text(), name
    rank_1_log = next((two / "log").glob("log-decode-*-rank1")).read_text()
    assert "valid: rank 1 of 2 decoded 1 of the 3 cuts" in rank_1_log
