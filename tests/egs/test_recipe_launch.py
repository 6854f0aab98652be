"""How the recipes' run.sh launch their programs, without training anything: a stand-in
python on PATH records each command line (torchrun for GPUs, CPU processes and nodes;
egs/mini's stages 10 and 11 and their options), bad options and stages run out of order
are errors that name what is wrong, and the presets and defaults are the paper's. The
trainings themselves: tests/egs/test_<corpus>_training_stages.py.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from references.recipe_training import EXP

# egs/mini's default --streaming-lookahead (0.32 s) names the folders of its streaming
# models and of every model on its window encoder; --streaming-lookahead 0 leaves them plain.
LA = "_lookahead0.32"

CORPORA = ("librispeech", "gigaspeech", "aishell")


# --- How training is launched (a stand-in python records torchrun's command line) ----------

FAKE_PYTHON = """#!/usr/bin/env bash
# Stand-in for python: reports {gpus} CUDA devices and records launcher command lines.
case "$*" in
  *torch.cuda.device_count*) echo {gpus}; exit 0 ;;
  "-m torch.distributed.run "*|"-m asr.train "*) echo "$*" >> "{record}"; exit 0 ;;
esac
exec "{real}" "$@"
"""


def _launch(recipe_copy, tmp_path, gpus: int, *options: str):
    """Stage 10 of a fresh AISHELL recipe copy with the stand-in python first on PATH."""
    recipe = recipe_copy("aishell")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "launches.txt"
    fake = bin_dir / "python"
    fake.write_text(FAKE_PYTHON.format(gpus=gpus, record=record, real=sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "10", "--stop-stage", "10", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    launches = record.read_text().splitlines() if record.exists() else []
    return result, [shlex.split(line) for line in launches]


def test_several_gpus_train_through_torchrun_with_one_process_each(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 4, "--num-gpus", "4")
    assert len(launches) == 1
    command = launches[0]
    assert command[:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m"]
    assert command[6:9] == ["asr.train", "--config", "conf/train.yaml"]
    assert "training on 4 GPUs" in result.stdout


def test_cpu_processes_train_through_torchrun_on_the_cpu(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 0, "--cpu-processes", "2", "--train-args", "train.device=auto")
    assert len(launches) == 1
    command = launches[0]
    assert command[:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    # The ranks share each batch: the preset's updates, as one process would train them.
    assert command[6:11] == ["asr.train", "--config", "conf/train.yaml", "train.device=cpu",
                             "data.batch_across_ranks=true"]
    assert command[-1] == "train.device=auto"  # the user's override still comes last
    assert "training in 2 CPU processes" in result.stdout and "each draws 1/2 of every batch" in result.stdout


MINI_STAGE_10_PYTHON = """#!/usr/bin/env bash
# Stand-in for python: every program of stages 10 and 11 recorded, not run.
case "$*" in
  *torch.cuda.device_count*) echo 0; exit 0 ;;
  "-m "*) line=$(printf '%q ' "$@"); echo "$line" >> "{record}"; exit 0 ;;  # quoted, as shlex reads it
