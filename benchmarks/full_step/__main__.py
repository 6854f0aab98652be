"""Full training steps with Zipformer-M: standard CTC vs Pruned CTC (paper Table 1, App. C.2).

Each step is :func:`asr.train_step.training_step`: encoder forward, dropout, head and CTC
loss, backward, ScaledAdam (base_lr 0.045, clipping scale 2) with the Eden schedule, and
the gradient reset, the model and optimizer built as ``asr/trainee.py`` builds them for training.
Both methods start from the same initial weights (same seed, checked by a checksum), see
the same ordered batches and the same dropout masks, and each updates its own copy of
the weights; so their first-step losses must agree to rounding (printed in the table).

Batches are synthetic 80-dim fbank as in App. C.2: every utterance has exactly 100
encoder frames (407 fbank frames), M / 100 utterances per batch, 25 target tokens per
utterance drawn from a Zipf-like distribution over the V classes.

For each ``M:V1,V2,...`` of the grid, standard CTC runs at V1, V2, ... (descending) until a
step fits in memory; Pruned CTC then runs at that V: the largest tested vocabulary that
standard CTC fits, as in Table 1 (on CPU a V is skipped untried when standard CTC's head
and loss alone, 4MV + 640M FP32 values by App. C.2's model, exceed the available host
memory). Each (method, M, V) runs in a fresh process.

Memory is the peak above the process's state before the model was built (torch loaded,
batches in host memory): model, optimizer state, activations, gradients and workspace. On
CUDA, ``torch.cuda.max_memory_allocated`` over the timed steps (the paper's counter;
batches stay on the host until a step moves them). On CPU, the peak resident set
(/proc/self/status VmHWM, reset through /proc/self/clear_refs) over ``--memory-steps``
steps after the first (which creates the optimizer state), glibc's mmap threshold fixed
at 128 KiB so that the resident set follows the live tensors (the head-loss benchmark's
trick); the warm-up and timed steps follow with glibc's usual 32 MiB threshold
(re-mapping every block slows a CPU step 2-5x).
Time per step is the median over the timed steps, synchronized at both ends on CUDA;
the overhead is the median of the per-step ratios pruned / standard of the paired steps
(the same batch in both methods).

From the repository root:
    python -m benchmarks.full_step                      # CPU grid (committed results)
    python -m benchmarks.full_step --device cuda        # the paper's grid, bf16
    python -m benchmarks.full_step --device cuda --grid 16000:180000,150000,100000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.support import (FIXED_MMAP_THRESHOLD, FRAMES_PER_UTTERANCE, REPO,
                                TOKENS_PER_UTTERANCE, failure_reason,
                                keep_freed_memory_for_reuse, load_average, memory_mb,
                                print_result, provenance_lines, reset_peak, run_fresh,
                                synchronize, write_csv, write_text, zipf_targets)

METHODS = ("standard", "pruned")
# Table 1's grid (M, V): the largest V at which standard CTC completed a step on an H100 80 GB.
PAPER_GRID = ("16000:180000", "32000:130000", "64000:50000")
PAPER_TABLE = {16000: (180000, 51.7, 10.1, 17), 32000: (130000, 77.3, 17.9, 17),
               64000: (50000, 76.2, 33.8, 14)}  # M: (V, standard GiB, pruned GiB, +% time)
# Table 1's vocabularies at M / 16 (40-80 s of audio per batch): what Zipformer-M steps
# through in minutes on 2 CPU cores, standard CTC's (M, V) tensors dominating its memory.
CPU_GRID = ("1000:180000", "2000:130000")
FEATURE_FRAMES = 407  # fbank frames giving FRAMES_PER_UTTERANCE encoder frames
FEATURE_DIM = 80
BLANK_ID = 0


def parse_grid_entry(text: str) -> Tuple[int, List[int]]:
    """``"16000:180000,150000"`` -> (16000, [180000, 150000]) (vocabularies descending)."""
    try:
        frames, vocabularies = text.split(":")
        return int(frames), sorted((int(v) for v in vocabularies.split(",")), reverse=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected M:V[,V...], e.g. 16000:180000, got {text!r}") from error


def synthetic_batches(num_frames: int, vocab_size: int, num_batches: int, seed: int) -> List[dict]:
    """Batches as asr.data.AsrDataset yields them, token id lists as the texts."""
    import torch

    from zipformer.encoder import encoder_output_lengths

    assert encoder_output_lengths(FEATURE_FRAMES) == FRAMES_PER_UTTERANCE
    generator = torch.Generator().manual_seed(seed)
    num_utterances = num_frames // FRAMES_PER_UTTERANCE
    batches = []
    for _ in range(num_batches):
        features = torch.randn(num_utterances, FEATURE_FRAMES, FEATURE_DIM, generator=generator)
        targets = zipf_targets(vocab_size, num_utterances * TOKENS_PER_UTTERANCE, generator)
        batches.append({"features": features,
                        "feature_lens": torch.full((num_utterances,), FEATURE_FRAMES, dtype=torch.int64),
                        "texts": targets.view(num_utterances, TOKENS_PER_UTTERANCE).tolist()})
    return batches


def build_run(preset: str, vocab_size: int, method: str, device: str, precision: str,
              seconds_per_batch: float):
    """Model, ScaledAdam, Eden and GradScaler as asr.trainee.build_trainee builds them for asr.train, as the
    Trainee that asr.train_step.training_step takes (seeded before the model is built)."""
    import torch

    from asr.config import load_run_config
    from asr.trainee import build_trainee, seed_everything

    config = load_run_config(None, [f"model.preset={preset}", f"model.loss={method}",
                                    f"train.precision={precision}", "optim.base_lr=0.045",
                                    # The model's schedules follow the duration-adjusted batch count of this batch size.
                                    f"data.max_duration={seconds_per_batch}"])
    seed_everything(config.train.seed)
    trainee = build_trainee(config, torch.device(device), vocab_size, BLANK_ID)
    trainee.scheduler.step_epoch(0)
    return trainee


def run_worker(args: argparse.Namespace, method: str, num_frames: int, vocab_size: int) -> Dict[str, object]:
    """Warm-up, (on CPU) memory and timed steps of one configuration in this process."""
    import torch

    from asr.train_step import training_step

    batches = synthetic_batches(num_frames, vocab_size, args.num_batches, args.seed)
    seconds_per_batch = num_frames // FRAMES_PER_UTTERANCE * FEATURE_FRAMES / 100
    if args.device == "cuda":
        torch.cuda.init()
    baseline = memory_mb(args.device, peak=False)
    run = build_run(args.preset, vocab_size, method, args.device, args.precision, seconds_per_batch)
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in run.model.parameters())
    run.model.train()
    # On CUDA the allocator's counters need no phase of their own: memory is measured over
    # the timed steps. On CPU over --memory-steps steps after the first one (which creates
    # the optimizer state), before the warm-up of the allocator state used for timing.
    cpu = args.device == "cpu"
    memory_steps = args.memory_steps if cpu else 0
    first_memory = 1 if cpu else args.warmup
    first_timed = first_memory + memory_steps + args.warmup if cpu else args.warmup
    losses, seconds, cpu_seconds = [], [], []
    for step in range(first_timed + args.steps):
        if step == first_memory:
            resident = memory_mb(args.device, peak=False)
            reset_peak(args.device)
        if cpu and step == first_memory + memory_steps:
            peak = memory_mb(args.device, peak=True)
            keep_freed_memory_for_reuse()
        batch = batches[step % len(batches)]
        synchronize(args.device)
        began, cpu_began = time.perf_counter(), time.process_time()
        loss_sum, _, excluded = training_step(run, batch, batch["texts"], args.start_batch + step + 1)
        synchronize(args.device)
        seconds.append(time.perf_counter() - began)
        cpu_seconds.append(time.process_time() - cpu_began)
        losses.append(loss_sum)
        if excluded:
            raise RuntimeError(f"step {step}: {excluded} utterances excluded from the loss")
    if args.device == "cuda":
        peak = memory_mb(args.device, peak=True)
    # K: blank plus the distinct labels of the batch (paper Alg. 1).
    selected = [1 + len({token for text in b["texts"] for token in text}) for b in batches]
    timed = seconds[first_timed:]
    return dict(method=method, frames=num_frames, vocab_size=vocab_size,
                utterances=num_frames // FRAMES_PER_UTTERANCE, audio_s_per_batch=seconds_per_batch,
                selected_classes=round(statistics.mean(selected)), params=run.model.num_parameters(),
                precision=args.precision, initial_checksum=checksum,
                first_step_loss=losses[0], last_step_loss=losses[-1],
                losses=" ".join(f"{x:.8g}" for x in losses),
                step_s=statistics.median(timed), step_times_s=" ".join(f"{t:.3f}" for t in timed),
                cpu_step_s=statistics.median(cpu_seconds[first_timed:]),
                cpu_step_times_s=" ".join(f"{t:.3f}" for t in cpu_seconds[first_timed:]),
                memory_steps=memory_steps,
                resident_mib=round(resident - baseline, 1), peak_mib=round(peak - baseline, 1))


def available_host_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")


def standard_ctc_head_mib(frames: int, vocab_size: int) -> float:
    """Standard CTC's head and loss memory, 4MV + 640M FP32 values (paper App. C.2)."""
    return (4 * frames * vocab_size + 640 * frames) * 4 / 2 ** 20


