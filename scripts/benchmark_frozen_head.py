#!/usr/bin/env python3
"""A frozen 151,936-class LLM head stored in BF16: memory and time of standard CTC,
unpruned reduced CTC (Pruned CTC with beam None) and Pruned CTC (beam 100), for the head
and loss alone and for a full LLM-CTC training step (paper App. C.3, the SPEAR-Qwen3
memory and runtime table).

Head and loss (``--part head-loss``, App. C.3 "CTC computation" and "Measurement"): states
X (N, T, D) in FP32 with a gradient, the frozen head W (V, D) in BF16 (no gradient, no
bias: Qwen3's), and the learned blank offset eta on the blank logit (a gradient, the
loss's ``blank_offset``, which keeps Pruned CTC on its frozen-head schedule); App. C.2's synthetic batch shape (utterances of 100 frames, about 25 Zipf
targets each). Standard CTC converts the whole head to FP32, forms (N, T, V) logits, log-
softmax and torch's CTC; the reduced methods convert it in chunks of ``--chunk-size``.
Losses are divided by the batch's target-token count. Two warm-up passes, then three
measured forward + backward passes (median time); memory is the peak above the resident
head and inputs after clearing their gradients (CPU: peak resident set; CUDA:
``max_memory_allocated``), each method in a fresh process.

Full step (``--part full-step``): a randomly initialized LLM-CTC from configuration (Qwen3
layers in BF16 with LoRA, its 151,936-row head frozen, a Zipformer encoder, the stack
projector, query readout) on synthesized features: forward, loss, backward, AdamW update
and gradient reset. Memory is the peak of the whole process during the step, resident
model and optimizer included (App. C.1), and the increase over the resident set before
the step; time is the median of three steps after two warm-up steps.

The committed CPU results (the issue's setting: D = 1,024, M = 4,000 frames):
    python scripts/benchmark_frozen_head.py --part head-loss --frames 4000 --dim 1024
    python scripts/benchmark_frozen_head.py --part full-step
Paper (A100, SPEAR-Qwen3-8B / 14B, M = 11,458, D = 4,096 / 5,120): head-and-loss memory
29.21 / 1.21 / 1.14 GiB (8B) and 29.79 / 1.33 / 1.20 GiB (14B) for standard / unpruned /
pruned, a 24.8-25.7x reduction; full step 56.06 / 34.67 / 34.67 GiB, 10.23 / 11.04 / 11.00 s
(8B).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmark_support import (FIXED_MMAP_THRESHOLD, failure_reason, head_batch, memory_mb,
                               print_result, provenance_lines, reset_peak, run_fresh, synchronize,
                               unmap_freed_blocks, write_csv, write_text)

METHODS = ("standard", "unpruned", "pruned")
QWEN3_HEAD_ROWS = 151_936
QWEN3_BLANK = 151_669  # the first head row beyond Qwen3's tokenizer (Sec. 4.2)
PAPER = {  # App. C.3 table: (head/loss GiB, full step GiB, seconds per full step), 8B | 14B
    "standard": ((29.21, 56.06, 10.23), (29.79, 72.71, 15.73)),
    "unpruned": ((1.21, 34.67, 11.04), (1.33, 52.82, 16.66)),
    "pruned": ((1.14, 34.67, 11.00), (1.20, 52.84, 16.61)),
}


def loss_of(method: str, states, weight, bias, eta, targets, lens, target_lengths, chunk_size: int):
    """Summed CTC loss of one method over a frozen head (bias frozen, eta learned on the
    blank logit), divided by the target tokens."""
    from pruned_ctc import DEFAULT_BEAM, pruned_ctc_loss, standard_ctc_loss

    options = dict(target_lengths=target_lengths, blank_id=QWEN3_BLANK, reduction="sum",
                   blank_offset=eta)
    if method == "standard":
        loss = standard_ctc_loss(states, weight, bias, targets, lens, **options)
    else:
        loss = pruned_ctc_loss(states, weight, bias, targets, lens, chunk_size=chunk_size,
                               beam=None if method == "unpruned" else DEFAULT_BEAM, **options)
    return loss / target_lengths.sum()


def head_loss_single(method: str, args) -> dict:
    """One method in this process: two warm-up and three measured passes, then the peak."""
    states, weight, _, targets, lens, target_lengths = head_batch(QWEN3_HEAD_ROWS, args.frames, args.dim,
                                                                  args.device, seed=args.seed)
    weight = weight.to(torch.bfloat16)  # frozen, stored in BF16 (App. C.3)
    # Targets are ordinary tokens: shift the Zipf ids so that none lands on the blank row.
    targets = torch.where(targets >= QWEN3_BLANK, targets - QWEN3_BLANK + 1, targets)
    states.requires_grad_(True)
    eta = torch.zeros((), device=args.device, requires_grad=True)

    def step() -> float:
        states.grad, eta.grad = None, None
        synchronize(args.device)
        started = time.perf_counter()
        loss_of(method, states, weight, None, eta, targets, lens, target_lengths,
                args.chunk_size).backward()
        synchronize(args.device)
        return time.perf_counter() - started

    for _ in range(args.warmup):
        step()
    times = [step() for _ in range(args.runs)]
    states.grad, eta.grad = None, None
    baseline = memory_mb(args.device, peak=False)
    reset_peak(args.device)
    loss = loss_of(method, states, weight, None, eta, targets, lens, target_lengths,
                   args.chunk_size)
    loss.backward()
    peak = memory_mb(args.device, peak=True)
    return dict(part="head-loss", method=method, vocab_size=QWEN3_HEAD_ROWS, frames=args.frames, dim=args.dim,
                head_dtype="bfloat16", loss=float(loss), time_s=statistics.median(times),
                times_s=" ".join(f"{t:.3f}" for t in times), peak_extra_mb=round(peak - baseline, 1),
                load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()))


def full_step_single(method: str, args) -> dict:
    """One method's full LLM-CTC training steps in this process."""
    from llm_analysis_support import batch_of, build_model, synthesized_utterances

    from llm_ctc.family import build_optimizer
    from llm_ctc.config import AdamWOptions

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        model = build_model(args, Path(scratch), args.seed, llm_dtype="bfloat16", lora_rank=args.lora_rank)
    model.train().to(args.device)
    optimizer, _ = build_optimizer(model, AdamWOptions())
    utterances = synthesized_utterances(args.utterances, args.seed)
    features, feature_lens = batch_of(utterances)
    features, feature_lens = features.to(args.device), feature_lens.to(args.device)
    targets = model.encode_texts([u.text for u in utterances])
    target_lengths = torch.tensor([len(t) for t in targets], device=args.device)
    padded = torch.zeros(len(targets), int(target_lengths.max()), dtype=torch.long, device=args.device)
    for n, target in enumerate(targets):
        padded[n, :len(target)] = torch.tensor(target)

    def step() -> tuple[float, int]:
        synchronize(args.device)
        started = time.perf_counter()
        states, lens = model.ctc_states(features, feature_lens)  # BF16 LLM states
        bias = model.pretrained_bias if model.has_pretrained_bias else None
        loss = loss_of(method, states.float(), model.head_weight, bias, model.blank_offset, padded, lens,
                       target_lengths, args.chunk_size)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(args.device)
        return time.perf_counter() - started, int(lens.sum())

    for _ in range(args.warmup):
        step()
    measured = []
    for _ in range(args.runs):
        baseline = memory_mb(args.device, peak=False)
        reset_peak(args.device)
        seconds, frames = step()
        measured.append((seconds, memory_mb(args.device, peak=True), baseline))
    return dict(part="full-step", method=method, vocab_size=model.head_weight.shape[0], frames=frames,
                dim=model.hidden_size, head_dtype=str(model.head_weight.dtype).replace("torch.", ""),
                utterances=len(utterances), time_s=statistics.median(m[0] for m in measured),
                times_s=" ".join(f"{m[0]:.3f}" for m in measured),
                peak_mb=round(max(m[1] for m in measured), 1),
                peak_extra_mb=round(max(m[1] - m[2] for m in measured), 1),
                load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()))