esac
exec "{real}" "$@"
"""


def recorded_mini_programs(recipe: Path, tmp_path: Path, cores: int, inputs) -> tuple:
    """(environment, record file) under which egs/mini's run.sh records its programs instead
    of running them, on a machine of ``cores`` cores, with empty files at ``inputs``."""
    for path in inputs:
        (recipe / path).parent.mkdir(parents=True, exist_ok=True)
        (recipe / path).write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "launches.txt"
    (bin_dir / "python").write_text(MINI_STAGE_10_PYTHON.format(record=record, real=sys.executable))
    (bin_dir / "getconf").write_text(f"#!/usr/bin/env bash\necho {cores}\n")
    for program in bin_dir.iterdir():
        program.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    return env, record


def recorded_launches(recipe: Path, env: dict, record: Path, *options: str) -> list:
    """Run egs/mini's run.sh with ``options`` under :func:`recorded_mini_programs`'s
    environment; it must succeed. The programs it launched, each split into its words."""
    result = subprocess.run(["bash", str(recipe / "run.sh"), *options], cwd=recipe, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return [shlex.split(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("cores, options, processes", [
    (2, (), 2), (1, (), 1), (2, ("--cpu-processes", "1"), 1), (2, ("--cpu-processes", "3"), 3),
])
def test_mini_stage_10_trains_in_two_cpu_processes_sharing_each_batch(recipe_copy, tmp_path, cores, options,
                                                                      processes):
    """egs/mini: stages 4 and 8 train in one process unless --cpu-processes says otherwise;
    stage 10's two trainings and its decodes in two processes on a machine of two cores or
    more; in one process its trainings train as two ranks (train.virtual_ranks=2)."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, cores,
                                         ("exp/full_pruned_ctc/decoding.pt", "exp/full_llm_ctc/checkpoint-1200.pt"))
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "10", "--stop-stage", "10", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    trainings = [command for command in launches if "asr.train" in command]
    assert [command[command.index("--config") + 1] for command in trainings] == \
        ["conf/train_streaming.yaml", "conf/llm_ctc.yaml"]
    for command in trainings:
        if processes == 1:
            assert command[:3] == ["-m", "asr.train", "--config"]
            assert command[4:6] == ["data.batch_across_ranks=true", "train.virtual_ranks=2"]
        else:
            assert command[:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                   str(processes), "-m"]
            assert command[9:11] == ["train.device=cpu", "data.batch_across_ranks=true"]
    # Its decodes (the encoder's windows, then the LLM's sentences, recordings, and the
    # sentences after 0.5 s of silence) share the test sets.
    decodes = [command for command in launches if "asr.decode" in command]
    assert len(decodes) == 4
    test_sets = [next(a for a in command if a.startswith("decode.test_cuts=")).split("=", 1)[1] for command in decodes]
    fbank = "data/full/fbank/librispeech_cuts_"
    sentences = f"dev-clean={fbank}dev-clean.jsonl.gz,test-clean={fbank}test-clean.jsonl.gz"
    assert test_sets == [f"test-clean={fbank}test-clean.jsonl.gz",  # the encoder's windows
                         sentences,  # Tables 9, 5
                         "test-clean-long=data/full/test_long/cuts.jsonl.gz,"  # back to back, and with pauses
                         "test-clean-long-pauses=data/full/test_long_pauses/cuts.jsonl.gz",
                         sentences]  # the start of a stream
    assert "decode.lead_padding_seconds=0.5" in decodes[3] and \
        not any("lead_padding" in a for command in decodes[:3] for a in command)
    joins = [command for command in launches if "local.join_utterances" in command]
    assert [command[command.index("local.join_utterances") + 2:] for command in joins] == \
        [["data/full/test_long"], ["data/full/test_long_pauses", "--gap-seconds", "0.3"]]
    for command in decodes:
        launcher = ["-m", "asr.decode"] if processes == 1 else \
            ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes), "-m", "asr.decode"]
        assert command[:len(launcher)] == launcher and ("decode.device=cpu" in command) == (processes > 1)
    # The LLM step trains the encoder's top stacks; its decodes and latency run build the
    # same model, or the checkpoint's encoder weights would not fit it.
    latency = [command for command in launches if "llm_ctc.streaming.latency" in command]
    for command in [trainings[1], *decodes[1:], *latency]:
        assert {"model.encoder_lr_scale=0.1", "model.encoder_trained_blocks=3"} <= set(command), command
    assert len(latency) == 1 and not any("encoder_trained_blocks" in a for a in trainings[0] + decodes[0])
    # The LLM step's folder is read for a stall right after it trains (not the window step's).
    [stall] = [command for command in launches if "local.training_stall" in command]
    assert launches.index(stall) == launches.index(trainings[1]) + 1
    # A stall there trains it again with the seed above the run's own (the stand-in reported none).
    assert stall[2:] == [f"exp/full_llm_ctc_streaming{LA}", "--max-loss", "0.08", "--stalled-status", "3",
                         "--remedy", "It trains again with the next seed (train.seed=43)."]
    assert not (recipe / f"exp/full_llm_ctc_streaming{LA}_stalled").exists()
    # Stage 4 keeps one process by default.
    record.unlink()
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "4", "--stop-stage", "4", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    [stage_4] = [shlex.split(line) for line in record.read_text().splitlines()]
    stage_4_processes = processes if options else 1
    assert stage_4[:2] == (["-m", "asr.train"] if stage_4_processes == 1 else ["-m", "torch.distributed.run"]), \
        result.stdout + result.stderr
    assert not any(argument.startswith("train.virtual_ranks") for argument in stage_4)


MINI_STAGE_7_PYTHON = """#!/usr/bin/env bash
# Stand-in for python: every program recorded with its OMP_NUM_THREADS, not run.
case "$*" in
  *torch.cuda.device_count*) echo 0; exit 0 ;;
  # One write per line: stage 7's window step (in the background) and its LM record at once.
  "-m "*) line=$(printf '%q ' "OMP_NUM_THREADS=${{OMP_NUM_THREADS:-}}" "$@"); echo "$line" >> "{record}"; exit 0 ;;
esac
exec "{real}" "$@"
"""


def launched_program(command: list) -> str:
    """The module a recorded launch runs: asr.train, also under torchrun."""
    return command[len(command) - 1 - command[::-1].index("-m") + 1]


