"""What every corpus recipe's training stages (10-12: train, decode, summarize) must do,
checked on a tiny model trained through run.sh on the corpus's miniature copy. Each
corpus's test file (tests/egs/test_<corpus>_recipe.py) subclasses ``TrainedRecipeChecks``
with its own module-scoped ``trained`` fixture, trained on the data its data-stage tests
prepared: one data preparation per corpus, and the three trainings in three files, which
make test's pytest-xdist workers share (``--dist loadfile``).

Scores are checked against references computed here: WER/CER recomputed with kaldialign
from the recogs- files, references compared with the corpus transcripts.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

# A few seconds of CPU per epoch: tiny model, FP32, two batches an epoch.
TINY = (
    "model.preset=tiny train.num_epochs=2 train.device=cpu train.precision=fp32 train.tensorboard=false "
    "train.average_period=1 train.log_interval=1 data.num_workers=0 data.max_duration=60 data.num_buckets=2"
)
METHOD_KEYS = ("ctc-prefix-beam-search_beam-4", "ctc-greedy-search")
SUFFIX = "epoch-2_avg-1_use-averaged-model"
EXP = "exp/zipformer_pruned_ctc"
# GigaSpeech's official scoring rules (SpeechColab/GigaSpeech utils/gigaspeech_scoring.py),
# written out here as the reference.
GIGASPEECH_DROPPED = {
    "UH", "UHH", "UM", "EH", "MM", "HM", "AH", "HUH", "HA", "ER", "OOF", "HEE", "ACH", "EEE", "EW",
    "<UNK>", "<COMMA>", "<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>", "<SIL>", "<NOISE>", "<MUSIC>", "<OTHER>",
}

# Each corpus's data options of run.sh and its training overrides beyond TINY.
DATA_OPTIONS = {
    "librispeech": ("--parts", "train-clean-100 dev-clean test-clean", "--train-parts", "train-clean-100"),
    "gigaspeech": ("--xl-chunk-size", "2"),
    "aishell": (),
}
OVERRIDES = {
    "librispeech": TINY,
    "gigaspeech": TINY + " data.max_duration=15",  # its 12 training segments last about 40 s
    "aishell": TINY,
}
SETS = {"librispeech": ["test-clean"], "gigaspeech": ["dev", "test"], "aishell": ["dev", "test"]}
TRAINING = ("--stage", "10", "--stop-stage", "12", "--decode-args", "decode.avg=1", "--train-args")


def training_copy(recipe_copy, prepared: Path, corpus: str) -> Path:
    """A new copy of the corpus recipe that reads the data stages' outputs of ``prepared``
    (its data/ and download/ linked, read only), so each training starts from no exp/."""
    recipe = recipe_copy(corpus)
    for folder in ("data", "download"):
        if (recipe / folder).exists():
            (recipe / folder).rmdir()
        (recipe / folder).symlink_to(prepared / folder)
    return recipe


def train(run_recipe, recipe: Path, corpus: str, extra: str = "", check: bool = True):
    """Stages 10-12 of the corpus recipe with the tiny settings (and ``extra`` overrides)."""
    return run_recipe(recipe, *DATA_OPTIONS[corpus], *TRAINING, OVERRIDES[corpus] + extra, check=check)


def trained_recipe(recipe_copy, run_recipe, prepared: Path, corpus: str, stopped_first: bool = False) -> dict:
    """Stages 10-12 in a training copy of ``prepared``: what ``TrainedRecipeChecks`` reads,
    and with ``stopped_first`` also "stopped", a first run stopped after one batch (as if
    killed), from whose checkpoint the finished run resumed."""
    recipe = training_copy(recipe_copy, prepared, corpus)
    trained = {"corpus": corpus, "recipe": recipe, "sets": SETS[corpus], "cer": corpus == "aishell"}
    if stopped_first:
        trained["stopped"] = train(run_recipe, recipe, corpus, " train.max_batches=1", check=False)
    trained["finished"] = train(run_recipe, recipe, corpus)
    return trained


def manifest_of_test_set(trained: dict, name: str) -> Path:
    """The features manifest of the test set ``name``."""
    corpus = trained["corpus"]
    stem = {"librispeech": f"librispeech_cuts_{name}", "gigaspeech": f"gigaspeech_cuts_{name.upper()}",
            "aishell": f"aishell_cuts_{name}"}[corpus]
    return trained["recipe"] / "data/fbank" / f"{stem}.jsonl.gz"


def read_recogs(path: Path) -> Dict[str, Tuple[List[str], List[str]]]:
    """cut id -> (ref, hyp) from an icefall recogs- file."""
    pairs: Dict[str, Dict[str, List[str]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cut_id, _, rest = line.partition(":\t")
        side, _, words = rest.partition("=")
        pairs.setdefault(cut_id, {})[side] = ast.literal_eval(words)
    return {cut_id: (sides["ref"], sides["hyp"]) for cut_id, sides in pairs.items()}


def read_summary(path: Path) -> Dict[str, float]:
    lines = path.read_text().splitlines()
    assert lines[0] == "settings\tWER"
    return {key: float(value) for key, value in (line.split("\t") for line in lines[1:])}


def expected_reference(trained: dict, text: str) -> List[str]:
    if trained["corpus"] == "gigaspeech":
        return [w for w in text.upper().replace("-", " ").split() if w not in GIGASPEECH_DROPPED]
    if trained["cer"]:
        return [c for c in text if not c.isspace()]
    return text.split()


def printed_rates(stdout: str) -> Dict[str, Dict[str, float]]:
    """test set -> setting -> rate from the last error-rate table asr.decode printed."""
    lines = stdout.splitlines()
    header = max(i for i, line in enumerate(lines) if f"(%) of {EXP}, {SUFFIX}:" in line)
    rates: Dict[str, Dict[str, float]] = {}
    for line in lines[header + 1:]:
        match = re.fullmatch(r"  (\S+)\s+(\S+)\s+([\d.]+)", line)
        if match is None:
            break
        rates.setdefault(match.group(1), {})[match.group(2)] = float(match.group(3))
    return rates


def without_logs(files: dict) -> dict:
    """A snapshot without the decoder's log files (each run logs, even when it skips)."""
    return {path: value for path, value in files.items() if "/log/" not in path}


