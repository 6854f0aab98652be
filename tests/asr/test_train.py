"""Specification of asr.train: runs end to end and resumes bit-exactly."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from asr.checkpoint import CheckpointConfigMismatch
from asr.config import load_run_config
from asr.train import NoTrainingBatches, main

@pytest.fixture(scope="module")
def corpus(small_training_corpus) -> Dict[str, Path]:
    return small_training_corpus


def arguments(corpus: Dict[str, Path], exp_dir: Path, *extra: str) -> List[str]:
    return [
        "model.preset=tiny", f"train.exp_dir={exp_dir}", f"train.lang_dir={corpus['lang']}",
        f"data.train_cuts={corpus['train']}", f"data.valid_cuts={corpus['valid']}",
        f"data.musan_cuts={corpus['musan']}", "data.max_duration=4", "data.num_buckets=2",
        "data.num_workers=0", "train.num_epochs=2", "train.save_every_n=2", "train.keep_last_k=0",
        "train.average_period=2", "train.log_interval=1", *extra,
    ]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_weights(first: dict, second: dict) -> None:
    for entry in ("model", "model_avg"):
        for name, tensor in first[entry].items():
            assert torch.equal(tensor, second[entry][name]), f"{entry}.{name} differs"


@pytest.fixture(scope="module")
def uninterrupted(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    exp_dir = tmp_path_factory.mktemp("exp")
    main(arguments(corpus, exp_dir))
    return exp_dir


def test_training_writes_checkpoints_logs_and_tensorboard(uninterrupted: Path) -> None:
    names = {p.name for p in uninterrupted.iterdir()}
    assert {"epoch-1.pt", "epoch-2.pt", "checkpoint-2.pt", "log", "tensorboard"} <= names
    final = load(uninterrupted / "epoch-2.pt")
    assert final["epoch"] == 2 and final["batch_idx_train"] > 2
    assert final["config"]["model"]["vocab_size"] == 29
    assert any((uninterrupted / "tensorboard").iterdir())


def test_checkpoints_record_the_training_losses_the_log_prints(uninterrupted: Path) -> None:
    log = "".join(path.read_text() for path in sorted((uninterrupted / "log").glob("log-train*")))
    printed = [(int(update), float(loss)) for update, loss in
               re.findall(r"\(global (\d+)\): loss ([0-9.]+) per frame", log)]
    final = load(uninterrupted / "epoch-2.pt")
    assert len(printed) == final["batch_idx_train"]  # train.log_interval=1
    recorded = final["train_losses"]
    assert [update for update, _ in recorded] == [update for update, _ in printed]
    assert [round(loss, 4) for _, loss in recorded] == pytest.approx([loss for _, loss in printed], abs=1e-4)
    assert load(uninterrupted / "checkpoint-2.pt")["train_losses"] == recorded[:2]


@pytest.mark.parametrize("resume_argument", ["train.start_batch=2", "train.start_epoch=2"])
def test_resumed_training_matches_uninterrupted_bit_for_bit(
    corpus: Dict[str, Path], uninterrupted: Path, tmp_path: Path, resume_argument: str
) -> None:
    assert load(uninterrupted / "epoch-1.pt")["batch_idx_train"] > 2  # checkpoint-2.pt is mid-epoch
    for name in ("checkpoint-2.pt", "epoch-1.pt"):
        shutil.copy(uninterrupted / name, tmp_path / name)
    main(arguments(corpus, tmp_path, resume_argument, "data.num_workers=1"))
    assert_same_weights(load(uninterrupted / "epoch-2.pt"), load(tmp_path / "epoch-2.pt"))
    assert load(tmp_path / "epoch-2.pt")["train_losses"] == load(uninterrupted / "epoch-2.pt")["train_losses"]


def test_resume_with_another_model_names_the_field(corpus: Dict[str, Path], uninterrupted: Path, tmp_path: Path) -> None:
    shutil.copy(uninterrupted / "checkpoint-2.pt", tmp_path / "checkpoint-2.pt")
    with pytest.raises(CheckpointConfigMismatch, match="model.loss"):
        main(arguments(corpus, tmp_path, "train.start_batch=2", "model.loss=standard"))


@pytest.mark.parametrize("override, cause, max_duration", [
    # The six cuts last 10.2 s in all: no bucket fills a 40 s batch, and drop_last drops the rest.
    ("data.max_duration=40", "kept 6 of 6 cuts, dropped 0 (0 shorter than 1 s", "40"),
    ("data.min_cut_duration=5", "kept 0 of 6 cuts, dropped 6 (6 shorter than 5 s", "4"),
])
def test_an_epoch_without_batches_is_an_error_naming_the_cause(
    corpus: Dict[str, Path], tmp_path: Path, override: str, cause: str, max_duration: str
) -> None:
    with pytest.raises(NoTrainingBatches) as error:
        main(arguments(corpus, tmp_path, override, "train.num_epochs=1"))
    message = str(error.value)
    assert f"data.train_cuts={corpus['train']}" in message and cause in message
    assert f"data.max_duration={max_duration} s" in message
    assert not (tmp_path / "epoch-1.pt").exists()


def test_overrides_are_typed_and_checked() -> None:
    config = load_run_config(None, ["model.preset=tiny", "data.shuffle=false", "optim.base_lr=0.04",
                                    "decode.methods=ctc-greedy-search", "decode.epoch=last", "model.alignment_beam=inf"])
    assert config.data.shuffle is False and config.optim.base_lr == 0.04
    assert config.decode.methods == ("ctc-greedy-search",) and config.model.alignment_beam == float("inf")
    with pytest.raises(ValueError, match="decode.methods: unknown method 'ctc-beam'"):
        load_run_config(None, ["decode.methods=ctc-beam"])
    with pytest.raises(ValueError, match="decode.epoch must be a positive number or 'last'"):
        load_run_config(None, ["decode.epoch=first"])
    with pytest.raises(ValueError, match="unknown train option 'num_epoch'"):
        load_run_config(None, ["train.num_epoch=3"])
    with pytest.raises(ValueError, match="section.*one of"):
        load_run_config(None, ["epochs=3"])
    with pytest.raises(ValueError, match="cannot read data.max_duration='lots' as float"):
        load_run_config(None, ["data.max_duration=lots"])


def test_preset_file_sections_and_overrides(tmp_path: Path) -> None:
    preset = tmp_path / "train.yaml"
    preset.write_text(
        "model:\n  preset: S\n  loss: standard\n"
        "data:\n  max_duration: 300\n  enable_musan: false\n"
        "train:\n  num_epochs: 5\n  precision: bf16\n"
    )
    config = load_run_config(preset, ["model.preset=tiny", "data.max_duration=120", "train.num_epochs=7"])
    assert config.model.loss == "standard" and config.model.encoder_dim == (48, 64, 48)
    assert (config.data.max_duration, config.data.enable_musan) == (120.0, False)
    assert (config.train.num_epochs, config.train.precision) == (7, "bf16")
    (tmp_path / "bad.yaml").write_text("optimizer:\n  lr: 1\n")
    with pytest.raises(ValueError, match="unknown section.*optimizer"):
        load_run_config(tmp_path / "bad.yaml")
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_run_config(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="train.precision must be one of"):
        load_run_config(None, ["train.precision=fp8"])


@pytest.mark.slow
def test_torchrun_with_two_cpu_ranks(corpus: Dict[str, Path], tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", "-m", "asr.train",
               *arguments(corpus, tmp_path, "train.num_epochs=1", "train.precision=bf16")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run(command, check=True, timeout=300, env=env, capture_output=True)
    assert (tmp_path / "epoch-1.pt").is_file()
    assert len(load(tmp_path / "epoch-1.pt")["rng_per_rank"]) == 2


def test_model_vocab_size_is_refused_because_the_lexicon_decides_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model.vocab_size is taken from the lexicon of train.lang_dir"):
        load_run_config(None, ["model.vocab_size=500"])
    preset = tmp_path / "train.yaml"
    preset.write_text("model:\n  preset: tiny\n  blank_id: 3\n")
    with pytest.raises(ValueError, match=f"model.blank_id is taken from the lexicon.*{preset}"):
        load_run_config(preset)
    with pytest.raises(ValueError, match="unknown model family 'conformer'"):
        load_run_config(None, ["family=conformer"])


def test_rerun_resumes_from_the_newest_checkpoint_and_then_says_finished(
    corpus: Dict[str, Path], uninterrupted: Path, tmp_path: Path, capsys
) -> None:
    shutil.copy(uninterrupted / "checkpoint-2.pt", tmp_path / "checkpoint-2.pt")
    main(arguments(corpus, tmp_path, "data.num_workers=1"))
    assert_same_weights(load(uninterrupted / "epoch-2.pt"), load(tmp_path / "epoch-2.pt"))
    before = (tmp_path / "epoch-2.pt").stat().st_mtime_ns
    main(arguments(corpus, tmp_path))
    assert "epoch-2.pt exists: already finished" in capsys.readouterr().out
    assert (tmp_path / "epoch-2.pt").stat().st_mtime_ns == before


def test_a_finished_run_of_another_configuration_is_refused_by_field(
    corpus: Dict[str, Path], uninterrupted: Path, tmp_path: Path, capsys
) -> None:
    """A preset changed since the run finished: the rerun names the field instead of calling
    the old model finished; fields its checkpoint predates count as their defaults."""
    shutil.copy(uninterrupted / "epoch-2.pt", tmp_path / "epoch-2.pt")
    with pytest.raises(SystemExit, match=r"field 'data.concatenate_probability' is 1.0 in the checkpoint "
                                         r"but 0.5 in this run.*move .* aside"):
        main(arguments(corpus, tmp_path, "data.concatenate_seconds=4", "data.concatenate_probability=0.5"))
    # Fields the resume may change do not count.
    main(arguments(corpus, tmp_path, "train.log_interval=5", "data.num_workers=1"))
    assert "epoch-2.pt exists: already finished" in capsys.readouterr().out
    # A checkpoint written before data.concatenate_gap_probability existed: its default.
    checkpoint = load(tmp_path / "epoch-2.pt")
    del checkpoint["config"]["data"]["concatenate_gap_probability"]
    torch.save(checkpoint, tmp_path / "epoch-2.pt")
    main(arguments(corpus, tmp_path))
    assert "epoch-2.pt exists: already finished" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"field 'data.concatenate_gap_probability' is 1.0 in the checkpoint"):
        main(arguments(corpus, tmp_path, "data.concatenate_gap_probability=0.5"))


def test_schedules_follow_icefalls_duration_adjusted_batch_count() -> None:
    """icefall's get_adjusted_batch_count: batch_idx * max_duration * world_size / 600 s."""
    from asr.trainee import schedule_units_per_batch

    config = load_run_config(None, ["data.max_duration=1400"])
    assert schedule_units_per_batch(config, world_size=2) * 300 == 300 * 1400 * 2 / 600
    config = load_run_config(None, ["data.max_duration=40", "train.schedule_ref_duration=40"])
    assert schedule_units_per_batch(config, world_size=1) == 1
    # Ranks that share each batch advance the schedules as one process with that batch.
    config = load_run_config(None, ["data.max_duration=40", "train.schedule_ref_duration=40",
                                    "data.batch_across_ranks=true"])
    assert schedule_units_per_batch(config, world_size=2) == schedule_units_per_batch(config, world_size=1) == 1
    with pytest.raises(ValueError, match="schedule_ref_duration must be > 0 seconds, got 0"):
        load_run_config(None, ["train.schedule_ref_duration=0"])