@pytest.mark.parametrize("cores, options, processes", [
    (2, (), 2), (1, (), 0), (2, ("--streaming-lookahead", "0"), 2), (2, ("--cpu-processes", "1"), 1),
])
def test_mini_stage_7_trains_stage_10s_encoder_beside_the_tiny_lm(recipe_copy, tmp_path, cores, options, processes):
    """egs/mini stage 7 on two cores or more: stage 10's chunk-window encoder beside the
    tiny LM's one thread, in stage 10's processes of one thread each (two by default), with
    the very command that stage 10 gives it (which then finds it finished); on one core,
    stage 10 trains it."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, cores,
                                         ("exp/full_pruned_ctc/decoding.pt", "exp/full_llm_ctc/checkpoint-1200.pt"))
    (tmp_path / "bin" / "python").write_text(MINI_STAGE_7_PYTHON.format(record=record, real=sys.executable))
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "7", "--stop-stage", "7", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    programs = sorted(launched_program(command) for command in launches)
    expected = ["local.export_decoding_weights", "local.pretrain_tiny_lm"] + (["asr.train"] if processes else [])
    assert programs == sorted(expected), launches
    assert launched_program(launches[0]) == "local.export_decoding_weights"  # the window step's start
    lm = next(command for command in launches if launched_program(command) == "local.pretrain_tiny_lm")
    assert lm[lm.index("--threads") + 1] == "1"
    if not processes:
        return
    [window_step] = [command for command in launches if launched_program(command) == "asr.train"]
    assert window_step[0] == "OMP_NUM_THREADS=1"
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    assert window_step[1:window_step.index("asr.train") - 1] == (torchrun if processes > 1 else [])
    assert ("train.virtual_ranks=2" in window_step) == (processes == 1)  # two ranks in one process
    folder = "exp/full_pruned_ctc_streaming" + ("" if "--streaming-lookahead" in options else LA)
    assert "beside the tiny LM" in result.stdout and f"{folder}/log/" in result.stdout
    assert f"in {processes} process(es) of one thread" in result.stdout
    # Stage 10 with the same options launches the same training.
    record.unlink()
    (tmp_path / "bin" / "python").write_text(MINI_STAGE_10_PYTHON.format(record=record, real=sys.executable))
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "10", "--stop-stage", "10", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    stage_10_window_step = next(shlex.split(line) for line in record.read_text().splitlines()
                                if "conf/train_streaming.yaml" in line)
    assert window_step[1:] == stage_10_window_step
    assert f"train.exp_dir={folder}" in window_step and "train.init_from=exp/full_pruned_ctc/decoding.pt" in window_step
    assert ("model.streaming_lookahead_seconds=0.32" in window_step) == ("--streaming-lookahead" not in options)
    assert any(a.startswith("model.streaming_lookahead_seconds=") for a in window_step) == \
        ("--streaming-lookahead" not in options)


@pytest.mark.parametrize("options, checked", [((), True), (("--llm-config", "conf/llm_ce.yaml"), False),
                                              (("--train-args", "train.exp_dir=exp/mine train.seed=44"), True)])
def test_mini_stage_8_checks_its_tiny_llm_ctc_run_for_a_stall(recipe_copy, tmp_path, options, checked):
    """egs/mini stage 8: after LLM-CTC on the tiny LM trains, local.training_stall reads its
    folder (the one training wrote) at the threshold between the runs that learned and those
    that stalled; the LLM-CE preset, with its own loss, is not checked."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ("exp/full_pruned_ctc/decoding.pt",))
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "8", "--stop-stage", "8", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    assert [command[1] for command in launches] == ["asr.train", "local.training_stall"][:1 + checked]
    if checked:
        folder = [a.split("=", 1)[1] for a in launches[0] if a.startswith("train.exp_dir=")][-1]  # the last wins
        assert folder == ("exp/mine" if "--train-args" in options else "exp/full_llm_ctc")
        check = launches[1]
        assert check[2:7] == [folder, "--max-loss", "0.16", "--stalled-status", "3"]
        next_seed = 45 if "--train-args" in options else 43
        assert check[7:] == ["--remedy", f"It trains again with the next seed (train.seed={next_seed})."]
        assert not (recipe / f"{folder}_stalled").exists()  # the stand-in reported no stall


