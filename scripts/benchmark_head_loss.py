#!/usr/bin/env python3
"""Head + CTC loss, forward and backward: standard CTC vs Pruned CTC (paper Fig. 3, App. D).

Synthetic batches as in App. D.2: utterances of exactly 100 encoder frames (M / 100 of
them), D = 512, about 25 target tokens per utterance with ids drawn from a Zipf-like
distribution. Methods: ``standard`` (logits, log_softmax, torch CTC), ``unpruned``
(Pruned CTC, beam None) and ``pruned`` (beam 100).

Memory: every (method, V, M) runs in a fresh process, measured after the warm-up. On CPU,
the peak resident set size above the baseline (torch loaded, head parameters and inputs
resident), read from /proc/self/status after resetting the peak, with glibc's mmap
threshold fixed so that freed blocks leave the resident set; on CUDA, ``max_memory_allocated`` above the
same baseline. ``peak_extra_mb`` includes the (V, D) weight gradient that every method
must produce; ``activation_mb`` subtracts it (and the bias gradient): the memory a method
needs beyond the gradient itself. Time: median of ``--runs`` after ``--warmup`` runs,
synchronized at both ends on CUDA.

Also times the alignment DP alone (``--dp``): the finite-beam DP of ``pruned_ctc`` against
torch's native CTC forward and backward on the same reduced (M, K) input, the methods
interleaved round by round (so that a change of load hits them alike), medians of
``--dp-runs`` rounds. ``--only-dp`` refreshes just that section of the results file.

Out of memory: a configuration whose process fails for lack of memory (CUDA "out of
memory", CPU "can't allocate memory", MemoryError, or killed by SIGKILL, as by the
kernel's OOM killer) is kept as an OOM row (``oom`` True), and, as in App. D.2, its time
and memory are extrapolated by a least-squares line in V through the four largest
feasible vocabularies of the same method and M (``extrapolated`` True; with fewer than
two feasible points it is only marked). The table shows "OOM (~X MB, ~Y s
extrapolated)", the plot draws those points hollow on dashed lines. Other failures are
printed and skipped. ``--memory-limit-mb N`` emulates a smaller device: on CPU it caps
each child's address space (RLIMIT_AS, which includes the ~0.6 GB that Python and torch
map before any tensor), on CUDA it sets the per-process memory fraction to N MB.

Example (CPU grid of the committed results):
    python scripts/benchmark_head_loss.py --output-dir benchmarks/head_loss
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import provenance_lines, write_csv, write_text  # noqa: E402

METHODS = ("standard", "unpruned", "pruned")
FRAMES_PER_UTTERANCE = 100
TOKENS_PER_UTTERANCE = 25


OOM_MARKERS = ("out of memory", "outofmemoryerror", "can't allocate memory",
               "cannot allocate memory", "memoryerror", "std::bad_alloc")
EXTRAPOLATED_FIELDS = ("time_s", "peak_extra_mb", "activation_mb")
FIT_POINTS = 4


def failure_reason(returncode: int, stderr: str) -> tuple[bool, str]:
    """(out of memory?, reason) for a child process that failed."""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else (
            str(-returncode))
        # SIGKILL is what the kernel's OOM killer sends.
        return -returncode == signal.SIGKILL, f"killed by {name}"
    lowered = stderr.lower()
    if any(marker in lowered for marker in OOM_MARKERS):
        return True, "out of memory"
    return False, (stderr.strip().splitlines() or [f"failed (exit status {returncode})"])[-1]


def extrapolate_linear(vs, ys, v: float) -> float:
    """Least-squares line y = a v + b through (vs, ys), evaluated at v (>= 2 points)."""
    if len(vs) != len(ys) or len(vs) < 2:
        raise ValueError("extrapolate_linear needs at least two (v, y) points")
    mean_v = sum(vs) / len(vs)
    mean_y = sum(ys) / len(ys)
    spread = sum((x - mean_v) ** 2 for x in vs)
    if spread == 0:
        raise ValueError("extrapolate_linear needs at least two distinct v")
    slope = sum((x - mean_v) * (y - mean_y) for x, y in zip(vs, ys)) / spread
    return mean_y + slope * (v - mean_v)


def extrapolate_oom_rows(rows: list[dict]) -> None:
    """Fills the OOM rows' time and memory from the four largest feasible V of their
    (method, M), in place (App. D.2); fewer than two feasible points: left empty."""
    for row in rows:
        if not row["oom"]:
            continue
        feasible = sorted((r for r in rows if not r["oom"] and r["method"] == row["method"]
                           and r["frames"] == row["frames"]),
                          key=lambda r: r["vocab_size"])[-FIT_POINTS:]
        if len({r["vocab_size"] for r in feasible}) < 2:
            continue
        vocab = [r["vocab_size"] for r in feasible]
        for field in EXTRAPOLATED_FIELDS:
            value = extrapolate_linear(vocab, [float(r[field]) for r in feasible],
                                       row["vocab_size"])
            row[field] = round(value, 4 if field == "time_s" else 1)
        row["extrapolated"] = True


def oom_row(method: str, vocab_size: int, num_frames: int, dim: int, chunk_size: int) -> dict:
    """A configuration that ran out of memory, same columns as ``run_single``'s rows."""
    return dict(method=method, vocab_size=vocab_size, frames=num_frames, dim=dim,
                chunk_size=chunk_size if method != "standard" else "", selected_classes="",
                time_s="", times_s="", peak_extra_mb="", activation_mb="", oom=True,
                extrapolated=False)


