#!/usr/bin/env python3
"""Alignment-beam sweep (paper App. C.3, Fig. 5): discarded posterior mass per utterance.

For every batch, the head and the selected log-probabilities S are computed once; the
alignment DP then runs unpruned (L_n) and at every beam beta (L_beta,n) on identical S, in
FP64. The estimated discarded alignment posterior mass of utterance n is
delta_n = -expm1(-(L_beta,n - L_n)), and the required beam of a batch is the smallest
tested beam with max_n delta_n <= 1e-11 (the paper's criterion).

Inputs need no corpus: synthetic batches of utterances with exactly 100 encoder frames and
about 25 Zipf-distributed target tokens (App. D.2), head-input states drawn like those of
a randomly initialized model (unit-variance entries, head weights with variance 1/D).

Example (the committed CPU grid):
    python scripts/beam_sweep.py --vocab-sizes 500 2000 10000 50000 100000 \\
        --frames 2000 4000 --seeds 0 1 2 --output-dir benchmarks/beam_sweep
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import (add_grid_arguments, provenance_lines, write_csv,  # noqa: E402
                      write_text)
from benchmark_head_loss import make_batch  # noqa: E402

from pruned_ctc.alignment import align  # noqa: E402
from pruned_ctc.inputs import prepare_batch  # noqa: E402
from pruned_ctc.vocab_chunks import SelectedLogProbs  # noqa: E402

CRITERION = 1e-11


def discarded_mass(vocab_size: int, num_frames: int, seed: int, beams: list[float],
                   dim: int, chunk_size: int, device: str) -> dict[float, torch.Tensor]:
    """{beam: delta (N,) float64} for one synthetic batch."""
    encoder_out, weight, bias, targets, frame_counts, target_lengths = make_batch(
        vocab_size, num_frames, dim, device, seed=seed)
    batch = prepare_batch(encoder_out, vocab_size, targets, frame_counts, target_lengths, 0)
    with torch.no_grad():
        frames = encoder_out.reshape(-1, dim)
        selected = SelectedLogProbs.apply(frames, weight, bias, batch.selected_classes,
                                          chunk_size)
    offsets = torch.cumsum(frame_counts, 0) - frame_counts

    def losses(beam):
        return align(selected, offsets, frame_counts, batch.relabeled_targets,
                     batch.target_lengths, batch.alignable, beam, False).losses

    exact = losses(None)
    return {beam: -torch.expm1(-(losses(beam) - exact)) for beam in beams}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(parser)
    parser.add_argument("--beams", type=float, nargs="+",
                        default=[float(b) for b in range(10, 151, 10)])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/beam_sweep"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    beams = sorted(args.beams)

    rows, required = [], []
    configurations = [(v, m, s) for m in args.frames for v in args.vocab_sizes
                      for s in args.seeds]
    started = time.time()
    for index, (vocab_size, frames, seed) in enumerate(configurations, 1):
        deltas = discarded_mass(vocab_size, frames, seed, beams, args.dim, args.chunk_size,
                                args.device)
        needed = next((b for b in beams if float(deltas[b].max()) <= CRITERION), None)
        required.append(dict(vocab_size=vocab_size, frames=frames, seed=seed,
                             required_beam=needed if needed is not None else ""))
        for beam in beams:
            delta = deltas[beam]
            rows.append(dict(vocab_size=vocab_size, frames=frames, seed=seed, beam=beam,
                             utterances=delta.numel(), max_delta=f"{float(delta.max()):.3e}",
                             above_criterion=int((delta > CRITERION).sum())))
        elapsed = time.time() - started
        print(f"[{index}/{len(configurations)}] V={vocab_size} M={frames} seed={seed}: "
              f"required beam {needed} (elapsed {elapsed:.0f} s, ETA "
              f"{elapsed / index * (len(configurations) - index):.0f} s)", flush=True)
    write_outputs(rows, required, beams, args)


def write_outputs(rows, required, beams, args) -> None:
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    for name, table in (("discarded_mass", rows), ("required_beam", required)):
        write_csv(table, output / f"{name}_{args.device}.csv")
    lines = [f"# Alignment-beam sweep ({args.device})", ""] + provenance_lines(args.device) + [
             "",
             f"Required beam = smallest tested beam with max_n delta_n <= {CRITERION:g}; "
             "min / median / max over seeds.", "",
             "| M | V | required beam (min / median / max) |", "|---|---|---|"]
    for frames in args.frames:
        for vocab_size in args.vocab_sizes:
            values = sorted(r["required_beam"] for r in required
                            if r["frames"] == frames and r["vocab_size"] == vocab_size
                            and r["required_beam"] != "")
            if values:
                lines.append(f"| {frames} | {vocab_size} | {values[0]:g} / "
                             f"{values[len(values) // 2]:g} / {values[-1]:g} |")
    lines += ["", "Largest delta_n over all batches per beam:", "",
              "| beam | max delta_n | utterances above criterion |", "|---|---|---|"]
    for beam in beams:
        selected = [r for r in rows if r["beam"] == beam]
        largest = max(float(r["max_delta"]) for r in selected)
        above = sum(r["above_criterion"] for r in selected)
        total = sum(r["utterances"] for r in selected)
        lines.append(f"| {beam:g} | {largest:.2e} | {above} / {total} |")
    write_text("\n".join(lines) + "\n", output / f"results_{args.device}.md")
    plot(rows, beams, output / f"beam_sweep_{args.device}.png")


def plot(rows, beams, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for vocab_size in sorted({r["vocab_size"] for r in rows}):
        largest = [max(float(r["max_delta"]) for r in rows
                       if r["beam"] == b and r["vocab_size"] == vocab_size) for b in beams]
        axis.semilogy(beams, [max(x, 1e-18) for x in largest], marker="o",
                      label=f"V = {vocab_size:,}")
    axis.axhline(CRITERION, color="gray", linestyle="--", label="1e-11")
    axis.axvline(100, color="black", linestyle=":", label="training beam 100")
    axis.set_xlabel("alignment beam")
    axis.set_ylabel("max discarded mass delta_n (floored at 1e-18)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    temporary = path.with_name("." + path.name + ".tmp.png")
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


if __name__ == "__main__":
    main()
