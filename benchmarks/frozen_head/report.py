"""The results files of the frozen-head benchmark (``python -m benchmarks.frozen_head``):
a CSV of every method's row, a Markdown table beside the paper's App. C.3 numbers, and
for ``--interleave-rounds`` the interleaved times."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from benchmarks.support import provenance_lines, write_csv, write_text

METHODS = ("standard", "unpruned", "pruned")
QWEN3_HEAD_ROWS = 151_936
PAPER = {  # App. C.3 table: (head/loss GiB, full step GiB, seconds per full step), 8B | 14B
    "standard": ((29.21, 56.06, 10.23), (29.79, 72.71, 15.73)),
    "unpruned": ((1.21, 34.67, 11.04), (1.33, 52.82, 16.66)),
    "pruned": ((1.14, 34.67, 11.00), (1.20, 52.84, 16.61)),
}


def file_stem(args) -> str:
    """What was measured: ``head_loss_<head dtype>_<device>`` or ``full_step_<device>``."""
    if args.part == "head-loss":
        return f"head_loss_{args.head_dtype}_{args.device}"
    return f"full_step_{args.device}"


def results_path(args) -> Path:
    return args.output_dir / f"results_{file_stem(args)}.md"


def measured(by_method: dict):
    """(method, row, standard's memory over the method's, paper 8B, paper 14B) of each
    measured method, in METHODS order."""
    standard = by_method.get("standard", {}).get("peak_extra_mb")
    for method in METHODS:
        row = by_method.get(method)
        if row is not None:
            ratio = f"{standard / row['peak_extra_mb']:.1f}x" if standard and row["peak_extra_mb"] > 0 else ""
            yield (method, row, ratio, *PAPER[method])


def head_loss_table(by_method: dict, args) -> list[str]:
    dtype = {"bfloat16": "BF16", "float32": "FP32"}[args.head_dtype]
    lines = [f"M = {args.frames:,} frames ({args.frames // 100} utterances of 100 frames), D = {args.dim:,}, "
             f"V = {QWEN3_HEAD_ROWS:,} stored in {dtype}, chunk width {args.chunk_size}; each method in a fresh "
             "process; memory: peak above the resident head and inputs.", "",
             "| method | time (s) | peak above head + inputs (MB) | standard / method memory | loss "
             "| paper 8B (GiB) | paper 14B (GiB) |", "|---|---|---|---|---|---|---|"]
    for method, row, ratio, eight, fourteen in measured(by_method):
        lines.append(f"| {method} | {row['time_s']:.2f} | {row['peak_extra_mb']:,.0f} | {ratio} | "
                     f"{row['loss']:.4f} | {eight[0]} | {fourteen[0]} |")
    return lines


def full_step_table(by_method: dict, args) -> list[str]:
    lines = ["Model: random LLM-CTC from config (BF16 Qwen3 layers with LoRA, frozen head; see the CSV for "
             f"its size): {args.layers} layers, D = {args.hidden_size}, LoRA rank {args.lora_rank}, "
             f"{args.utterances} synthesized utterances per step; AdamW.", "",
             "| method | time (s) | peak, whole process (MB) | peak above the resident set (MB) "
             "| standard / method (above resident) | paper 8B full step (GiB, s) | paper 14B (GiB, s) |",
             "|---|---|---|---|---|---|---|"]
    for method, row, ratio, eight, fourteen in measured(by_method):
        lines.append(f"| {method} | {row['time_s']:.2f} | {row['peak_mb']:,.0f} | {row['peak_extra_mb']:,.0f} | "
                     f"{ratio} | {eight[1]}, {eight[2]} | {fourteen[1]}, {fourteen[2]} |")
    return lines


def interleaved_lines(row: dict, methods: list[str]) -> list[str]:
    others = [m for m in methods if m != "standard" and f"{m}_over_standard" in row]
    return ["", "## Times interleaved in one process", "",
            f"Each round runs every method once on the same inputs, {row['rounds']} rounds after one "
            "warm-up each, so that a change of load hits the methods alike. Medians of the times and "
            "of the per-round ratios.", "",
            "| " + " | ".join(f"{m} (s)" for m in methods) + " | "
            + " | ".join(f"{m} / standard" for m in others) + " | 1-min load |",
            "|" + "---|" * (len(methods) + len(others) + 1),
            "| " + " | ".join(f"{row[m + '_s']:.3f}" for m in methods) + " | "
            + " | ".join(f"{row[m + '_over_standard']:.2f}" for m in others)
            + f" | {row['load_min']:.1f}-{row['load_max']:.1f} |"]


def write_results(rows: list[dict], interleaved: Optional[dict], args) -> None:
    stem = file_stem(args)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"{stem}.csv")
    by_method = {r["method"]: r for r in rows if not r.get("failed")}
    title = "head and loss" if args.part == "head-loss" else "full training step"
    lines = [f"# Frozen 151,936-row head: {title} (paper App. C.3)", "", *provenance_lines(args.device), ""]
    lines += head_loss_table(by_method, args) if args.part == "head-loss" else full_step_table(by_method, args)
    lines += ["", "Load averages (1/5/15 min) at the end of each method: "
              + "; ".join(f"{r['method']} {r.get('load_average', '')}" for r in rows)]
    lines += [f"- {r['method']}: failed, {r['reason']}" for r in rows if r.get("failed")]
    if interleaved is not None:
        write_csv([interleaved], args.output_dir / f"interleaved_{args.head_dtype}_{args.device}.csv")
        lines += interleaved_lines(interleaved, args.methods)
    write_text("\n".join(lines) + "\n", results_path(args))
