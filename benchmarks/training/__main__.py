"""Training throughput of a recipe preset on CPU: batches/s, seconds of audio per second,
CPU time and peak memory of asr.train's own training step.

The model, ScaledAdam, Eden and the loss are built from the preset (default
``egs/mini/conf/train.yaml``, read when the program runs, so the numbers follow the preset
as it is tuned), and every step is :func:`asr.train_step.training_step`: forward,
backward, ScaledAdam and Eden. Batches are synthetic fbank shaped like the mini corpus:
utterances of 2-4 s, 80 bins at 100 frames/s, each batch filled up to the preset's
``data.max_duration`` seconds, ~11.4 BPE tokens per second (the mini corpus's rate with
its 128-piece BPE), token ids drawn uniformly from the ``--vocab-size`` classes. Each
(loss, threads) configuration runs in a fresh process. Results:
``<output-dir>/training_cpu.csv`` and ``.md``, with the command, machine and date.

From the repository root:
    python -m benchmarks.training                         # threads 1 and 2, pruned and standard
    python -m benchmarks.training --threads 2 --ctc-loss pruned --steps 10
    python -m benchmarks.training model.preset=tiny       # preset overrides, as asr.train takes them
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from benchmarks.support import (BLANK_ID, REPO, load_average, peak_rss_mb, print_result,
                                provenance_lines, run_fresh, write_csv, write_text)

FRAMES_PER_SECOND = 100  # 10 ms fbank shift (asr.cut_filters.FRAME_SHIFT_SECONDS)
FEATURE_DIM = 80


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "egs/mini/conf/train.yaml",
                        help="training preset (model/data/train sections)")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides of the preset")
    parser.add_argument("--ctc-loss", nargs="+", choices=["pruned", "standard"],
                        default=["pruned", "standard"], help="model.loss of each configuration")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    parser.add_argument("--vocab-size", type=int, default=128, help="BPE vocabulary (blank included)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--start-batch", type=int, default=500,
                        help="global batch index of the first step: where the model's schedules "
                             "(layer skipping, dropout) and Eden stand; 500 is mid-way through the mini run")
    parser.add_argument("--utterance-seconds", type=float, nargs=2, default=[2.0, 4.0],
                        metavar=("MIN", "MAX"), help="utterance durations, drawn uniformly")
    parser.add_argument("--tokens-per-second", type=float, default=11.4)
    parser.add_argument("--num-batches", type=int, default=10,
                        help="distinct synthetic batches, cycled through (the same in every configuration)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=REPO / "benchmarks/training")
    parser.add_argument("--worker", nargs=2, metavar=("LOSS", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    low, high = args.utterance_seconds
    if not 0 < low <= high:
        parser.error(f"--utterance-seconds: need 0 < MIN <= MAX, got {low} {high}")
    if args.vocab_size < 2 or args.steps < 1 or args.warmup < 0 or args.num_batches < 1:
        parser.error("need --vocab-size >= 2, --steps >= 1, --warmup >= 0 and --num-batches >= 1")
    return args


def synthetic_batches(args: argparse.Namespace, max_duration: float) -> List[dict]:
    """Batches as asr.data.AsrDataset yields them (longest utterance first), with
    token id lists in place of the transcripts."""
    import numpy as np
    import torch

    rng = np.random.default_rng(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    low, high = args.utterance_seconds
    batches = []
    for _ in range(args.num_batches):
        durations: List[float] = []
        while True:
            duration = float(rng.uniform(low, high))
            if durations and sum(durations) + duration > max_duration:
                break
            durations.append(duration)
        frames = sorted((int(round(d * FRAMES_PER_SECOND)) for d in durations), reverse=True)
        features = torch.randn(len(frames), frames[0], FEATURE_DIM, generator=generator)
        for index, count in enumerate(frames):
            features[index, count:] = 0.0
        targets = [rng.integers(1, args.vocab_size, size=max(1, round(count / FRAMES_PER_SECOND * args.tokens_per_second))).tolist()
                   for count in frames]
        batches.append({"features": features, "feature_lens": torch.tensor(frames, dtype=torch.int64),
                        "texts": targets})
    return batches


def run_worker(args: argparse.Namespace, loss: str, threads: int) -> Dict[str, object]:
    """Times ``args.steps`` training steps of one configuration in this process."""
    import torch

    from asr.config import load_run_config
    from asr.train_step import training_step
    from asr.trainee import build_trainee, seed_everything

    torch.set_num_threads(threads)
    config = load_run_config(args.config, [*args.overrides, f"model.loss={loss}"])
    seed_everything(config.train.seed)
    run = build_trainee(config, torch.device("cpu"), args.vocab_size, BLANK_ID)
    run.scheduler.step_epoch(0)
    run.model.train()
    batches = synthetic_batches(args, config.data.max_duration)
    batch_index = args.start_batch
    for step in range(args.warmup):
        batch_index += 1
        batch = batches[step % len(batches)]
        training_step(run, batch, batch["texts"], batch_index)
    peak_after_warmup = peak_rss_mb()
    step_seconds = []
    audio_seconds = 0.0
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for step in range(args.warmup, args.warmup + args.steps):
        batch = batches[step % len(batches)]
        batch_index += 1
        began = time.perf_counter()
        training_step(run, batch, batch["texts"], batch_index)
        step_seconds.append(time.perf_counter() - began)
        audio_seconds += batch["feature_lens"].sum().item() / FRAMES_PER_SECOND
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    return {
        "ctc_loss": loss,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in run.model.parameters()),
        "vocab_size": args.vocab_size,
        "max_duration_s": config.data.max_duration,
        "timed_steps": args.steps,
        "audio_s_per_batch": round(audio_seconds / args.steps, 2),
        "batches_per_s": round(args.steps / wall, 3),
        "audio_s_per_s": round(audio_seconds / wall, 2),
        "median_step_s": round(statistics.median(step_seconds), 3),
        "cpu_s_per_step": round(cpu / args.steps, 3),
        "cpu_utilization": round(cpu / wall, 2),
        "peak_rss_after_warmup_mib": round(peak_after_warmup, 1),
        "peak_rss_mib": round(peak_rss_mb(), 1),
    }


def worker_command(argv: Sequence[str], loss: str, threads: int) -> List[str]:
    return [*argv, "--worker", loss, str(threads)]


def preset_summary(args: argparse.Namespace) -> str:
    """The preset's fields that shape a step, as read for this run."""
    from asr.config import load_run_config

    config = load_run_config(args.config, args.overrides)
    model, data, train = config.model, config.data, config.train
    return (f"model: encoder_dim {list(model.encoder_dim)}, layers {list(model.num_encoder_layers)}, "
            f"subsampling_channels {list(model.subsampling_channels)}, chunk_size {model.chunk_size}, "
            f"alignment_beam {model.alignment_beam}; data.max_duration {data.max_duration:g} s; train.precision "
            f"{train.precision}, optim.base_lr {config.optim.base_lr}, schedule_ref_duration {train.schedule_ref_duration:g}")