class TrainedRecipeChecks:
    """The checks of stages 10-12 on one corpus; a subclass's module provides ``trained``:
    {"corpus", "recipe", "finished" (the run's CompletedProcess), "sets", "cer"}."""

    def test_training_writes_every_epoch_checkpoint_with_the_presets_settings_and_the_recipes_paths(self, trained):
        import torch

        from asr.config import load_run_config

        exp = trained["recipe"] / EXP
        preset = load_run_config(trained["recipe"] / "conf/train.yaml")
        batches = []
        for epoch in (1, 2):
            checkpoint = torch.load(exp / f"epoch-{epoch}.pt", map_location="cpu", weights_only=False)
            config = checkpoint["config"]
            assert checkpoint["epoch"] == epoch and set(checkpoint["model"]) == set(checkpoint["model_avg"])
            batches.append(checkpoint["batch_idx_train"])
            # Hyper-parameters come from conf/train.yaml unless overridden on the command line.
            assert config["optim"]["base_lr"] == preset.optim.base_lr == 0.045
            assert config["optim"]["lr_epochs"] == preset.optim.lr_epochs
            assert config["data"]["spec_aug_time_warp_factor"] == preset.data.spec_aug_time_warp_factor
            assert config["data"]["min_cut_duration"] == preset.data.min_cut_duration
            # Chunk size and alignment beam: pruned_ctc's own defaults (paper Sec. 5.2: beam 100, chunk 4096).
            assert (config["model"]["loss"], config["model"]["alignment_beam"], config["model"]["chunk_size"]) == (
                "pruned", None, None)
            assert config["data"]["max_duration"] == (15.0 if trained["corpus"] == "gigaspeech" else 60.0)
            assert config["model"]["num_encoder_layers"] != [2, 2, 3, 4, 3, 2]  # tiny, not M
        assert 0 < batches[0] < batches[1]
        train_cuts = config["data"]["train_cuts"]
        expected_train = {
            "librispeech": "data/fbank/librispeech_cuts_train-clean-100.jsonl.gz",
            "gigaspeech": "data/fbank/gigaspeech_XL_split/gigaspeech_cuts_XL.[0-9]*.jsonl.gz",
            "aishell": "data/fbank/aishell_cuts_train.jsonl.gz",
        }[trained["corpus"]]
        assert train_cuts == expected_train
        lang = "data/lang_char" if trained["cer"] else "data/lang_bpe_500"
        assert config["train"]["lang_dir"] == lang
        tokens = (trained["recipe"] / lang / "tokens.txt").read_text(encoding="utf-8").splitlines()
        assert config["model"]["vocab_size"] == len(tokens)

    def test_scores_in_the_files_are_recomputed_from_the_recogs(self, trained):
        import kaldialign
        from lhotse import load_manifest

        exp = trained["recipe"] / EXP
        for name in trained["sets"]:
            summary = read_summary(exp / f"wer-summary-{name}-{SUFFIX}.txt")
            assert set(summary) == set(METHOD_KEYS)
            texts = {c.id: c.supervisions[0].text for c in load_manifest(manifest_of_test_set(trained, name))}
            for key in METHOD_KEYS:
                recogs = read_recogs(exp / f"recogs-{name}-{key}-{SUFFIX}.txt")
                assert set(recogs) == set(texts)
                errors = reference_length = 0
                for cut_id, (ref, hyp) in recogs.items():
                    assert ref == expected_reference(trained, texts[cut_id])
                    errors += kaldialign.edit_distance(ref, hyp)["total"]
                    reference_length += len(ref)
                rate = 100.0 * errors / reference_length
                assert summary[key] == pytest.approx(rate, abs=0.005)
                errs = (exp / f"errs-{name}-{key}-{SUFFIX}.txt").read_text(encoding="utf-8")
                assert f"%WER = {rate:.2f}" in errs.splitlines()[0]

    def test_the_summary_prints_every_test_set_and_method(self, trained):
        stdout = trained["finished"].stdout
        unit = "CER" if trained["cer"] else "WER"
        assert f"{unit} (%) of {EXP}, {SUFFIX}:" in stdout[stdout.index("Stage 12:"):]
        exp = trained["recipe"] / EXP
        rates = printed_rates(stdout)
        assert set(rates) == set(trained["sets"])
        for name, values in rates.items():
            assert values == read_summary(exp / f"wer-summary-{name}-{SUFFIX}.txt")

    def test_a_rerun_skips_training_and_decoding_and_changes_nothing(self, trained, run_recipe, snapshot):
        recipe = trained["recipe"]
        before = snapshot(recipe / "exp")
        began = time.time()
        result = train(run_recipe, recipe, trained["corpus"])
        assert time.time() - began < 60.0
        assert without_logs(snapshot(recipe / "exp")) == without_logs(before)
        assert f"training: {EXP}/epoch-2.pt exists: already finished" in result.stdout
        for name in trained["sets"]:
            assert f"{name}: decoded already (wer-summary-{name}-{SUFFIX}.txt), skipping" in result.stdout
        assert printed_rates(result.stdout) == printed_rates(trained["finished"].stdout)
