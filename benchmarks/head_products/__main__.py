"""The (M, D, V) products alone: the time floor of any exact head + CTC loss on a device.

Standard CTC and Pruned CTC do the same FP32 head products (paper Sec. 3.3, App. B.2):
three with a trained head (logits Z = X W^T, dX = G W, dW = G^T X) and two with a frozen
one (Z and dX). What Pruned CTC can save is everything else of standard CTC (the (M, V)
log-softmax, its backward, the GB-sized temporaries), so ``products / standard time`` is
the smallest ratio an exact method can reach on the device (benchmarks/README.md,
"Why the time targets are below ...").

Timed here, each as the median of ``--runs`` after one warm-up, on random FP32 inputs:
  - trained head, single products: the three (M, D, V) products as one GEMM each;
  - trained head, row blocks: the same three over the fused schedule's row blocks of
    ``rows_per_block(M, V, C)`` frames (pruned_ctc/fused_head.py: each block reads the
    weight twice and reads and writes the weight gradient);
  - frozen head (``--frozen-head``): Z and dX as one GEMM each, and over the column
    schedule's chunks of C head rows (pruned_ctc/frozen_head.py).

From the repository root (the committed results: standard CTC's times from
benchmarks/head_loss/results_cpu.md and benchmarks/frozen_head/results_head_loss_float32_cpu.md):
    python -m benchmarks.head_products --frames 4000 --vocab-sizes 20000 100000 --dim 512 \\
        --runs 3 --standard-seconds 20000=2.04 100000=10.4
    python -m benchmarks.head_products --frames 4000 --vocab-sizes 151936 --dim 1024 \\
        --frozen-head --runs 3 --standard-seconds 151936=21.6

Results go to ``--output-dir`` (products.md and products.csv, or products_frozen.*), each
with the command, machine, load average and date; give ``--standard-seconds`` (V=seconds,
from ``python -m benchmarks.head_loss`` or ``python -m benchmarks.frozen_head --head-dtype
float32`` on the same machine) to print the floor ratio beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from benchmarks.support import load_average, provenance_lines, synchronize, write_csv, write_text
from pruned_ctc.fused_head import rows_per_block
from pruned_ctc.loss import DEFAULT_CHUNK_SIZE


# (Z, Z W, Z^T X) of one schedule, None where it keeps no such tensor: Z stands in for the
# (M, V) gradient G of dX = G W and dW = G^T X (the same products, values both schedules
# can be checked on).
Products = Tuple[Optional[torch.Tensor], torch.Tensor, Optional[torch.Tensor]]


def median_seconds(work: Callable[[], object], runs: int, device: str) -> float:
    work()  # warm-up: allocations, oneDNN primitives
    synchronize(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trained_products(frames: torch.Tensor, weight: torch.Tensor,
                     block_rows: int) -> Dict[str, Callable[[], Products]]:
    """Z = X W^T, Z W and Z^T X: as single GEMMs and over row blocks."""
    num_frames = frames.shape[0]
    logits = frames.new_empty(frames.shape[0], weight.shape[0])
    grad_frames = torch.empty_like(frames)
    grad_weight = torch.empty_like(weight)
    block = torch.empty(block_rows, weight.shape[0], dtype=frames.dtype, device=frames.device)

    def single() -> Products:
        torch.mm(frames, weight.t(), out=logits)
        torch.mm(logits, weight, out=grad_frames)
        torch.mm(logits.t(), frames, out=grad_weight)
        return logits, grad_frames, grad_weight

    def row_blocks() -> Products:
        for start in range(0, num_frames, block_rows):
            stop = min(start + block_rows, num_frames)
            rows = block[:stop - start]
            torch.mm(frames[start:stop], weight.t(), out=rows)
            torch.mm(rows, weight, out=grad_frames[start:stop])
            if start == 0:
                torch.mm(rows.t(), frames[start:stop], out=grad_weight)
            else:
                grad_weight.addmm_(rows.t(), frames[start:stop])
        return None, grad_frames, grad_weight

    return {"single": single, "row_blocks": row_blocks}


def frozen_products(frames: torch.Tensor, weight: torch.Tensor,
                    chunk_size: int) -> Dict[str, Callable[[], Products]]:
    """Z = X W^T and Z W: as single GEMMs and over column chunks of the head."""
    vocab_size = weight.shape[0]
    logits = frames.new_empty(frames.shape[0], weight.shape[0])
    grad_frames = torch.empty_like(frames)
    chunk = torch.empty(frames.shape[0], min(chunk_size, vocab_size), dtype=frames.dtype,
                        device=frames.device)

    def single() -> Products:
        torch.mm(frames, weight.t(), out=logits)
        torch.mm(logits, weight, out=grad_frames)
        return logits, grad_frames, None

    def column_chunks() -> Products:
        grad_frames.zero_()
        for start in range(0, vocab_size, chunk_size):
            stop = min(start + chunk_size, vocab_size)
            columns = chunk[:, :stop - start]
            torch.mm(frames, weight[start:stop].t(), out=columns)
            grad_frames.addmm_(columns, weight[start:stop])
        return None, grad_frames, None

    return {"single": single, "column_chunks": column_chunks}


def shown(value: object) -> str:
    """A table cell: floats to four significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def parse_standard_seconds(values: List[str]) -> Dict[int, float]:
    standard = {}
    for value in values:
        vocab, _, seconds = value.partition("=")
        try:
            standard[int(vocab)] = float(seconds)
        except ValueError:
            raise SystemExit(f"ERROR: --standard-seconds takes V=SECONDS, e.g. 100000=10.4; got {value!r}")
    return standard


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--frames", type=int, nargs="+", default=[4000])
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--frozen-head", action="store_true",
                        help="the two products of a frozen head (no weight gradient)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--standard-seconds", nargs="*", default=[], metavar="V=SECONDS",
                        help="standard CTC's head + loss time per V, for the floor ratio")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/head_products"))
    args = parser.parse_args()
    for name in ("frames", "vocab_sizes"):
        if any(value < 1 for value in getattr(args, name)):
            raise SystemExit(f"ERROR: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.dim < 1 or args.chunk_size < 1 or args.runs < 1:
        raise SystemExit("ERROR: --dim, --chunk-size and --runs must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ERROR: --device cuda but torch sees no CUDA device")
    standard = parse_standard_seconds(args.standard_seconds)

    rows = []
    generator = torch.Generator().manual_seed(0)
    for num_frames in args.frames:
        for vocab_size in args.vocab_sizes:
            frames = torch.randn(num_frames, args.dim, generator=generator).to(args.device)
            weight = (0.05 * torch.randn(vocab_size, args.dim, generator=generator)).to(args.device)
            if args.frozen_head:
                schedules = frozen_products(frames, weight, args.chunk_size)
                blocks = f"{-(-vocab_size // args.chunk_size)} column chunks of {args.chunk_size}"
            else:
                block_rows = rows_per_block(num_frames, vocab_size, args.chunk_size)
                schedules = trained_products(frames, weight, block_rows)
                blocks = f"{-(-num_frames // block_rows)} row blocks of {block_rows}"
            row = {"frames": num_frames, "vocab_size": vocab_size, "dim": args.dim, "blocks": blocks,
                   "load_start": load_average()}
            for name, work in schedules.items():
                row[f"{name}_s"] = median_seconds(work, args.runs, args.device)  # rounded for display only
            row["load_end"] = load_average()
            if vocab_size in standard:
                row["standard_s"] = standard[vocab_size]
                row["floor_ratio"] = row["single_s"] / standard[vocab_size]
            print({key: shown(value) for key, value in row.items()}, flush=True)
            rows.append(row)
            del frames, weight, schedules

    name = "products_frozen" if args.frozen_head else "products"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"{name}.csv")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["# Head products alone (" + ("frozen head: Z, dX" if args.frozen_head
                                          else "trained head: Z, dX, dW") + ")", "",
             *provenance_lines(args.device), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(shown(row.get(column, "")) for column in columns) + " |" for row in rows]
    write_text("\n".join(lines) + "\n", args.output_dir / f"{name}.md")


if __name__ == "__main__":
    main()
