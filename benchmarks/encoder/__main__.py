"""Zipformer encoder forward + backward benchmark: speed and peak memory per preset.

Each configuration runs in a fresh process (so peaks do not mix). On CPU, memory is the
peak resident set size above the worker's baseline (model and inputs built); on CUDA it
is torch's peak allocated memory above the baseline. Results go to
``<output-dir>/encoder_<device>.csv`` and ``.md`` with the command and the machine.

From the repository root:
    python -m benchmarks.encoder                       # M and S on CPU, fp32
    python -m benchmarks.encoder --device cuda --dtype bf16 --presets M
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.support import (command_line, load_average, machine_description, memory_mb,
                                print_result, reset_peak, run_fresh, synchronize, write_csv,
                                write_text)

FRAMES_PER_SECOND = 100  # 10 ms fbank shift (asr.cut_filters.FRAME_SHIFT_SECONDS)


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["M", "S"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0, help="utterance duration")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: encoder under torch.autocast")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations")
    parser.add_argument("--iters", type=int, default=3, help="timed iterations")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/encoder"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run_worker(args: argparse.Namespace) -> Dict[str, float]:
    import torch

    from zipformer.encoder import ZipformerEncoder
    from zipformer.presets import get_preset

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    (preset,) = args.presets
    encoder = ZipformerEncoder(get_preset(preset)).to(device).train()
    num_frames = int(args.seconds * FRAMES_PER_SECOND)
    features = torch.randn(args.batch_size, num_frames, 80, device=device)
    lengths = torch.full((args.batch_size,), num_frames, device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            out, _ = encoder(features, lengths)
        out.float().pow(2).mean().backward()
        encoder.zero_grad(set_to_none=True)

    baseline = memory_mb(args.device, peak=False) * 2 ** 20
    reset_peak(args.device)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.iters):
        synchronize(args.device)
        start = time.perf_counter()
        step()
        synchronize(args.device)
        times.append(time.perf_counter() - start)
    peak = memory_mb(args.device, peak=True) * 2 ** 20
    median = sorted(times)[len(times) // 2]
    return {
        "preset": preset,
        "params": sum(p.numel() for p in encoder.parameters()),
        "batch_size": args.batch_size,
        "seconds": args.seconds,
        "device": args.device,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "median_step_s": round(median, 3),
        "input_frames_per_s": round(args.batch_size * num_frames / median, 1),
        "audio_s_per_s": round(args.batch_size * args.seconds / median, 2),
        "peak_mem_above_baseline_mib": round((peak - baseline) / 2 ** 20, 1),
        "baseline_mib": round(baseline / 2 ** 20, 1),
    }


def write_results(rows: List[Dict[str, float]], args: argparse.Namespace, command: str,
                  load_before: str) -> None:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"encoder_{args.device}_{args.dtype}"
    write_csv(rows, stem.with_suffix(".csv"))
    columns = ["preset", "params", "batch_size", "seconds", "dtype", "threads",
               "median_step_s", "input_frames_per_s", "audio_s_per_s",
               "peak_mem_above_baseline_mib"]
    memory = "peak RSS" if args.device == "cpu" else "peak allocated CUDA memory"
    lines = [
        f"# Zipformer encoder forward + backward ({args.device}, {args.dtype})", "",
        f"- Command: `{command}`",
        f"- Machine: {machine_description(args.device)}",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"load average before / after the runs {load_before} / {load_average()} (other "
        f"work on the machine slows the timings, not the memory)",
        f"- Batch: {args.batch_size} utterances of {args.seconds:g} s "
        f"({int(args.seconds * FRAMES_PER_SECOND)} fbank frames each, no padding); "
        f"training mode with every schedule at its default (late-training) value; "
        f"loss = mean of squared outputs; {args.warmup} warm-up and "
        f"{args.iters} timed iterations, median reported.",
        f"- Memory: {memory} over all iterations above the baseline of the built model and "
        f"inputs (activations, gradients, workspace), each preset in a fresh process.",
        "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    write_text("\n".join(lines) + "\n", stem.with_suffix(".md"))
    print(f"wrote {stem.with_suffix('.csv')} and {stem.with_suffix('.md')}")


def main(argv: List[str]) -> None:
    args = parse_args(argv)
    if args.worker:
        print_result(run_worker(args))
        return
    command = command_line()
    load_before = load_average()
    rows = []
    for preset in args.presets:
        worker = [*argv, "--presets", preset, "--worker"]
        print(f"[{preset}] running {args.warmup + args.iters} steps in a fresh process ...",
              flush=True)
        row, result = run_fresh(__package__, worker)
        if row is None:
            sys.exit(f"worker for preset {preset} failed:\n{result.stderr}")
        print(f"[{preset}] {row}", flush=True)
        rows.append(row)
    write_results(rows, args, command, load_before)


if __name__ == "__main__":
    main(sys.argv[1:])