def limit_address_space(megabytes: int):
    """A preexec_fn capping the child's address space at ``megabytes`` MB."""
    def preexec() -> None:
        limit = megabytes * 2 ** 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def make_batch(vocab_size: int, num_frames: int, dim: int, device: str, seed: int = 0):
    """Encoder output (N, 100, D), head (V, D) + (V,), padded targets (N, 25) and lengths."""
    generator = torch.Generator().manual_seed(seed)
    num_utterances = num_frames // FRAMES_PER_UTTERANCE
    encoder_out = torch.randn(num_utterances, FRAMES_PER_UTTERANCE, dim, generator=generator)
    weight = torch.randn(vocab_size, dim, generator=generator) * dim ** -0.5
    bias = torch.zeros(vocab_size)
    # Zipf-like ids: frequency of the r-th non-blank class proportional to 1 / r.
    frequencies = 1.0 / torch.arange(1, vocab_size, dtype=torch.float64)
    targets = torch.multinomial(frequencies, num_utterances * TOKENS_PER_UTTERANCE,
                                replacement=True, generator=generator) + 1
    targets = targets.view(num_utterances, TOKENS_PER_UTTERANCE)
    frame_counts = torch.full((num_utterances,), FRAMES_PER_UTTERANCE, dtype=torch.int64)
    target_lengths = torch.full((num_utterances,), TOKENS_PER_UTTERANCE, dtype=torch.int64)
    return tuple(t.to(device) for t in (encoder_out, weight, bias, targets, frame_counts,
                                        target_lengths))


def cpu_memory_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def reset_cpu_peak() -> None:
    # Writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_single(method: str, vocab_size: int, num_frames: int, dim: int, chunk_size: int,
               device: str, warmup: int, runs: int) -> dict:
    """One configuration in this process: times and peak memory."""
    from pruned_ctc import pruned_ctc_loss, standard_ctc_loss

    encoder_out, weight, bias, targets, frame_counts, target_lengths = make_batch(
        vocab_size, num_frames, dim, device)
    weight.requires_grad_(True)
    bias.requires_grad_(True)
    encoder_out.requires_grad_(True)
    if method == "standard":
        loss_function, options = standard_ctc_loss, {}
    else:
        loss_function = pruned_ctc_loss
        options = dict(chunk_size=chunk_size, beam=None if method == "unpruned" else 100.0)

    def step() -> float:
        for tensor in (encoder_out, weight, bias):
            tensor.grad = None
        synchronize(device)
        start = time.perf_counter()
        loss = loss_function(encoder_out, weight, bias, targets, frame_counts,
                             target_lengths=target_lengths, **options)
        loss.backward()
        synchronize(device)
        return time.perf_counter() - start

    for _ in range(warmup):  # also brings up one-time allocator and BLAS workspaces
        step()
    for tensor in (encoder_out, weight, bias):
        tensor.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated() / 2 ** 20
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = cpu_memory_mb("VmRSS")
        reset_cpu_peak()
    times = [step() for _ in range(runs)]
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        peak = cpu_memory_mb("VmHWM")
    gradient_mb = (weight.numel() + bias.numel()) * weight.element_size() / 2 ** 20
    from pruned_ctc.inputs import prepare_batch
    selected = prepare_batch(encoder_out, vocab_size, targets, frame_counts, target_lengths,
                             0).selected_classes.numel()
    return dict(method=method, vocab_size=vocab_size, frames=num_frames, dim=dim,
                chunk_size=chunk_size if method != "standard" else "",
                selected_classes=selected, time_s=statistics.median(times),
                times_s=" ".join(f"{t:.4f}" for t in times),
                peak_extra_mb=round(peak - baseline, 1),
                activation_mb=round(peak - baseline - gradient_mb, 1), oom=False,
                extrapolated=False)