def run_configuration(args: argparse.Namespace, method: str, frames: int, vocab_size: int) -> Optional[dict]:
    """Runs one configuration in a fresh process; None if it ran out of memory (on CPU: if
    standard CTC's head and loss alone would not fit in the available host memory, which
    is not tried, so that the kernel's OOM killer never picks a process on a shared host)."""
    if args.device == "cpu" and method == "standard":
        if standard_ctc_head_mib(frames, vocab_size) > available_host_mib():
            return None
    child = ["--worker", f"{method},{frames},{vocab_size}",
             "--device", args.device, "--preset", args.preset, "--precision", args.precision,
             "--warmup", str(args.warmup), "--steps", str(args.steps), "--memory-steps",
             str(args.memory_steps), "--num-batches",
             str(args.num_batches), "--seed", str(args.seed), "--start-batch", str(args.start_batch)]
    load_before = os.getloadavg()[0]
    row, completed = run_fresh(__package__, child, FIXED_MMAP_THRESHOLD)
    if row is not None:
        row.update(load_before=load_before, load_after=os.getloadavg()[0])
        return row
    if failure_reason(completed.returncode, completed.stderr)[0]:
        return None
    sys.exit(f"{method} M={frames} V={vocab_size} failed:\n{completed.stderr[-3000:]}")