def child_arguments(args, method: str) -> list[str]:
    arguments = [__file__, "--single", method, "--part", args.part, "--frames", str(args.frames),
                 "--dim", str(args.dim), "--chunk-size", str(args.chunk_size), "--warmup", str(args.warmup),
                 "--runs", str(args.runs), "--device", args.device, "--seed", str(args.seed),
                 "--threads", str(args.threads), "--utterances", str(args.utterances),
                 "--lora-rank", str(args.lora_rank)]
    for name in ("hidden_size", "layers", "intermediate_size", "heads", "kv_heads", "head_dim",
                 "encoder_preset", "projector_stack", "projector_hidden", "readout"):
        arguments += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return arguments


def write_results(rows: list[dict], args) -> None:
    suffix = f"{args.part}_{args.device}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"{suffix}.csv")
    by_method = {r["method"]: r for r in rows if not r.get("failed")}
    lines = [f"# Frozen BF16 151,936-class head: {args.part} (paper App. C.3)", "", *provenance_lines(args.device), ""]
    if args.part == "head-loss":
        lines += [f"M = {args.frames:,} frames ({args.frames // 100} utterances of 100 frames), D = {args.dim:,}, "
                  f"V = {QWEN3_HEAD_ROWS:,}, chunk width {args.chunk_size}; each method in a fresh process; "
                  "memory: peak above the resident head and inputs.", "",
                  "| method | time (s) | peak above head + inputs (MB) | standard / method memory | loss "
                  "| paper 8B (GiB) | paper 14B (GiB) |", "|---|---|---|---|---|---|---|"]
        column = "peak_extra_mb"
    else:
        lines += ["Model: random LLM-CTC from config (BF16 Qwen3 layers with LoRA, frozen head; see the CSV for "
                  f"its size): {args.layers} layers, D = {args.hidden_size}, LoRA rank {args.lora_rank}, "
                  f"{args.utterances} synthesized utterances per step; AdamW.", "",
                  "| method | time (s) | peak, whole process (MB) | peak above the resident set (MB) "
                  "| standard / method (above resident) | paper 8B full step (GiB, s) | paper 14B (GiB, s) |",
                  "|---|---|---|---|---|---|---|"]
        column = "peak_extra_mb"
    standard = by_method.get("standard", {}).get(column)
    for method in METHODS:
        row = by_method.get(method)
        eight, fourteen = PAPER[method]
        if row is None:
            lines.append(f"| {method} | failed | | | | | |")
            continue
        ratio = f"{standard / row[column]:.1f}x" if standard and row[column] > 0 else ""
        if args.part == "head-loss":
            lines.append(f"| {method} | {row['time_s']:.2f} | {row[column]:,.0f} | {ratio} | {row['loss']:.4f} "
                         f"| {eight[0]} | {fourteen[0]} |")
        else:
            lines.append(f"| {method} | {row['time_s']:.2f} | {row['peak_mb']:,.0f} | {row[column]:,.0f} | {ratio} "
                         f"| {eight[1]}, {eight[2]} | {fourteen[1]}, {fourteen[2]} |")
    lines += ["", "Load averages (1/5/15 min) at the end of each method: "
              + "; ".join(f"{r['method']} {r.get('load_average', '')}" for r in rows)]
    failures = [r for r in rows if r.get("failed")]
    lines += [f"- {r['method']}: {r['reason']}" for r in failures]
    write_text("\n".join(lines) + "\n", args.output_dir / f"results_{suffix}.md")