def test_mini_stall_thresholds_stage_8_and_the_llm_steps_of_stages_10_and_11(recipe_copy, tmp_path):
    """egs/mini, stages 8-11 in one run: stage 8's LLM-CTC counts as stalled above 0.16 per
    frame over its last 100 updates (its learned runs end at 0.12-0.13, a slow one at
    0.182), the LLM steps of stages 10 and 11 above 0.08 (theirs at 0.010-0.063, a slow
    one at 0.106), each read right after it trains."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ("exp/full_pruned_ctc/decoding.pt",
                                                               "exp/full_llm_ctc/decoding.pt",
                                                               f"exp/full_pruned_ctc_streaming{LA}/decoding.pt"))
    launches = recorded_launches(recipe, env, record, "--stage", "8", "--stop-stage", "11")
    checks = [(launches[i - 1], c) for i, c in enumerate(launches) if "local.training_stall" in c]
    trained = [[a.split("=", 1)[1] for a in t if a.startswith("train.exp_dir=")][-1] for t, _ in checks]
    assert trained == ["exp/full_llm_ctc", f"exp/full_llm_ctc_streaming{LA}", f"exp/full_llm_ctc_speech_offline{LA}",
                       f"exp/full_llm_ctc_query_offline{LA}", f"exp/full_llm_ctc_streaming{LA}_sentences"]
    assert [c[2:5] for _, c in checks] == [[folder, "--max-loss", "0.16" if i == 0 else "0.08"]
                                           for i, folder in enumerate(trained)]


# Stand-in python for stage 8's retry: local.training_stall reports a stall (exit 3) when
# asked for a status, as the real one does for a stalled run; the rest recorded.
MINI_STALLED_PYTHON = MINI_STAGE_10_PYTHON.replace(
    'case "$*" in', 'case "$*" in\n  *"-m local.training_stall "*"--stalled-status 3"*) '
    'line=$(printf \'%q \' "$@"); echo "$line" >> "{record}"; exit 3 ;;')


@pytest.mark.parametrize("options", [(), ("--train-args", "train.exp_dir=exp/mine train.seed=44")])
def test_mini_stage_8_trains_a_stalled_run_again_with_the_next_four_seeds_then_at_30x(recipe_copy, tmp_path,
                                                                                       options):
    """egs/mini stage 8: a stalled LLM-CTC run on the tiny LM moves to <folder>_stalled and
    trains again in its folder with the next seed, marked; stalled again, it moves to
    <folder>_stalled2 and trains with the seed after, and so on to the fourth seed after
    the run's own (each marked), then at 30x with the run's own seed, marked, and is checked once more with
    what is left to do. Run again, stage 8 resumes the marked 30x retry without another;
    a next-seed retry whose run was cut short resumes with its seed and goes on down the
    chain. The stand-in python reports a stall for every run."""
    recipe = recipe_copy("mini")
    folder = "exp/mine" if options else "exp/full_llm_ctc"
    run_seed = 44 if options else 42
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ("exp/full_pruned_ctc/decoding.pt",
                                                               f"{folder}/checkpoint-1200.pt"))
    (tmp_path / "bin" / "python").write_text(MINI_STALLED_PYTHON.format(record=record, real=sys.executable))
    stage_8 = ("--stage", "8", "--stop-stage", "8", *options)
    launches = recorded_launches(recipe, env, record, *stage_8)
    assert [c[1] for c in launches] == ["asr.train", "local.training_stall"] * 6
    trains, checks = launches[::2], launches[1::2]
    first, seed_retries, retry_30x, warning = trains[0], trains[1:5], trains[5], checks[5]
    # The same run with each of the next four seeds after all other settings, then at 30x with its own seed.
    assert seed_retries == [first + [f"train.seed={run_seed + n}"] for n in (1, 2, 3, 4)]
    assert retry_30x == first + ["model.projector_lr_scale=30"]
    assert [c[-1] for c in checks[:5]] == [f"It trains again with the next seed (train.seed={run_seed + 1})."] + [
        f"It trains again with another seed (train.seed={run_seed + n})." for n in (2, 3, 4)] + [
        "It trains again at 30x (model.projector_lr_scale=30)."]
    assert all("--stalled-status" in c for c in checks[:5])
    assert (recipe / f"{folder}_stalled/checkpoint-1200.pt").is_file()  # the stalled run kept
    assert (recipe / f"{folder}_stalled2/retrained_with_the_next_seed").read_text() == f"train.seed={run_seed + 1}\n"
    for n in (2, 3, 4):
        assert (recipe / f"{folder}_stalled{n + 1}/retrained_with_seed_plus_{n}").read_text() == \
            f"train.seed={run_seed + n}\n"
    assert (recipe / f"{folder}/retrained_at_30x").read_text() == "model.projector_lr_scale=30\n"
    assert warning[2:5] == [folder, "--max-loss", "0.16"] and "--stalled-status" not in warning
    # The seed it names is neither the run's own nor any that stalled.
    assert f"--train-args train.seed={run_seed + 5};" in warning[-1]
    # Only the recipe's own folder is where stages 10 and 11 start from.
    assert warning[-1].startswith("Stages 10 and 11 start from it: ") == (folder == "exp/full_llm_ctc")
    # Run again (an interrupted retry, say): the 30x retry resumes, no other retry.
    record.unlink()
    launches = recorded_launches(recipe, env, record, *stage_8)
    assert [c[1] for c in launches] == ["asr.train", "local.training_stall"]
    assert launches[0] == retry_30x and "--stalled-status" not in launches[1]
    assert not (recipe / f"{folder}_stalled6").exists()
    # A mark from before it held its settings (empty) stands for the same retry.
    (recipe / f"{folder}/retrained_at_30x").write_text("")
    record.unlink()
    assert recorded_launches(recipe, env, record, *stage_8)[0] == retry_30x
    # A next-seed retry found in the folder resumes with its seed, then goes on down the chain.
    shutil.rmtree(recipe / folder)
    (recipe / folder).mkdir()
    (recipe / f"{folder}/retrained_with_seed_plus_2").write_text(f"train.seed={run_seed + 2}\n")
    record.unlink()
    launches = recorded_launches(recipe, env, record, *stage_8)
    assert launches[::2] == seed_retries[1:] + [retry_30x]
    assert (recipe / f"{folder}_stalled6/retrained_with_seed_plus_2").is_file()


@pytest.mark.parametrize("stage, model", [("10", "streaming{}"), ("11", "streaming{}_sentences")])
@pytest.mark.parametrize("seed", [None, 44])
def test_mini_stages_10_and_11_train_a_stalled_llm_step_again_with_the_next_seed(recipe_copy, tmp_path, stage,
                                                                                 model, seed):
    """egs/mini stages 10 and 11: an LLM step on the tiny LM that stalled moves to
    <folder>_stalled and trains again in its folder with the seed above the run's own (43
    by default, 45 after --train-args train.seed=44, whose folders are named _seed44), its
    folder marked; the retry is read once more, naming the seed above the retry's; run
    again, the marked retry resumes with its seed and is not retried. The stand-in python
    reports a stall for every model."""
    recipe = recipe_copy("mini")
    options = ("--train-args", f"train.seed={seed}") if seed else ()
    named = LA + (f"_seed{seed}" if seed else "")
    folder = f"exp/full_llm_ctc_{model.format(named)}"
    env, record = recorded_mini_programs(recipe, tmp_path, 2, (f"exp/full_pruned_ctc_streaming{LA}/decoding.pt",
                                                               "exp/full_llm_ctc/decoding.pt",
                                                               "exp/full_pruned_ctc/decoding.pt",
                                                               *(f"exp/full_llm_ctc_{name}/checkpoint-2300.pt"
                                                                 for name in (f"streaming{named}",
                                                                              f"speech_offline{named}",
                                                                              f"query_offline{named}",
                                                                              f"streaming{named}_sentences"))))
    (tmp_path / "bin" / "python").write_text(MINI_STALLED_PYTHON.format(record=record, real=sys.executable))
    command = ["bash", str(recipe / "run.sh"), "--stage", stage, "--stop-stage", stage, *options]
    result = subprocess.run(command, cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    trained = [i for i, c in enumerate(launches) if "asr.train" in c and f"train.exp_dir={folder}" in c]
    assert len(trained) == 2
    first, retry = (launches[i] for i in trained)
    run_seed = seed or 42
    assert retry == first + [f"train.seed={run_seed + 1}"]  # the same run, the next seed after all others
    check, warning = launches[trained[0] + 1], launches[trained[1] + 1]
    assert check[1:] == ["local.training_stall", folder, "--max-loss", "0.08", "--stalled-status", "3", "--remedy",
                         f"It trains again with the next seed (train.seed={run_seed + 1})."]
    assert warning[1:5] == ["local.training_stall", folder, "--max-loss", "0.08"] and "--stalled-status" not in warning
    assert warning[-1] == (f"run stage {stage} again with another seed"
                           f" (--train-args train.seed={run_seed + 2}: its own folders).")
    assert (recipe / f"{folder}_stalled/checkpoint-2300.pt").is_file()  # the stalled run kept
    assert (recipe / folder / "retrained_with_the_next_seed").is_file()
    assert f"the run stalled (now in {folder}_stalled); training it again with train.seed={run_seed + 1}" in \
        result.stdout + result.stderr
    # Its decodes read the retry.
    decodes = [c for c in launches if "asr.decode" in c and f"train.exp_dir={folder}" in c]
    assert decodes and all(c.index(f"train.seed={run_seed + 1}") > c.index(f"train.exp_dir={folder}")
                           for c in decodes)
    # Run again (an interrupted retry, say): it resumes with the next seed, no second retry.
    record.unlink()
    result = subprocess.run(command, cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    [resumed] = [c for c in launches if "asr.train" in c and f"train.exp_dir={folder}" in c]
    assert resumed == retry and "--stalled-status" not in launches[launches.index(resumed) + 1]
    assert not (recipe / f"{folder}_stalled2").exists()
    # Run with another seed, into that seed's folders: the retry is neither resumed nor read.
    assert (recipe / folder / "retrained_with_the_next_seed").read_text() == f"train.seed={run_seed + 1}\n"
    record.unlink()
    for name in ("streaming{}", "speech_offline{}", "query_offline{}", "streaming{}_sentences"):
        (recipe / f"exp/full_llm_ctc_{name.format(LA + '_seed7')}").mkdir()  # as its training makes it
    other = ["bash", str(recipe / "run.sh"), "--stage", stage, "--stop-stage", stage, "--train-args", "train.seed=7"]
    result = subprocess.run(other, cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    assert not [c for c in launches if f"train.exp_dir={folder}" in c]
    seven_folder = f"exp/full_llm_ctc_{model.format(LA + '_seed7')}"
    seven = [c for c in launches if "asr.train" in c and f"train.exp_dir={seven_folder}" in c]
    assert [c[-1] for c in seven] == ["train.seed=7", "train.seed=8"]  # the stand-in stalls it too


def test_a_train_seed_that_is_not_a_whole_number_is_an_error_naming_it(recipe_copy, tmp_path):
    """egs/mini: --train-args train.seed is read once, before any stage, for the seed a
    stalled run is trained again with: a bad one stops run.sh there, naming it."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ())
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "11", "--stop-stage", "11",
                             "--train-args", "train.seed=4x"], cwd=recipe, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "train.seed must be a non-negative integer, got '4x'" in result.stderr
    assert not record.exists()