def test_a_run_ended_by_max_batches_is_finished_on_rerun(corpus: Dict[str, Path], tmp_path: Path, capsys) -> None:
    main(arguments(corpus, tmp_path, "train.max_batches=3", "train.save_every_n=0"))
    assert load(tmp_path / "checkpoint-3.pt")["batch_idx_train"] == 3
    # Stopped inside the first epoch with no validation interval reached: the log says so
    # instead of an infinite best validation loss.
    log = "".join(path.read_text() for path in (tmp_path / "log").glob("log-train*"))
    assert "done: 3 batches; no validation ran" in log and "best validation loss inf" not in log
    capsys.readouterr()
    main(arguments(corpus, tmp_path, "train.max_batches=3", "train.save_every_n=0"))
    assert "checkpoint-3.pt exists: already finished" in capsys.readouterr().out
    assert load(tmp_path / "checkpoint-3.pt")["batch_idx_train"] == 3
    assert not (tmp_path / "checkpoint-4.pt").exists()


@pytest.fixture(scope="module")
def accumulated(corpus: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two microbatches per update (train.accum_grad=2); checkpoints every update."""
    exp_dir = tmp_path_factory.mktemp("exp_accum")
    main(arguments(corpus, exp_dir, "train.accum_grad=2", "train.save_every_n=1"))
    return exp_dir


def test_accumulated_training_counts_optimizer_updates(accumulated: Path) -> None:
    first, final = load(accumulated / "epoch-1.pt"), load(accumulated / "epoch-2.pt")
    microbatches = first["batches_per_epoch"]
    assert microbatches >= 3 and microbatches % 2 == 1  # the epoch's last update has one microbatch
    # An epoch of B microbatches makes ceil(B / 2) updates: the last takes what is left.
    assert first["batch_idx_train"] == (microbatches + 1) // 2
    assert final["batch_idx_train"] == first["batch_idx_train"] + (final["batches_per_epoch"] + 1) // 2
    checkpoint = load(accumulated / "checkpoint-1.pt")
    assert (checkpoint["batch_idx_train"], checkpoint["batch_in_epoch"]) == (1, 2)  # between updates
    assert checkpoint["scheduler"]["batch"] == 1


def test_accumulated_training_resumes_bit_for_bit_mid_epoch(
    corpus: Dict[str, Path], accumulated: Path, tmp_path: Path
) -> None:
    shutil.copy(accumulated / "checkpoint-1.pt", tmp_path / "checkpoint-1.pt")
    main(arguments(corpus, tmp_path, "train.accum_grad=2", "train.save_every_n=1", "train.start_batch=1"))
    assert_same_weights(load(accumulated / "epoch-2.pt"), load(tmp_path / "epoch-2.pt"))


def test_accum_grad_below_one_is_refused_by_name() -> None:
    for value in ("0", "-2"):
        with pytest.raises(ValueError, match=f"train.accum_grad must be >= 1, got {value}"):
            load_run_config(None, [f"train.accum_grad={value}"])


def test_virtual_ranks_below_one_are_refused_by_name() -> None:
    for value in ("0", "-1"):
        with pytest.raises(ValueError, match=f"train.virtual_ranks must be >= 1, got {value}"):
            load_run_config(None, [f"train.virtual_ranks={value}"])


def test_a_process_of_virtual_ranks_weights_and_schedules_as_that_many_ranks() -> None:
    """train.virtual_ranks = 3 in one process: the gradients' sum times 1/3 (DDP's average
    over three ranks) and the schedules advance by three ranks' audio per update."""
    from asr.trainee import build_trainee

    config = load_run_config(None, ["model.preset=tiny", "data.max_duration=100", "train.virtual_ranks=3",
                                    "train.accum_grad=2"])
    trainee = build_trainee(config, torch.device("cpu"), 40, 0)
    assert trainee.gradient_weight == 1 / 3
    assert trainee.schedule_units_per_batch == 100 * 3 * 2 / 600
    plain = build_trainee(load_run_config(None, ["model.preset=tiny"]), torch.device("cpu"), 40, 0)
    assert plain.gradient_weight == 1.0