def run_dp(num_frames: int, vocab_size: int, device: str, runs: int) -> dict:
    """The finite-beam DP vs torch's native CTC on the same reduced (M, K) input."""
    from pruned_ctc.alignment import align
    from pruned_ctc.inputs import prepare_batch

    encoder_out, _, _, targets, frame_counts, target_lengths = make_batch(
        vocab_size, num_frames, 4, device)
    batch = prepare_batch(encoder_out, vocab_size, targets, frame_counts, target_lengths, 0)
    num_selected = batch.selected_classes.numel()
    generator = torch.Generator().manual_seed(1)
    selected_log_probs = (torch.randn(num_frames, num_selected, generator=generator) * 2
                          ).log_softmax(-1).to(device)
    offsets = torch.cumsum(frame_counts, 0) - frame_counts

    def ours(beam):
        align(selected_log_probs, offsets, frame_counts, batch.relabeled_targets,
              batch.target_lengths, batch.alignable, beam, True)

    def native():
        log_probs = selected_log_probs.view(-1, FRAMES_PER_UTTERANCE, num_selected)
        log_probs = log_probs.transpose(0, 1).detach().requires_grad_(True)
        F.ctc_loss(log_probs, batch.relabeled_targets, frame_counts, batch.target_lengths,
                   reduction="sum").backward()

    def native_one_thread():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            native()
        finally:
            torch.set_num_threads(threads)

    methods = {"torch_ctc_s": native, "torch_ctc_one_thread_s": native_one_thread,
               "dp_beam100_s": lambda: ours(100.0), "dp_exact_s": lambda: ours(None)}
    times = {name: [] for name in methods}
    load_before = os.getloadavg()[0]
    for name, function in methods.items():
        function()
    for _ in range(runs):
        for name, function in methods.items():
            synchronize(device)
            start = time.perf_counter()
            function()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    row = dict(frames=num_frames, vocab_size=vocab_size, selected_classes=num_selected)
    row.update({name: statistics.median(values) for name, values in times.items()})
    row.update(ratio_beam100=row["dp_beam100_s"] / row["torch_ctc_s"],
               ratio_exact=row["dp_exact_s"] / row["torch_ctc_s"],
               ratio_beam100_one_thread=row["dp_beam100_s"] / row["torch_ctc_one_thread_s"],
               runs=runs, load_before=load_before, load_after=os.getloadavg()[0])
    return row


DP_HEADING = "## Alignment DP alone vs torch's native CTC (same reduced (M, K) input)"