@pytest.mark.parametrize("seed", [None, 43])
def test_mini_stage_11_trains_stage_10s_llm_step_on_single_sentences_three_ways_and_prints_tables_9_and_5(
        recipe_copy, tmp_path, seed):
    """egs/mini stage 11: three trainings with stage 10's LLM-step settings but not its
    joined batches (offline speech readout, offline query readout, streaming query
    readout), on stage 10's encoder from stage 8's weights, each decoded on dev-clean and
    test-clean (the streaming one chunk by chunk), then the tables of these and stage 10's.
    With --train-args train.seed=43 its folders and tables are named _seed43, its inputs
    the default seed's, and its Table 5 has stage 10's row only where stage 10 ran with 43."""
    recipe = recipe_copy("mini")
    named = LA + (f"_seed{seed}" if seed else "")
    options = ("--train-args", f"train.seed={seed}") if seed else ()
    run_seed = seed or 42
    env, record = recorded_mini_programs(recipe, tmp_path, 2, (f"exp/full_pruned_ctc_streaming{LA}/decoding.pt",
                                                               "exp/full_llm_ctc/decoding.pt",
                                                               "exp/full_pruned_ctc/decoding.pt",
                                                               f"exp/full_llm_ctc_streaming{LA}/log/train.log"))
    launches = recorded_launches(recipe, env, record, "--stage", "11", "--stop-stage", "11", *options)
    programs = ("asr.train", "local.training_stall", "asr.decode", "llm_ctc.streaming.table",
                "local.chunk_boundary_errors")
    kinds = [next(m for m in programs if m in command) for command in launches]
    assert kinds == ["asr.train", "local.training_stall", "asr.decode"] * 3 + ["llm_ctc.streaming.table",
                                                                               "local.chunk_boundary_errors"]
    trainings = [command for command in launches if "asr.train" in command]
    streaming = ("model.streaming=true", "model.streaming_chunk_seconds=2", "model.streaming_max_history=8",
                 "model.streaming_position_offset_chunks=30", "model.streaming_lookahead_seconds=0.32")
    shared = {f"model.encoder_path=exp/full_pruned_ctc_streaming{LA}/decoding.pt",
              "train.init_from=exp/full_llm_ctc/decoding.pt", "train.max_batches=2300",
              "model.encoder_trained_blocks=3", "model.encoder_lr_scale=0.1", "model.projector_lr_scale=1"}
    if seed:
        shared.add(f"train.seed={seed}")
    folders = (f"exp/full_llm_ctc_speech_offline{named}", f"exp/full_llm_ctc_query_offline{named}",
               f"exp/full_llm_ctc_streaming{named}_sentences")
    for command, readout, folder in zip(trainings, ("speech", "query", "query"), folders):
        assert command[:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
        assert f"train.exp_dir={folder}" in command
        assert shared | {f"model.readout={readout}"} <= set(command), command
        assert not any(a.startswith("data.concatenate") for a in command), command
        assert set(streaming) <= set(command) if folder.endswith("sentences") else not set(streaming) & set(command)
    stalls = [command for command in launches if "local.training_stall" in command]
    assert [command[2:] for command in stalls] == [[folder, "--max-loss", "0.08", "--stalled-status", "3", "--remedy",
                                                    f"It trains again with the next seed (train.seed={run_seed + 1})."]
                                                   for folder in folders]
    decodes = [command for command in launches if "asr.decode" in command]
    for command, folder in zip(decodes, folders):
        assert f"train.exp_dir={folder}" in command
        if folder.endswith("sentences"):
            assert {"decode.methods=ctc-greedy-search,ctc-prefix-beam-search,ctc-streaming-prefix-beam-search",
                    "decode.history_seconds=2,4,8", *streaming} <= set(command), command
        else:
            assert "decode.methods=ctc-greedy-search,ctc-prefix-beam-search" in command
            assert not any(a.startswith("decode.history_seconds") for a in command)
    [table] = [command for command in launches if "llm_ctc.streaming.table" in command]
    stage_10 = [] if seed else ["--streaming", f"exp/full_llm_ctc_streaming{LA}"]
    assert table[2:] == ["--speech", f"exp/full_llm_ctc_speech_offline{named}",
                         "--offline", f"exp/full_llm_ctc_query_offline{named}",
                         "--streaming", f"exp/full_llm_ctc_streaming{named}_sentences",
                         *stage_10, "--sets", "dev-clean", "test-clean", "--search", "beam"]
    assert (recipe / f"exp/full_tables_9_and_5{named}.md").is_file()
    # Then the three models' errors by distance from a chunk boundary, the words placed by
    # stage 4's Zipformer.
    boundaries = launches[-1]
    assert boundaries[:3] == ["-m", "local.chunk_boundary_errors", "exp/full_pruned_ctc/decoding.pt"]
    fbank = "data/full/fbank/librispeech_cuts_"
    assert boundaries[3:] == ["--lang-dir", "data/full/lang_bpe_500", "--cuts", f"{fbank}dev-clean.jsonl.gz",
                              f"{fbank}test-clean.jsonl.gz", "--sets", "dev-clean", "test-clean",
                              "--decode", f"streaming, h = 2 s=exp/full_llm_ctc_streaming{named}_sentences:2",
                              "--decode", f"offline query readout=exp/full_llm_ctc_query_offline{named}",
                              "--decode", f"offline speech readout=exp/full_llm_ctc_speech_offline{named}"]
    assert (recipe / f"exp/full_chunk_boundary_errors{named}.md").is_file()
    if seed:
        # Stage 10 run with that seed: its model joins Table 5.
        (recipe / f"exp/full_llm_ctc_streaming{named}").mkdir()
        record.unlink()
        launches = recorded_launches(recipe, env, record, "--stage", "11", "--stop-stage", "11", *options)
        [table] = [command for command in launches if "llm_ctc.streaming.table" in command]
        assert table[7:10] == [f"exp/full_llm_ctc_streaming{named}_sentences", "--streaming",
                               f"exp/full_llm_ctc_streaming{named}"]
        return
    # Without stage 10's encoder the stage says which stage to run first.
    (recipe / f"exp/full_pruned_ctc_streaming{LA}/decoding.pt").unlink()
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "11", "--stop-stage", "11"],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "run --stage 10 first" in result.stdout + result.stderr
    # Nor without stage 7's Zipformer, which places the words: before any training.
    (recipe / f"exp/full_pruned_ctc_streaming{LA}/decoding.pt").write_bytes(b"")
    (recipe / "exp/full_pruned_ctc/decoding.pt").unlink()
    record.unlink()
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "11", "--stop-stage", "11"],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "run --stage 7 first" in result.stdout + result.stderr
    assert not record.exists()