def test_the_schedules_advance_by_the_audio_of_every_accumulated_microbatch() -> None:
    from asr.trainee import schedule_units_per_batch

    config = load_run_config(None, ["data.max_duration=100", "train.accum_grad=2"])
    assert schedule_units_per_batch(config, world_size=8) == 100 * 8 * 2 / 600


def test_init_from_starts_the_run_from_another_runs_weights(corpus: Dict[str, Path], uninterrupted: Path,
                                                            tmp_path: Path) -> None:
    """train.init_from: the first update starts from the named checkpoint's model (a
    learning rate of 1e-30 leaves it there), here for a Zipformer trained on chunk
    windows (model.streaming) from a whole-utterance one."""
    source = load(uninterrupted / "epoch-2.pt")["model"]
    main(arguments(corpus, tmp_path / "init", f"train.init_from={uninterrupted / 'epoch-2.pt'}", "model.streaming=true",
                   "model.streaming_max_history=1", "optim.base_lr=1e-30", "train.max_batches=1"))
    started = load(tmp_path / "init" / "checkpoint-1.pt")
    assert started["config"]["data"]["feature_chunk_seconds"] == 2
    for name, tensor in source.items():
        torch.testing.assert_close(started["model"][name], tensor, rtol=1e-6, atol=1e-6)
    main(arguments(corpus, tmp_path / "random", "optim.base_lr=1e-30", "train.max_batches=1"))
    fresh = load(tmp_path / "random" / "checkpoint-1.pt")["model"]
    assert any(not torch.allclose(fresh[name], tensor) for name, tensor in source.items())


