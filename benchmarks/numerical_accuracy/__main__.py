"""Numerical accuracy of Pruned CTC against a dense FP64 reference (paper App. B.2).

Two analyses (``--analyses``), each written as CSV and Markdown under ``--output-dir``:

1. ``precision`` (Table 6): the gradient error of the selected classes' weight and bias
   rows for the precision choices {FP32, FP64 normalization} x {recomputed, reused
   selected log-probabilities} x {FP32, FP64 gradient products}, as ratios to the first
   configuration's error on each batch. The batches imitate a trained model (peaky
   posteriors that agree with the targets), where p_v(m) - gamma_v(m) nearly cancels.
2. ``grid`` (Fig. 4): relative errors of the per-utterance loss vector, the head-input
   gradient and the selected classes' weight gradient across vocabularies V and frame
   counts M, at the library's defaults, on randomly initialized heads.

The reference computes logits, log_softmax and torch's CTC in FP64 over the full
vocabulary, a group of utterances at a time to bound memory. Both sides keep every
alignment (beam None) to isolate the class-axis arithmetic. Relative error = Frobenius
norm of the difference over the reference's norm.

From the repository root (the committed results):
    python -m benchmarks.numerical_accuracy --analyses grid precision --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.support import (add_grid_arguments, head_batch, provenance_lines, write_csv,
                                write_text)
from pruned_ctc import DEFAULT_CHUNK_SIZE, DEFAULT_PRECISION, Precision, pruned_ctc_loss

UTTERANCES_PER_REFERENCE_GROUP = 5


def dense_reference(encoder_out, weight, bias, targets, frame_counts, target_lengths):
    """Per-utterance losses and gradients of their sum, in FP64, a few utterances at a
    time (the sum over utterances makes the weight gradient a sum over groups)."""
    weight64 = weight.detach().double().requires_grad_(True)
    bias64 = bias.detach().double().requires_grad_(True)
    losses, input_grads = [], []
    for start in range(0, encoder_out.shape[0], UTTERANCES_PER_REFERENCE_GROUP):
        group = slice(start, start + UTTERANCES_PER_REFERENCE_GROUP)
        x = encoder_out[group].detach().double().requires_grad_(True)
        log_probs = (x @ weight64.t() + bias64).log_softmax(-1).transpose(0, 1)
        group_losses = F.ctc_loss(log_probs, targets[group], frame_counts[group],
                                  target_lengths[group], reduction="none")
        group_losses.sum().backward()
        losses.append(group_losses.detach())
        input_grads.append(x.grad)
        del log_probs
    return torch.cat(losses), torch.cat(input_grads), weight64.grad, bias64.grad


def pruned(encoder_out, weight, bias, targets, frame_counts, target_lengths, chunk_size,
           precision=DEFAULT_PRECISION):
    """The library's computation (beam None) with a given precision: the per-utterance
    losses, and the gradients of their sum as training computes them (reduction "sum")."""
    x = encoder_out.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True)
    options = dict(target_lengths=target_lengths, beam=None, chunk_size=chunk_size,
                   precision=precision)
    with torch.no_grad():
        losses = pruned_ctc_loss(x, w, b, targets, frame_counts, reduction="none", **options)
    pruned_ctc_loss(x, w, b, targets, frame_counts, reduction="sum", **options).backward()
    selected = torch.unique(torch.cat([torch.zeros(1, dtype=torch.long), targets.view(-1)]))
    return losses, x.grad, w.grad, b.grad, selected


def relative_error(value, reference) -> float:
    value, reference = value.double(), reference.double()
    return float((value - reference).norm() / reference.norm())


def trained_like_batch(vocab_size: int, num_frames: int, dim: int, seed: int,
                       bias_scale: float = 0.0):
    """A batch whose posteriors agree with the targets, like a trained model's: each frame
    of a fixed alignment (label runs separated by blanks) points at its class's weight;
    bias entries N(0, bias_scale^2)."""
    encoder_out, weight, bias, targets, frame_counts, target_lengths = head_batch(
        vocab_size, num_frames, dim, "cpu", seed=seed)
    if bias_scale:
        bias = torch.randn(vocab_size, generator=torch.Generator().manual_seed(seed + 2000)
                           ) * bias_scale
    generator = torch.Generator().manual_seed(seed + 1000)
    frames_per_utterance = encoder_out.shape[1]
    tokens = targets.shape[1]
    for n in range(encoder_out.shape[0]):
        # Tokens spaced evenly; the frames between them are blank (class 0).
        positions = torch.linspace(2, frames_per_utterance - 3, tokens).round().long()
        labels = torch.zeros(frames_per_utterance, dtype=torch.long)
        labels[positions] = targets[n]
        direction = weight[labels] / weight[labels].norm(dim=1, keepdim=True) ** 2
        encoder_out[n] = 12.0 * direction + 0.5 * torch.randn(
            frames_per_utterance, dim, generator=generator)
    return encoder_out, weight, bias, targets, frame_counts, target_lengths


PRECISIONS = [
    ("FP32", "recomputed", "FP32", Precision(False, False, False)),
    ("FP32", "reused", "FP32", Precision(False, True, False)),
    ("FP64", "recomputed", "FP32", Precision(True, False, False)),
    ("FP64", "reused", "FP32", Precision(True, True, False)),
    ("FP64", "reused", "FP64", Precision(True, True, True)),
]
# Table 6's ranges over five trained batches (weight, bias), App. B.2.
PAPER_RATIOS = ["1.000 / 1.000", "1.000 / [0.998, 1.000]", "[0.348, 0.474] / [0.229, 0.357]",
                "[0.061, 0.141] / [0.062, 0.095]", "[0.047, 0.087] / [0.062, 0.097]"]


def precision_table(args) -> list[dict]:
    rows = []
    for bias_scale, seed in itertools.product(args.bias_scales, args.seeds):
        batch = trained_like_batch(args.precision_vocab, args.precision_frames, args.dim, seed,
                                   bias_scale)
        reference = dense_reference(*batch)
        errors = []
        for normalization, selected_source, products, precision in PRECISIONS:
            _, _, grad_weight, grad_bias, selected = pruned(*batch, args.chunk_size, precision)
            errors.append((relative_error(grad_weight[selected], reference[2][selected]),
                           relative_error(grad_bias[selected], reference[3][selected])))
        for (normalization, selected_source, products, _), (weight_error, bias_error) in zip(
                PRECISIONS, errors):
            rows.append(dict(bias_scale=bias_scale, seed=seed, normalization=normalization,
                             selected_log_probs=selected_source, gradient_products=products,
                             weight_error=f"{weight_error:.3e}", bias_error=f"{bias_error:.3e}",
                             weight_ratio=weight_error / errors[0][0],
                             bias_ratio=bias_error / errors[0][1]))
        print(f"precision table: bias scale {bias_scale}, seed {seed} done", flush=True)
    return rows


def accuracy_grid(args) -> list[dict]:
    rows = []
    configurations = list(itertools.product(args.frames, args.vocab_sizes, args.seeds))
    started = time.time()
    for index, (frames, vocab_size, seed) in enumerate(configurations, 1):
        batch = head_batch(vocab_size, frames, args.dim, "cpu", seed=seed)
        reference = dense_reference(*batch)
        losses, grad_input, grad_weight, _, selected = pruned(*batch, args.chunk_size)
        rows.append(dict(frames=frames, vocab_size=vocab_size, seed=seed,
                         chunk_size=args.chunk_size, selected_classes=selected.numel(),
                         loss_error=f"{relative_error(losses, reference[0]):.3e}",
                         input_grad_error=f"{relative_error(grad_input, reference[1]):.3e}",
                         selected_weight_grad_error=(
                             f"{relative_error(grad_weight[selected], reference[2][selected]):.3e}"),
                         loss_abs_error=f"{float((losses - reference[0]).abs().max()):.3e}"))
        elapsed = time.time() - started
        print(f"[{index}/{len(configurations)}] M={frames} V={vocab_size} seed={seed}: "
              f"{rows[-1]['loss_error']} {rows[-1]['input_grad_error']} "
              f"{rows[-1]['selected_weight_grad_error']} (ETA "
              f"{elapsed / index * (len(configurations) - index):.0f} s)", flush=True)
    return rows


def write_precision_table(args, precision_rows: list[dict]) -> None:
    lines = ["# Precision choices against a dense FP64 reference (Table 6, App. B.2)", ""]
    lines += provenance_lines("cpu")
    lines += ["", f"V = {args.precision_vocab}, M = {args.precision_frames}, D = {args.dim}, "
              f"seeds {args.seeds}: trained-like batches (posteriors that agree with the "
              "targets). Gradient error of the selected classes relative to the first row's "
              "on the same batch, min and max over seeds, gradients of reduction \"sum\" (the "
              "FP64-product row takes the deferred schedule). Bias entries N(0, s^2).", ""]
    for bias_scale in args.bias_scales:
        lines += [f"Bias scale s = {bias_scale}:", "",
                  "| normalization | selected log-probs | gradient products | weight ratio | "
                  "bias ratio | paper (weight / bias) |", "|---|---|---|---|---|---|"]
        for (normalization, selected_source, products, _), paper in zip(PRECISIONS,
                                                                         PAPER_RATIOS):
            chosen = [r for r in precision_rows if r["normalization"] == normalization
                      and r["selected_log_probs"] == selected_source
                      and r["gradient_products"] == products and r["bias_scale"] == bias_scale]
            weights = sorted(r["weight_ratio"] for r in chosen)
            biases = sorted(r["bias_ratio"] for r in chosen)
            lines.append(f"| {normalization} | {selected_source} | {products} | "
                         f"[{weights[0]:.3f}, {weights[-1]:.3f}] | "
                         f"[{biases[0]:.3f}, {biases[-1]:.3f}] | {paper} |")
        lines.append("")
    write_csv(precision_rows, args.output_dir / "precision_table.csv")
    write_text("\n".join(lines), args.output_dir / "precision_table.md")
    print(f"wrote {args.output_dir}/precision_table.md")


def write_accuracy_grid(args, grid_rows: list[dict]) -> None:
    lines = ["# Errors against a dense FP64 reference across V and M (Fig. 4, App. B.2)", ""]
    lines += provenance_lines("cpu")
    lines += ["", f"Chunk {args.chunk_size}, beam None, default precision, randomly "
              "initialized heads: maximum over seeds.", "",
              "| M | V | loss | head-input gradient | selected weight gradient |",
              "|---|---|---|---|---|"]
    for frames in args.frames:
        for vocab_size in args.vocab_sizes:
            chosen = [r for r in grid_rows if r["frames"] == frames
                      and r["vocab_size"] == vocab_size]
            lines.append(
                f"| {frames} | {vocab_size} | "
                f"{max(float(r['loss_error']) for r in chosen):.2e} | "
                f"{max(float(r['input_grad_error']) for r in chosen):.2e} | "
                f"{max(float(r['selected_weight_grad_error']) for r in chosen):.2e} |")
    write_csv(grid_rows, args.output_dir / "accuracy_grid.csv")
    write_text("\n".join(lines) + "\n", args.output_dir / "accuracy_grid.md")
    print(f"wrote {args.output_dir}/accuracy_grid.md")


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(parser)
    parser.add_argument("--analyses", nargs="+", choices=["precision", "grid"],
                        default=["precision", "grid"],
                        help="which to run; each writes its own CSV and Markdown file")
    parser.add_argument("--precision-vocab", type=int, default=500)
    parser.add_argument("--precision-frames", type=int, default=4000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--bias-scales", type=float, nargs="+", default=[0.0, 0.1, 0.5],
                        help="standard deviations of the precision table's head bias")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/numerical_accuracy"))
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if "precision" in args.analyses:
        write_precision_table(args, precision_table(args))
    if "grid" in args.analyses:
        write_accuracy_grid(args, accuracy_grid(args))


if __name__ == "__main__":
    main()