def test_mini_stages_10_and_11_in_one_run_decode_each_model_with_its_own_methods_and_the_users_args(recipe_copy,
                                                                                                    tmp_path):
    """egs/mini stages 10 and 11 in one run (the README's --stage 7 --stop-stage 11): each
    decode gets its stage's methods and settings, then --decode-args once; the settings
    of stage 10's last decodes (streaming methods, 0.5 s of silence before the cuts) never
    reach stage 11's offline models, which read the speech whole."""
    recipe = recipe_copy("mini")
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ("exp/full_pruned_ctc/decoding.pt",
                                                               "exp/full_llm_ctc/checkpoint-1200.pt",
                                                               f"exp/full_pruned_ctc_streaming{LA}/decoding.pt",
                                                               "exp/full_llm_ctc/decoding.pt"))
    user = "decode.beam_size=8"
    launches = recorded_launches(recipe, env, record, "--stage", "10", "--stop-stage", "11", "--decode-args", user)
    decodes = {}
    for command in (c for c in launches if "asr.decode" in c):
        folder = next(a for a in command if a.startswith("train.exp_dir=")).split("=", 1)[1]
        test_cuts = next(i for i, a in enumerate(command) if a.startswith("decode.test_cuts="))
        decodes.setdefault(folder, []).append(command[test_cuts + 1:])  # decode_args, after the test sets
    assert sorted(decodes) == sorted([f"exp/full_pruned_ctc_streaming{LA}", f"exp/full_llm_ctc_streaming{LA}",
                                      f"exp/full_llm_ctc_speech_offline{LA}", f"exp/full_llm_ctc_query_offline{LA}",
                                      f"exp/full_llm_ctc_streaming{LA}_sentences"])
    assert decodes[f"exp/full_pruned_ctc_streaming{LA}"] == [[]]  # the window encoder's own decode section
    streaming_methods = "decode.methods=ctc-greedy-search,ctc-prefix-beam-search,ctc-streaming-prefix-beam-search"
    seams = "decode.seam_merge_seconds=0.64"  # the default lookahead's chunks overlap
    assert decodes[f"exp/full_llm_ctc_streaming{LA}"] == [
        [streaming_methods, "decode.history_seconds=2,4,8", seams, user],
        ["decode.methods=ctc-streaming-greedy-search,ctc-streaming-prefix-beam-search", "decode.history_seconds=2",
         "decode.max_duration=120", seams, user],
        ["decode.methods=ctc-streaming-prefix-beam-search", "decode.history_seconds=2",
         "decode.lead_padding_seconds=0.5", seams, user]]
    for readout in ("speech", "query"):
        assert decodes[f"exp/full_llm_ctc_{readout}_offline{LA}"] == [
            ["decode.methods=ctc-greedy-search,ctc-prefix-beam-search", user]]
    assert decodes[f"exp/full_llm_ctc_streaming{LA}_sentences"] == [
        [streaming_methods, "decode.history_seconds=2,4,8", seams, user]]


