"""The results file and plot of the head-loss benchmark (``python -m benchmarks.head_loss``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from benchmarks.support import provenance_lines, write_csv, write_text

DP_HEADING = "## Alignment DP alone vs torch's native CTC (same reduced (M, K) input)"
METHOD_ORDER = ("standard", "pruned", "unpruned")


def known(row) -> bool:
    return row is not None and (not row["oom"] or row["extrapolated"])


def time_cell(row) -> str:
    if row is None:
        return "-"
    if not row["oom"]:
        return f"{row['time_s']:.3f}"
    if not row["extrapolated"]:
        return "OOM"
    return f"OOM (~{row['activation_mb']:.0f} MB, ~{row['time_s']:.3f} s extrapolated)"


def memory_cell(row, field: str) -> str:
    if row is None:
        return "-"
    if row["oom"]:
        return f"~{row[field]:.0f} (OOM)" if row["extrapolated"] else "OOM"
    return f"{row[field]:.0f}"


def ratio_cell(numerator, denominator, field: str) -> str:
    if not (known(numerator) and known(denominator)):
        return "-"
    approximate = "~" if numerator["oom"] or denominator["oom"] else ""
    value = numerator[field] / max(denominator[field], 1e-9)
    return f"{approximate}{value:.{2 if field == 'time_s' else 1}f}"


def load_cell(*rows) -> str:
    loads = [r[key] for r in rows if r is not None and not r["oom"]
             for key in ("load_start", "load_end")]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"


def dp_section(dp_rows: list[dict], device: str, only_dp: bool) -> list[str]:
    lines = ["", DP_HEADING, ""]
    if only_dp:
        lines += ["Refreshed alone (`--only-dp`): the tables above come from an earlier full "
                  "run, measured under the load of their own Machine line.", ""]
        lines += provenance_lines(device) + [""]
    threads = torch.get_num_threads()
    lines += [f"Medians of {dp_rows[0]['runs']} rounds, the four methods interleaved in each "
              f"round. Ours runs on one intra-op thread (CPU); torch's CTC on {threads} "
              "(\"torch CTC\") and on one. Ratios = ours, beam 100 / torch CTC. DP peak: "
              "the memory of one beam-100 forward and backward of the DP alone (its O(T N L) "
              "storage), part of Pruned CTC's memory floor.", "",
              "| M | K | torch CTC (s) | torch CTC, 1 thread (s) | ours, beam 100 (s) | "
              "ours, exact (s) | ratio beam 100 | ratio exact | ratio beam 100 vs 1 thread | "
              "DP peak (MB) | 1-min load before / after |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in dp_rows:
        lines.append(f"| {r['frames']} | {r['selected_classes']} | {r['torch_ctc_s']:.4f} | "
                     f"{r['torch_ctc_one_thread_s']:.4f} | {r['dp_beam100_s']:.4f} | "
                     f"{r['dp_exact_s']:.4f} | {r['ratio_beam100']:.2f} | "
                     f"{r['ratio_exact']:.2f} | {r['ratio_beam100_one_thread']:.2f} | "
                     f"{r['dp_peak_mb']:.0f} | {r['load_before']:.1f} / {r['load_after']:.1f} |")
    return lines


def grid_section(rows: list[dict], dp_rows: list[dict], fit_points: int) -> list[str]:
    by_key = {(r["frames"], r["vocab_size"], r["method"]): r for r in rows}
    dp_by_frames = {r["frames"]: r for r in dp_rows}
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in rows)]
    others = [m for m in methods if m != "standard"]
    header = ["M", "V", "D", "K"] + [f"{m} time (s)" for m in methods]
    header += [f"{m} / standard time" for m in others]
    header += [f"{m} peak (MB)" for m in methods]
    header += [f"standard / {m} peak" for m in others] + ["1-min load"]
    lines = ["Memory = peak above the resident head and inputs, weight gradient included "
             "(the paper's measure, App. C.1). Load: 1-minute load averages at the start and "
             f"end of the row's processes ({os.cpu_count()} cores here).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keys = sorted({(r["frames"], r["vocab_size"]) for r in rows})
    for frames, vocab_size in keys:
        cells = {m: by_key.get((frames, vocab_size, m)) for m in methods}
        first = next(r for r in cells.values() if r is not None)
        selected = next((r["selected_classes"] for r in cells.values()
                         if r is not None and not r["oom"]), "-")
        line = [f"{frames}", f"{vocab_size}", f"{first['dim']}", f"{selected}"]
        line += [time_cell(cells[m]) for m in methods]
        line += [ratio_cell(cells[m], cells.get("standard"), "time_s") for m in others]
        line += [memory_cell(cells[m], "peak_extra_mb") for m in methods]
        line += [ratio_cell(cells.get("standard"), cells[m], "peak_extra_mb") for m in others]
        line.append(load_cell(*cells.values()))
        lines.append("| " + " | ".join(line) + " |")

    lines += ["", "Activation-only memory: the peak minus the weight and bias gradients where "
              "they exist at the peak (standard CTC allocates them in the backward, so a "
              "forward peak keeps them; Pruned CTC's scalar reductions form them during the "
              "forward). Pruned CTC's floor: its gradients (weight, bias, head input) plus one "
              "block of M C FP32 values plus the DP's peak (section below, same M).", "",
              "| M | V | standard activation-only (MB) | standard peak in | "
              + " | ".join(f"{m} activation-only (MB) | {m} floor (MB) | {m} peak / floor"
                           for m in others) + " |",
              "|---|---|---|---|" + "---|---|---|" * len(others)]
    for frames, vocab_size in keys:
        standard = by_key.get((frames, vocab_size, "standard"))
        where = "-"
        if standard is not None and not standard["oom"]:
            where = ("forward" if standard["forward_extra_mb"] >= standard["peak_extra_mb"]
                     else "backward")
        line = [f"{frames}", f"{vocab_size}", memory_cell(standard, "activation_mb"), where]
        for method in others:
            row = by_key.get((frames, vocab_size, method))
            line.append(memory_cell(row, "activation_mb"))
            dp = dp_by_frames.get(frames)
            if row is None or row["oom"] or dp is None:
                line += ["-", "-"]
                continue
            block_mb = frames * min(int(row["chunk_size"]), vocab_size) * 4 / 2 ** 20
            input_gradient_mb = frames * row["dim"] * 4 / 2 ** 20
            floor = row["gradient_mb"] + input_gradient_mb + block_mb + dp["dp_peak_mb"]
            line += [f"{floor:.0f}", f"{row['peak_extra_mb'] / floor:.2f}"]
        lines.append("| " + " | ".join(line) + " |")
    if any(r["oom"] for r in rows):
        lines += ["", "OOM: the configuration ran out of memory; \"~\" values are "
                  f"extrapolated by a least-squares line in V through the {fit_points} "
                  "largest feasible vocabularies of the same method and M (App. C.2)."]
    lines += ["", "Standard CTC's peak (gradient included) against the paper's memory model, "
              "4MV + 640M FP32 values (App. C.2):", "",
              "| M | V | measured (MB) | model (MB) | measured / model |", "|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["method"] == "standard"),
                    key=lambda r: (r["frames"], r["vocab_size"])):
        model_mb = (4 * r["frames"] * r["vocab_size"] + 640 * r["frames"]) * 4 / 2 ** 20
        if not known(r):
            lines.append(f"| {r['frames']} | {r['vocab_size']} | OOM | {model_mb:.0f} | - |")
            continue
        approximate = "~" if r["oom"] else ""
        measured = f"{approximate}{r['peak_extra_mb']:.0f}" + (" (OOM)" if r["oom"] else "")
        lines.append(f"| {r['frames']} | {r['vocab_size']} | {measured} | "
                     f"{model_mb:.0f} | {approximate}{r['peak_extra_mb'] / model_mb:.3f} |")
    return lines


def interleaved_section(rows: list[dict]) -> list[str]:
    methods = [m for m in METHOD_ORDER if f"{m}_s" in rows[0]]
    others = [m for m in methods if m != "standard"]
    lines = ["", "## Times interleaved in one process", "",
             f"Each round runs every method once on the same inputs, {rows[0]['rounds']} "
             "rounds after one warm-up each, so that a change of load hits the methods alike. "
             "Medians of the times and of the per-round ratios.", "",
             "| M | V | D | " + " | ".join(f"{m} (s)" for m in methods) + " | "
             + " | ".join(f"{m} / standard" for m in others) + " | 1-min load |",
             "|---|---|---|" + "---|" * (len(methods) + len(others) + 1)]
    for r in rows:
        lines.append(f"| {r['frames']} | {r['vocab_size']} | {r['dim']} | "
                     + " | ".join(f"{r[m + '_s']:.3f}" for m in methods) + " | "
                     + " | ".join(f"{r[m + '_over_standard']:.2f}" for m in others)
                     + f" | {r['load_min']:.1f}-{r['load_max']:.1f} |")
    return lines


def write_outputs(rows: list[dict], dp_rows: list[dict], args, fit_points: int,
                  interleaved_rows: list[dict] = ()) -> None:
    output_dir, device = args.output_dir, args.device
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, table in (("head_loss", rows), ("dp", dp_rows),
                        ("interleaved", list(interleaved_rows))):
        if table:
            write_csv(table, output_dir / f"{name}_{device}.csv")
    results = output_dir / f"results_{device}.md"
    if args.only_dp:
        # Keeps the grid part (with its own provenance) of an earlier full run.
        kept = results.read_text().split("\n" + DP_HEADING)[0].rstrip("\n").splitlines()
        write_text("\n".join(kept + dp_section(dp_rows, device, True)) + "\n", results)
        return
    lines = [f"# Head + CTC loss, forward + backward ({device})", ""]
    lines += provenance_lines(device) + [""]
    if rows:
        lines += grid_section(rows, dp_rows, fit_points)
    if interleaved_rows and "standard_s" in interleaved_rows[0]:
        lines += interleaved_section(list(interleaved_rows))
    if dp_rows:
        lines += dp_section(dp_rows, device, False)
    write_text("\n".join(lines) + "\n", results)
    if rows:
        plot(rows, output_dir / f"head_loss_{device}.png", device)


def plot(rows: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame_sizes = sorted({r["frames"] for r in rows})
    figure, axes = plt.subplots(2, len(frame_sizes), figsize=(5 * len(frame_sizes), 7),
                                squeeze=False)
    styles = {"standard": ("tab:red", "o"), "unpruned": ("tab:blue", "s"),
              "pruned": ("tab:green", "^")}
    for column, frames in enumerate(frame_sizes):
        for method in METHOD_ORDER:
            points = sorted((r["vocab_size"], r["peak_extra_mb"], r["time_s"], r["oom"])
                            for r in rows if r["frames"] == frames and r["method"] == method
                            and (not r["oom"] or r["extrapolated"]))
            measured = [p for p in points if not p[3]]
            color, marker = styles[method]
            if measured:
                vocab, memory, seconds, _ = zip(*measured)
                axes[0][column].plot([v / 1000 for v in vocab], [m / 1024 for m in memory],
                                     color=color, marker=marker, label=method)
                axes[1][column].plot([v / 1000 for v in vocab], seconds, color=color,
                                     marker=marker, label=method)
            extrapolated = [p for p in points if p[3]]
            if extrapolated:
                # Hollow markers on a dashed line from the last measured point: OOM.
                vocab, memory, seconds, _ = zip(*(measured[-1:] + extrapolated))
                style = dict(color=color, marker=marker, linestyle="--",
                             markerfacecolor="none", markevery=list(
                                 range(len(vocab) - len(extrapolated), len(vocab))),
                             label=f"{method}, OOM (extrapolated)")
                axes[0][column].plot([v / 1000 for v in vocab], [m / 1024 for m in memory],
                                     **style)
                axes[1][column].plot([v / 1000 for v in vocab], seconds, **style)
        axes[0][column].set_title(f"M = {frames:,} frames ({device})")
        axes[0][column].set_ylabel("peak above head and inputs (GiB)")
        axes[1][column].set_ylabel("time, forward + backward (s)")
        axes[1][column].set_xlabel("vocabulary size V (thousands)")
        for axis in axes[:, column]:
            axis.grid(alpha=0.3)
            axis.legend()
    figure.tight_layout()
    temporary = path.with_name("." + path.name + ".tmp.png")
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)