def paired_rows(rows: List[dict]) -> List[dict]:
    """One summary row per (M, V) measured with both methods."""
    by_key = {(r["frames"], r["vocab_size"], r["method"]): r for r in rows}
    summary = []
    for frames, vocab_size in sorted({(r["frames"], r["vocab_size"]) for r in rows}):
        standard, pruned = by_key.get((frames, vocab_size, "standard")), by_key.get((frames, vocab_size, "pruned"))
        if not (standard and pruned):
            continue
        def paired_ratio(column):
            return statistics.median(float(p) / float(s) for p, s in zip(
                pruned[column].split(), standard[column].split()))

        summary.append(dict(
            frames=frames, vocab_size=vocab_size, selected_classes=pruned["selected_classes"],
            standard_peak_gib=standard["peak_mib"] / 1024, pruned_peak_gib=pruned["peak_mib"] / 1024,
            memory_reduction=standard["peak_mib"] / pruned["peak_mib"],
            standard_step_s=standard["step_s"], pruned_step_s=pruned["step_s"],
            time_ratio=paired_ratio("step_times_s"),
            standard_cpu_step_s=standard["cpu_step_s"], pruned_cpu_step_s=pruned["cpu_step_s"],
            cpu_time_ratio=paired_ratio("cpu_step_times_s"),
            standard_first_loss=standard["first_step_loss"], pruned_first_loss=pruned["first_step_loss"],
            first_loss_rel_diff=abs(pruned["first_step_loss"] - standard["first_step_loss"])
            / abs(standard["first_step_loss"]),
            last_loss_rel_diff=abs(pruned["last_step_loss"] - standard["last_step_loss"])
            / abs(standard["last_step_loss"]),
            same_initial_weights=standard["initial_checksum"] == pruned["initial_checksum"],
            load=f"{standard['load_before']:.1f}-{pruned['load_after']:.1f}"))
    return summary