def parse_args(argv=None):
    from llm_analysis_support import add_model_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["head-loss", "full-step"], default="head-loss")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--frames", type=int, default=4000, help="head-loss: M (a multiple of 100)")
    parser.add_argument("--dim", type=int, default=1024, help="head-loss: D")
    parser.add_argument("--utterances", type=int, default=16, help="full-step: utterances per step")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/frozen_head"))
    parser.add_argument("--single", help=argparse.SUPPRESS)
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.frames < 100 or args.frames % 100:
        parser.error(f"--frames must be a positive multiple of 100 (utterances of 100 frames), got {args.frames}")
    for name in ("dim", "utterances", "chunk_size", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.single:
        if args.device == "cpu":
            unmap_freed_blocks()
        single = head_loss_single if args.part == "head-loss" else full_step_single
        print_result(single(args.single, args))
        return
    rows = []
    for method in args.methods:
        print(f"{args.part}: {method}, load {os.getloadavg()[0]:.2f}", flush=True)
        result, completed = run_fresh(child_arguments(args, method), dict(FIXED_MMAP_THRESHOLD, HF_HUB_OFFLINE="1"))
        if result is None:
            out_of_memory, reason = failure_reason(completed.returncode, completed.stderr)
            print(completed.stderr[-3000:], flush=True)
            result = dict(part=args.part, method=method, failed=True, out_of_memory=out_of_memory, reason=reason)
        rows.append(result)
        print(result, flush=True)
    write_results(rows, args)
    print((args.output_dir / f"results_{args.part}_{args.device}.md").read_text())


if __name__ == "__main__":
    main()