@pytest.mark.parametrize("options, lookahead", [((), "0.32"), (("--streaming-lookahead", "0"), None),
                                                (("--streaming-lookahead", ".5"), "0.5")])
def test_mini_stages_10_and_11_train_and_decode_every_streaming_model_with_the_lookahead(recipe_copy, tmp_path,
                                                                                      options, lookahead):
    """--streaming-lookahead L (0.32 by default): stage 10's window encoder and streaming
    LLM, and stage 11's streaming model, get model.streaming_lookahead_seconds=L; stage 11's
    offline twins read that encoder; every folder and table is named with _lookahead<L>
    (L as a number: .5 is 0.5). --streaming-lookahead 0 is the paper's windows: no
    lookahead anywhere, the folders and tables without the suffix."""
    recipe = recipe_copy("mini")
    suffix = f"_lookahead{lookahead}" if lookahead else ""
    env, record = recorded_mini_programs(recipe, tmp_path, 2, ("exp/full_pruned_ctc/decoding.pt",
                                                               "exp/full_llm_ctc/checkpoint-1200.pt",
                                                               f"exp/full_pruned_ctc_streaming{suffix}/decoding.pt",
                                                               "exp/full_llm_ctc/decoding.pt",
                                                               f"exp/full_llm_ctc_streaming{suffix}/log/train.log"))
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "10", "--stop-stage", "11", *options],
                            cwd=recipe, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    launches = [shlex.split(line) for line in record.read_text().splitlines()]
    trainings = [command for command in launches if "asr.train" in command]
    folders = [next(a for a in command if a.startswith("train.exp_dir=")).split("=", 1)[1] for command in trainings]
    assert folders == [f"exp/full_pruned_ctc_streaming{suffix}", f"exp/full_llm_ctc_streaming{suffix}",
                       f"exp/full_llm_ctc_speech_offline{suffix}", f"exp/full_llm_ctc_query_offline{suffix}",
                       f"exp/full_llm_ctc_streaming{suffix}_sentences"]
    setting = f"model.streaming_lookahead_seconds={lookahead}"
    streaming = [True, True, False, False, True]
    for command, folder, streams in zip(trainings, folders, streaming):
        given = [a for a in command if a.startswith("model.streaming_lookahead_seconds=")]
        assert given == ([setting] if streams and lookahead else []), folder
        if folder.startswith("exp/full_llm_ctc"):
            assert f"model.encoder_path=exp/full_pruned_ctc_streaming{suffix}/decoding.pt" in command
    decodes = [command for command in launches if "asr.decode" in command]
    streaming_decodes = [command for command in decodes
                         if any(a in (f"train.exp_dir=exp/full_pruned_ctc_streaming{suffix}",
                                      f"train.exp_dir=exp/full_llm_ctc_streaming{suffix}",
                                      f"train.exp_dir=exp/full_llm_ctc_streaming{suffix}_sentences") for a in command)]
    assert len(streaming_decodes) == 5  # the window encoder, stage 10's LLM three times, stage 11's streaming model
    for command in decodes:
        given = [a for a in command if a.startswith("model.streaming_lookahead_seconds=")]
        assert given == ([setting] if command in streaming_decodes and lookahead else []), command
        # The LLM's streaming decodes merge the seams where the chunks' windows overlap.
        llm_streaming = command in streaming_decodes and f"train.exp_dir=exp/full_pruned_ctc_streaming{suffix}" \
            not in command
        assert ("decode.seam_merge_seconds=0.64" in command) == bool(llm_streaming and lookahead), command
    [table] = [command for command in launches if "llm_ctc.streaming.table" in command]
    assert table[2:10] == ["--speech", f"exp/full_llm_ctc_speech_offline{suffix}",
                           "--offline", f"exp/full_llm_ctc_query_offline{suffix}",
                           "--streaming", f"exp/full_llm_ctc_streaming{suffix}_sentences",
                           "--streaming", f"exp/full_llm_ctc_streaming{suffix}"]
    written = sorted(path.name for path in (recipe / "exp").glob("full_*.md"))
    assert written == [f"full_chunk_boundary_errors{suffix}.md", f"full_tables_9_and_5{suffix}.md"]
    if lookahead:
        assert f"each chunk's encoder window reads {lookahead} s of the next chunk" in result.stdout
    if options:
        return
    for bad in ("0.325", "2.5", "-1", "soon", "."):
        result = subprocess.run(["bash", str(recipe / "run.sh"), "--stage", "10", "--stop-stage", "10",
                                 "--streaming-lookahead", bad], cwd=recipe, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode != 0
        assert f"--streaming-lookahead must be seconds in steps of 0.01 between 0 and the 2 s chunk, got '{bad}'" \
            in result.stdout + result.stderr


@pytest.mark.parametrize("options, message", [
    (("--cpu-processes", "0"), "--cpu-processes must be a positive integer, got '0'"),
    (("--cpu-processes", "2", "--num-gpus", "2"), "--cpu-processes 2 trains on one machine's CPU: not with --num-gpus 2"),
])
def test_bad_cpu_processes_are_errors_naming_the_option(recipe_copy, tmp_path, options, message):
    result, launches = _launch(recipe_copy, tmp_path, 2, *options)
    assert result.returncode != 0 and not launches
    assert message in result.stderr


def test_several_nodes_pass_the_rendezvous_options(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 8, "--num-gpus", "8", "--num-nodes", "2",
                               "--node-rank", "1", "--rdzv-endpoint", "node0:29400")
    command = launches[0]
    flags = dict(zip(command[2:14:2], command[3:14:2]))
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "8", "--rdzv-backend": "c10d",
                     "--rdzv-endpoint": "node0:29400", "--rdzv-id": "pruned_ctc"}