def write_results(rows: List[Dict[str, object]], args: argparse.Namespace, load_before: str) -> None:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / "training_cpu.csv")
    columns = ["ctc_loss", "threads", "batches_per_s", "audio_s_per_s", "median_step_s",
               "cpu_s_per_step", "cpu_utilization", "peak_rss_mib", "audio_s_per_batch"]
    low, high = args.utterance_seconds
    try:
        preset = args.config.resolve().relative_to(REPO)
    except ValueError:
        preset = args.config
    lines = [
        "# Training throughput on CPU (forward + backward + ScaledAdam + Eden)", "",
        *provenance_lines("cpu"), "",
        f"Load average (1/5/15 min) before the runs: {load_before}; after: {load_average()}. "
        "The machine is shared: other jobs slow the timings (not the memory).", "",
        f"Preset `{preset}`{' with ' + ' '.join(args.overrides) if args.overrides else ''}, "
        f"{rows[0]['params']:,} parameters at V = {args.vocab_size}: {preset_summary(args)}.", "",
        f"Synthetic batches: {args.num_batches} batches of {low:g}-{high:g} s utterances filled up to "
        f"data.max_duration, {FEATURE_DIM}-dim fbank at {FRAMES_PER_SECOND} frames/s, "
        f"{args.tokens_per_second:g} tokens per second, seed {args.seed}. Each configuration in a fresh "
        f"process: {args.warmup} warm-up and {args.steps} timed steps of asr.train_step.training_step "
        f"from global batch {args.start_batch + 1}. audio_s_per_s is seconds of audio trained on per "
        "second (x real time); cpu_utilization is CPU seconds per wall second (all threads); "
        "peak_rss_mib is the worker's peak resident set (Python, torch, model, optimizer state, "
        "activations).", "",
        "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
        *("| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows),
    ]
    write_text("\n".join(lines) + "\n", args.output_dir / "training_cpu.md")


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    if args.worker:
        loss, threads = args.worker
        print_result(run_worker(args, loss, int(threads)))
        return
    load_before = load_average()
    rows = []
    for threads in args.threads:
        for loss in args.ctc_loss:
            print(f"[{loss}, {threads} thread(s)] {args.warmup} + {args.steps} steps in a fresh process ...",
                  flush=True)
            row, completed = run_fresh(__package__, worker_command(argv, loss, threads))
            if row is None:
                sys.exit(f"worker ({loss}, {threads} threads) failed:\n{completed.stderr[-3000:]}")
            rows.append(row)
            print(f"[{loss}, {threads} thread(s)] {rows[-1]}", flush=True)
    write_results(rows, args, load_before)
    print(f"wrote {args.output_dir / 'training_cpu.csv'} and {args.output_dir / 'training_cpu.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