def test_trained_stacks_fine_tune_moves_only_the_top_stacks_and_the_head(corpus: Dict[str, Path], uninterrupted: Path,
                                                                          tmp_path: Path) -> None:
    """model.trained_stacks through asr.train: the frozen front end and stacks, and their
    averaged copies, leave the run as they came in; the top stack and the head move."""
    source = load(uninterrupted / "epoch-2.pt")["model"]
    main(arguments(corpus, tmp_path / "top", f"train.init_from={uninterrupted / 'epoch-2.pt'}",
                   "model.trained_stacks=1", "train.max_batches=2"))
    checkpoint = load(tmp_path / "top" / "checkpoint-2.pt")
    stacks = checkpoint["config"]["model"]["num_encoder_layers"]
    frozen = ("encoder.encoder_embed.",) + tuple(f"encoder.stacks.{i}." for i in range(len(stacks) - 1))
    moved = set()
    for entry in ("model", "model_avg"):
        for name, tensor in checkpoint[entry].items():
            if name.startswith(frozen):
                assert torch.equal(tensor, source[name]), (entry, name)
            elif tensor.is_floating_point() and not torch.equal(tensor, source[name]):
                moved.add(name)
    assert "head.weight" in moved and any(name.startswith(f"encoder.stacks.{len(stacks) - 1}.") for name in moved)