def test_one_gpu_or_none_trains_in_one_process_and_paths_come_before_user_overrides(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 0, "--num-gpus", "2",
                               "--train-args", "optim.base_lr=0.04 data.max_duration=500")
    command = launches[0]
    assert command[:2] == ["-m", "asr.train"]
    assert "no CUDA device, one CPU process instead of 2 GPUs" in result.stdout
    overrides = command[4:]
    assert overrides[-2:] == ["optim.base_lr=0.04", "data.max_duration=500"]
    assert {o.split("=")[0] for o in overrides[:-2]} == {
        "train.exp_dir", "train.lang_dir", "data.train_cuts", "data.valid_cuts", "data.musan_cuts"}


def test_several_nodes_without_a_rendezvous_endpoint_is_an_error(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 2, "--num-nodes", "2")
    assert result.returncode != 0 and not launches
    assert "--num-nodes 2 needs --rdzv-endpoint HOST:PORT" in result.stderr


def test_too_few_gpus_is_an_error_naming_the_option(recipe_copy, tmp_path):
    result, launches = _launch(recipe_copy, tmp_path, 1, "--num-gpus", "2")
    assert result.returncode != 0 and not launches
    assert "--num-gpus 2 but only 1 CUDA device(s) are visible" in result.stderr


def test_a_bad_override_is_an_error_naming_it(recipe_copy, run_recipe):
    recipe = recipe_copy("aishell")
    result = run_recipe(recipe, "--stage", "10", "--stop-stage", "10", "--train-args", "train.num_epoch=3", check=False)
    assert result.returncode != 0
    assert "ERROR: unknown train option 'num_epoch' in override 'train.num_epoch=3'" in result.stderr


# --- The presets and defaults are the paper's (Sec. 5.2, App. E.1) -------------------------

PAPER = {  # corpus: (epochs, GPUs, lexicon)
    "librispeech": (100, 2, "data/lang_bpe_500"),
    "gigaspeech": (60, 2, "data/lang_bpe_500"),
    "aishell": (120, 1, "data/lang_char"),
}


@pytest.mark.parametrize("corpus", CORPORA)
def test_presets_hold_the_papers_training_settings(corpus):
    from zipformer.presets import get_preset
    from asr.config import load_run_config

    config = load_run_config(Path(__file__).resolve().parents[2] / "egs" / corpus / "conf/train.yaml")
    assert config.train.num_epochs == PAPER[corpus][0]
    assert config.optim.base_lr == 0.045
    assert (config.model.loss, config.model.alignment_beam, config.model.chunk_size) == ("pruned", None, None)
    assert config.model.encoder_dim == get_preset("M").encoder_dim == (192, 256, 384, 512, 384, 256)
    assert config.model.num_encoder_layers == (2, 2, 3, 4, 3, 2)
    assert config.train.precision in ("fp16", "bf16")
    assert config.data.enable_spec_aug and config.data.enable_musan == (corpus != "aishell")


@pytest.mark.parametrize("corpus", CORPORA)
def test_run_sh_defaults_are_the_papers_gpus_and_decoding(corpus, recipe_copy):
    recipe = recipe_copy(corpus)
    result = subprocess.run(["bash", str(recipe / "run.sh"), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    options = dict(re.findall(r"^  --([a-z-]+) '(.*)'$", result.stdout, flags=re.M))
    assert options["num-gpus"] == str(PAPER[corpus][1])
    assert options["train-config"] == "conf/train.yaml"
    from asr.config import load_run_config

    decode = load_run_config(recipe / "conf/train.yaml").decode
    assert (decode.beam_size, decode.methods) == (4, ("ctc-prefix-beam-search", "ctc-greedy-search"))
    assert (decode.epoch, decode.avg, decode.use_averaged_model) == ("last", 15, True)


# --- Stages run out of order say what is missing ---------------------------------------------

def test_gigaspeech_training_refuses_pieces_without_features(recipe_copy, run_recipe):
    recipe = recipe_copy("gigaspeech")
    split = recipe / "data/fbank/gigaspeech_XL_split"
    split.mkdir(parents=True)
    for name in (".split.done", "gigaspeech_cuts_XL_raw.0.jsonl.gz", "gigaspeech_cuts_XL_raw.1.jsonl.gz",
                 "gigaspeech_cuts_XL.0.jsonl.gz"):
        (split / name).write_text("")
    result = run_recipe(recipe, "--stage", "10", "--stop-stage", "10", check=False)
    assert result.returncode != 0
    assert "1 of 2 piece(s) of data/fbank/gigaspeech_XL_split without features: finish stages 5 and 6" in result.stderr


def test_the_summary_before_training_names_the_missing_experiment(recipe_copy, run_recipe):
    recipe = recipe_copy("aishell")
    result = run_recipe(recipe, "--stage", "12", "--stop-stage", "12", check=False)
    assert result.returncode != 0
    assert f"ERROR: train.exp_dir: experiment folder not found: {EXP}" in result.stderr