def dp_section(dp_rows: list[dict], device: str, only_dp: bool) -> list[str]:
    lines = ["", DP_HEADING, ""]
    if only_dp:
        lines += ["Refreshed alone (`--only-dp`): the tables above come from an earlier full "
                  "run, measured under the load of their own Machine line.", ""]
        lines += provenance_lines(device) + [""]
    threads = torch.get_num_threads()
    lines += [f"Medians of {dp_rows[0]['runs']} rounds, the four methods interleaved in each "
              f"round. Ours runs on one intra-op thread (CPU); torch's CTC on {threads} "
              "(\"torch CTC\") and on one. Ratios = ours, beam 100 / torch CTC.", "",
              "| M | K | torch CTC (s) | torch CTC, 1 thread (s) | ours, beam 100 (s) | "
              "ours, exact (s) | ratio beam 100 | ratio exact | ratio beam 100 vs 1 thread | "
              "1-min load before / after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in dp_rows:
        lines.append(f"| {r['frames']} | {r['selected_classes']} | {r['torch_ctc_s']:.4f} | "
                     f"{r['torch_ctc_one_thread_s']:.4f} | {r['dp_beam100_s']:.4f} | "
                     f"{r['dp_exact_s']:.4f} | {r['ratio_beam100']:.2f} | "
                     f"{r['ratio_exact']:.2f} | {r['ratio_beam100_one_thread']:.2f} | "
                     f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    return lines


def write_outputs(rows: list[dict], dp_rows: list[dict], output_dir: Path,
                  device: str, only_dp: bool = False) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, table in (("head_loss", rows), ("dp", dp_rows)):
        if table:
            write_csv(table, output_dir / f"{name}_{device}.csv")
    results = output_dir / f"results_{device}.md"
    if only_dp:
        # Keeps the grid part (with its own provenance) of an earlier full run.
        kept = results.read_text().split("\n" + DP_HEADING)[0].rstrip("\n").splitlines()
        write_text("\n".join(kept + dp_section(dp_rows, device, True)) + "\n", results)
        return

    lines = [f"# Head + CTC loss, forward + backward ({device})", ""] + provenance_lines(device) + [""]
    if rows:
        by_key = {(r["frames"], r["vocab_size"], r["method"]): r for r in rows}

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

        def memory_cell(row) -> str:
            if row is None:
                return "-"
            if row["oom"]:
                return f"~{row['activation_mb']:.0f} (OOM)" if row["extrapolated"] else "OOM"
            return f"{row['activation_mb']:.0f}"

        def ratio_cell(numerator, denominator, field: str, floor: float = 0.0) -> str:
            if not (known(numerator) and known(denominator)):
                return "-"
            approximate = "~" if numerator["oom"] or denominator["oom"] else ""
            value = numerator[field] / max(denominator[field], floor or 1e-12)
            return f"{approximate}{value:.{2 if field == 'time_s' else 1}f}"

        lines += ["| M | V | K | standard time (s) | pruned time (s) | unpruned time (s) | "
                  "pruned / standard time | standard activation (MB) | pruned activation (MB) "
                  "| unpruned activation (MB) | standard / pruned memory |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for frames, vocab_size in sorted({(r["frames"], r["vocab_size"]) for r in rows}):
            standard = by_key.get((frames, vocab_size, "standard"))
            pruned = by_key.get((frames, vocab_size, "pruned"))
            unpruned = by_key.get((frames, vocab_size, "unpruned"))
            selected = next((r["selected_classes"] for r in (pruned, unpruned)
                             if r is not None and not r["oom"]), "-")
            lines.append(
                f"| {frames} | {vocab_size} | {selected} | {time_cell(standard)} | "
                f"{time_cell(pruned)} | {time_cell(unpruned)} | "
                f"{ratio_cell(pruned, standard, 'time_s')} | {memory_cell(standard)} | "
                f"{memory_cell(pruned)} | {memory_cell(unpruned)} | "
                f"{ratio_cell(standard, pruned, 'activation_mb', 1e-9)} |")
        lines += ["", "Activation = peak extra memory minus the (V, D) weight gradient and the "
                  "bias gradient, which every method produces. Full columns in the CSV."]
        if any(r["oom"] for r in rows):
            lines += ["", "OOM: the configuration ran out of memory; \"~\" values are "
                      f"extrapolated by a least-squares line in V through the {FIT_POINTS} "
                      "largest feasible vocabularies of the same method and M (App. D.2)."]
        lines += ["",
                  "Standard CTC's peak extra memory (gradient included) against the paper's "
                  "memory model, 4MV + 640M FP32 values (App. D.2):", "",
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
        for method in METHODS:
            points = sorted((r["vocab_size"], r["activation_mb"], r["time_s"], r["oom"])
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
        axes[0][column].set_ylabel("memory above gradient (GiB)")
        axes[1][column].set_ylabel("time, forward + backward (s)")
        axes[1][column].set_xlabel("vocabulary size V (thousands)")
        for axis in axes[:, column]:
            axis.grid(alpha=0.3)
            axis.legend()
    figure.tight_layout()
    temporary = path.with_name("." + path.name + ".tmp.png")
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--vocab-sizes", type=int, nargs="+",
                        default=[500, 2000, 5000, 10000, 20000, 50000, 100000])
    parser.add_argument("--frames", type=int, nargs="+", default=[2000, 4000],
                        help="M, total frames per batch (multiples of 100)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dp", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the alignment DP against torch's CTC")
    parser.add_argument("--dp-runs", type=int, default=15,
                        help="interleaved rounds of the DP timing (medians)")
    parser.add_argument("--only-dp", action="store_true",
                        help="time only the DP (V = 20,000, each --frames) and replace the DP "
                        "section of an existing results file, keeping its grid")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/head_loss"))
    parser.add_argument("--memory-limit-mb", type=int, default=None,
                        help="emulate a smaller device: cap each configuration's process at "
                        "N MB (CPU: address space, including ~0.6 GB for Python and torch; "
                        "CUDA: per-process memory fraction); failures are marked OOM")
    parser.add_argument("--single", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    for frames in args.frames:
        if frames % FRAMES_PER_UTTERANCE:
            parser.error(f"--frames {frames}: must be a multiple of {FRAMES_PER_UTTERANCE}")

    if args.single:
        if args.memory_limit_mb is not None and args.device == "cuda":
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, args.memory_limit_mb * 2 ** 20 / total))
        method, vocab_size, frames = args.single.split(",")
        result = run_single(method, int(vocab_size), int(frames), args.dim, args.chunk_size,
                            args.device, args.warmup, args.runs)
        print("RESULT " + json.dumps(result))
        return

    results = args.output_dir / f"results_{args.device}.md"
    if args.only_dp and not results.exists():
        parser.error(f"--only-dp: {results} does not exist (run the full grid first)")
    configurations = [] if args.only_dp else [
        (m, v, f) for f in args.frames for v in args.vocab_sizes for m in args.methods]
    rows = []
    started = time.time()
    for index, (method, vocab_size, frames) in enumerate(configurations, 1):
        child = [sys.executable, __file__, "--single", f"{method},{vocab_size},{frames}",
                 "--device", args.device, "--dim", str(args.dim), "--chunk-size",
                 str(args.chunk_size), "--warmup", str(args.warmup), "--runs", str(args.runs)]
        preexec = None
        if args.memory_limit_mb is not None:
            child += ["--memory-limit-mb", str(args.memory_limit_mb)]
            if args.device == "cpu":
                preexec = limit_address_space(args.memory_limit_mb)
        # A fixed mmap threshold makes glibc return every large block to the system when
        # it is freed, so that the resident set size follows the live tensors.
        environment = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
        completed = subprocess.run(child, capture_output=True, text=True, env=environment,
                                   preexec_fn=preexec)
        results = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
        if completed.returncode != 0 or not results:
            out_of_memory, reason = failure_reason(completed.returncode, completed.stderr)
            if out_of_memory:
                rows.append(oom_row(method, vocab_size, frames, args.dim, args.chunk_size))
            print(f"[{index}/{len(configurations)}] {method} V={vocab_size} M={frames}: "
                  f"{reason}" + (" (marked OOM)" if out_of_memory else ", skipped"), flush=True)
            continue
        row = json.loads(results[0][len("RESULT "):])
        rows.append(row)
        elapsed = time.time() - started
        eta = elapsed / index * (len(configurations) - index)
        print(f"[{index}/{len(configurations)}] {method:9s} V={vocab_size:>6} M={frames}: "
              f"{row['time_s']:.3f} s, {row['activation_mb']:.0f} MB above gradient "
              f"(elapsed {elapsed:.0f} s, ETA {eta:.0f} s)", flush=True)
    dp_rows = []
    if args.dp or args.only_dp:
        for frames in args.frames:
            dp_rows.append(run_dp(frames, 20000, args.device, args.dp_runs))
            print(f"DP M={frames}: " + json.dumps(dp_rows[-1]), flush=True)
    extrapolate_oom_rows(rows)
    write_outputs(rows, dp_rows, args.output_dir, args.device, args.only_dp)
    print(f"wrote {args.output_dir}/results_{args.device}.md")


if __name__ == "__main__":
    main()