@pytest.mark.parametrize("make, message", [
    (lambda folder: folder / "missing.pt", "train.init_from: checkpoint not found"),
    (lambda folder: torch.save({"epoch": 1}, folder / "no_model.pt") or folder / "no_model.pt",
     "has no 'model' entry"),
    (lambda folder: torch.save({"model": {"head.weight": torch.zeros(3, 3)}}, folder / "other.pt") or folder / "other.pt",
     "train.init_from: the weights of .*other.pt do not fit this model"),
])
def test_init_from_errors_name_the_option_and_the_file(corpus: Dict[str, Path], tmp_path: Path, make,
                                                       message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(SystemExit, match=message):
        main(arguments(corpus, tmp_path / "exp", f"train.init_from={path}", "train.max_batches=1"))
    assert not (tmp_path / "exp").exists()


def test_a_run_whose_start_changed_is_neither_resumed_nor_called_finished(corpus: Dict[str, Path],
                                                                          uninterrupted: Path, tmp_path: Path,
                                                                          capsys) -> None:
    """Checkpoints record the digest of train.init_from's weights: the same weights written
    again (another export) still match; other weights at the same path (the stage before
    trained again) stop a rerun, whether the run finished or was cut short, naming the
    option, the file and the checkpoint."""
    from asr.trainee import weights_digest

    start = tmp_path / "start.pt"
    torch.save({"model": load(uninterrupted / "epoch-2.pt")["model"]}, start)
    run = arguments(corpus, tmp_path / "exp", f"train.init_from={start}", "train.max_batches=2", "train.save_every_n=1")
    main(run)
    assert load(tmp_path / "exp" / "checkpoint-2.pt")["init_from_digest"] == weights_digest(load(start)["model"])
    torch.save({"model": dict(load(start)["model"]), "note": "exported again"}, start)
    capsys.readouterr()
    main(run)
    assert "checkpoint-2.pt exists: already finished" in capsys.readouterr().out
    moved = {name: tensor + 1 if tensor.is_floating_point() else tensor for name, tensor in load(start)["model"].items()}
    torch.save({"model": moved}, start)
    with pytest.raises(SystemExit, match=r"train.init_from: the weights of .*start\.pt are not those "
                                         r".*checkpoint-2\.pt was trained from .*move .*exp aside"):
        main(run)
    (tmp_path / "exp" / "checkpoint-2.pt").unlink()  # cut short after its first update
    with pytest.raises(SystemExit, match=r"are not those .*checkpoint-1\.pt was trained from"):
        main(run)
    assert not (tmp_path / "exp" / "checkpoint-2.pt").exists()