def write_results(rows: List[dict], failures: List[str], args: argparse.Namespace, load_before: str) -> None:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"full_step_{args.device}.csv")
    summary = paired_rows(rows)
    unit = ("allocated peak over the timed steps" if args.device == "cuda" else
            f"peak RSS above the pre-model baseline over step {memory_step_range(args)}, before "
            "the warm-up and timed steps")
    lines = [f"# Full training steps, standard CTC vs Pruned CTC ({args.device})", "",
             *provenance_lines(args.device), "",
             f"Load average (1/5/15 min) before the runs: {load_before}; after: {load_average()}.", "",
             f"Zipformer preset {args.preset} ({rows[0]['params']:,} parameters at V = {rows[0]['vocab_size']:,}), "
             f"{args.precision} encoder, head and loss in FP32; asr.train_step.training_step with "
             f"ScaledAdam (base_lr 0.045) and Eden from global batch {args.start_batch + 1}. Synthetic "
             f"batches of {FRAMES_PER_UTTERANCE}-frame utterances ({FEATURE_FRAMES} fbank frames, "
             f"{TOKENS_PER_UTTERANCE} Zipf tokens each), {args.num_batches} distinct batches in "
             f"order; {steps_text(args)} per configuration, each in a fresh process. Memory: "
             f"{unit} (model, optimizer state, activations, gradients), GiB. Time: median per "
             "step; ratio: median of the paired per-step ratios pruned / standard; CPU time: "
             "process CPU seconds (all threads), steadier than wall time on a shared machine. "
             "First-step loss: the summed loss of the first "
             "step (same weights, batch and dropout masks), relative difference |pruned - "
             "standard| / |standard|; last step: after each method's own updates.", "",
             "| M | V | K | standard (GiB) | pruned (GiB) | memory standard / pruned | standard "
             "s/step | pruned s/step | time pruned / standard | CPU s/step standard / pruned | "
             "CPU time pruned / standard | first-step loss standard | first-step loss pruned | "
             "rel. diff, first step | rel. diff, last step | same initial weights | 1-min load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary:
        lines.append(
            f"| {r['frames']:,} | {r['vocab_size']:,} | {r['selected_classes']:,} | "
            f"{r['standard_peak_gib']:.2f} | {r['pruned_peak_gib']:.2f} | {r['memory_reduction']:.2f}x | "
            f"{r['standard_step_s']:.2f} | {r['pruned_step_s']:.2f} | {r['time_ratio']:.3f} | "
            f"{r['standard_cpu_step_s']:.2f} / {r['pruned_cpu_step_s']:.2f} | {r['cpu_time_ratio']:.3f} | "
            f"{r['standard_first_loss']:.6f} | {r['pruned_first_loss']:.6f} | "
            f"{r['first_loss_rel_diff']:.1e} | {r['last_loss_rel_diff']:.1e} | "
            f"{'yes' if r['same_initial_weights'] else 'NO'} | {r['load']} |")
    lines += ["", "Resident after the warm-up (model and optimizer state), GiB: " + ", ".join(
        f"{r['method']} M={r['frames']} V={r['vocab_size']}: {r['resident_mib'] / 1024:.2f}" for r in rows)]
    if failures:
        lines += ["", "Out of memory (standard CTC, so not measured with Pruned CTC): " + ", ".join(failures)]
    lines += ["", "Paper, Table 1 (H100 80 GB, bf16 encoder, GigaSpeech batches): ", "",
              "| M | V | standard (GiB) | pruned (GiB) | reduction | time overhead |",
              "|---|---|---|---|---|---|"]
    for frames, (vocab_size, standard, pruned, overhead) in PAPER_TABLE.items():
        lines.append(f"| {frames:,} | {vocab_size:,} | {standard} | {pruned} | "
                     f"{standard / pruned:.1f}x | +{overhead}% |")
    write_text("\n".join(lines) + "\n", args.output_dir / f"results_{args.device}.md")
    write_csv(summary, args.output_dir / f"summary_{args.device}.csv")


def memory_step_range(args: argparse.Namespace) -> str:
    return "2" if args.memory_steps == 1 else f"2-{1 + args.memory_steps}"


def steps_text(args: argparse.Namespace) -> str:
    first = f"1 first step, {args.memory_steps} memory step(s), " if args.device == "cpu" else ""
    return f"{first}{args.warmup} warm-up and {args.steps} timed steps"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--grid", nargs="+", type=parse_grid_entry, default=None,
                        help="M:V[,V...] entries: M encoder frames per batch (a multiple of 100), "
                        "vocabularies tried for standard CTC from the largest down (default: "
                        f"{' '.join(PAPER_GRID)} on cuda, {' '.join(CPU_GRID)} on cpu)")
    parser.add_argument("--preset", default="M", help="Zipformer preset (zipformer/presets.py)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                        help="encoder precision (default: bf16 on cuda as the paper, fp32 on cpu)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps before the timed ones (default 5 on cuda, 0 on cpu, "
                        "where the first step and the memory steps come before them)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 50 on cuda, 3 on cpu)")
    parser.add_argument("--memory-steps", type=int, default=1,
                        help="cpu: steps after the first one over which the peak RSS is measured")
    parser.add_argument("--num-batches", type=int, default=3, help="distinct batches, cycled in order")
    parser.add_argument("--start-batch", type=int, default=0,
                        help="global batch count before the first step (drives Eden and the model's schedules)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic batches")
    parser.add_argument("--output-dir", type=Path, default=REPO / "benchmarks/full_step")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    if args.grid is None:
        args.grid = [parse_grid_entry(entry) for entry in (PAPER_GRID if gpu else CPU_GRID)]
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    args.warmup = (5 if gpu else 0) if args.warmup is None else args.warmup
    args.steps = (50 if gpu else 3) if args.steps is None else args.steps
    if args.steps < 1 or args.warmup < 0 or args.num_batches < 1 or args.memory_steps < 1:
        parser.error("need --steps >= 1, --warmup >= 0, --memory-steps >= 1 and --num-batches >= 1")
    for frames, _ in args.grid:
        if frames <= 0 or frames % FRAMES_PER_UTTERANCE:
            parser.error(f"--grid: M = {frames} must be a positive multiple of {FRAMES_PER_UTTERANCE}")
    if gpu and not args.worker:
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is available")
    return args


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    if args.worker:
        method, frames, vocab_size = args.worker.split(",")
        print_result(run_worker(args, method, int(frames), int(vocab_size)))
        return
    load_before = load_average()
    rows: List[dict] = []
    failures: List[str] = []
    for frames, vocabularies in args.grid:
        for vocab_size in vocabularies:
            pair = []
            for method in METHODS:
                print(f"[M={frames} V={vocab_size}] {method}: {args.warmup} + {args.steps} steps ...", flush=True)
                row = run_configuration(args, method, frames, vocab_size)
                if row is None:
                    print(f"[M={frames} V={vocab_size}] {method}: out of memory", flush=True)
                    failures.append(f"{method} M={frames} V={vocab_size}")
                    break
                print(f"[M={frames} V={vocab_size}] {method}: {row['step_s']:.3f} s/step, peak "
                      f"{row['peak_mib'] / 1024:.2f} GiB, first-step loss {row['first_step_loss']:.6f}", flush=True)
                pair.append(row)
            rows += pair
            if len(pair) == len(METHODS):
                break  # the largest V that standard CTC fits
    if not rows:
        sys.exit("no configuration completed")
    write_results(rows, failures, args, load_before)
    print((args.output_dir / f"results_{args.device}.md").read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
