"""Head + CTC loss, forward and backward: standard CTC vs Pruned CTC (paper Fig. 3, App. C).

Synthetic batches as in App. C.2: utterances of exactly 100 encoder frames (M / 100 of
them), D = 512, about 25 target tokens per utterance with ids drawn from a Zipf-like
distribution. Methods: ``standard`` (logits, log_softmax, torch CTC), ``unpruned``
(Pruned CTC, beam None) and ``pruned`` (beam 100). The frozen LLM head (App. C.3) is
measured by ``python -m benchmarks.frozen_head``.

Memory (App. C.1): every (method, V, M) runs in a fresh process, measured after the
warm-up and the timed runs, in one more forward and backward. It is the peak above the
resident head and inputs with their gradients cleared; on CPU the peak resident set size
(read from /proc/self/status after resetting the peak, with glibc's mmap threshold fixed
so that freed blocks leave the resident set), on CUDA ``max_memory_allocated``.
``peak_extra_mb`` (reported first, the paper's measure) includes the (V, D) weight
gradient; ``activation_mb`` subtracts the weight and bias gradients only where they
exist at the peak: standard CTC allocates them in the backward, so where its peak is in
the forward (``forward_extra_mb``) nothing is subtracted; Pruned CTC with reduction
"sum" forms them during the forward. Time: median of ``--runs`` after ``--warmup`` runs,
synchronized at both ends on CUDA; the 1-minute load average at the start and end of each
configuration is kept beside it (this machine is shared).

Also times the alignment DP alone (``--dp``): the finite-beam DP of ``pruned_ctc`` against
torch's native CTC forward and backward on the same reduced (M, K) input, the methods
interleaved round by round (so that a change of load hits them alike), medians of
``--dp-runs`` rounds, and the DP's own peak memory. ``--only-dp`` refreshes just that
section of the results file.

Out of memory: a configuration whose process fails for lack of memory (CUDA "out of
memory", CPU "can't allocate memory", MemoryError, or killed by SIGKILL, as by the
kernel's OOM killer) is kept as an OOM row (``oom`` True), and, as in App. C.2, its time
and memory are extrapolated by a least-squares line in V through the four largest
feasible vocabularies of the same method and M (``extrapolated`` True; with fewer than
two feasible points it is only marked). ``--memory-limit-mb N`` emulates a smaller
device: on CPU it caps each child's address space (RLIMIT_AS, which includes the ~0.6 GB
that Python and torch map before any tensor), on CUDA it sets the per-process memory
fraction to N MB.

The paper's protocol on CPU (the committed results, from the repository root):
    python -m benchmarks.head_loss --frames 2000 4000 \\
        --vocab-sizes 500 2000 5000 10000 20000 50000 100000 --methods standard pruned --dp-runs 7
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.head_loss.out_of_memory import FIT_POINTS, extrapolate_oom_rows, oom_row
from benchmarks.head_loss.report import write_outputs
from benchmarks.support import (FIXED_MMAP_THRESHOLD, FRAMES_PER_UTTERANCE, failure_reason,
                                head_batch, interleaved_times, limit_address_space, memory_mb,
                                print_result, reset_peak, run_fresh, synchronize,
                                unmap_freed_blocks)

METHODS = ("standard", "unpruned", "pruned")
DP_VOCAB_SIZE = 20000


def trainable_head_batch(vocab_size: int, num_frames: int, dim: int, device: str):
    """App. C.2's synthetic batch with the head input, weight and bias trainable."""
    batch = head_batch(vocab_size, num_frames, dim, device)
    for tensor in batch[:3]:
        tensor.requires_grad_(True)
    return batch


def run_single(method: str, vocab_size: int, num_frames: int, dim: int, chunk_size: int,
               device: str, warmup: int, runs: int) -> dict:
    """One configuration in this process: times, then the peaks of one more step."""
    from pruned_ctc import DEFAULT_BEAM, pruned_ctc_loss, standard_ctc_loss

    load_start = os.getloadavg()[0]
    encoder_out, weight, bias, targets, frame_counts, target_lengths = trainable_head_batch(
        vocab_size, num_frames, dim, device)
    if method == "standard":
        loss_function, options = standard_ctc_loss, {}
    else:
        loss_function = pruned_ctc_loss
        options = dict(chunk_size=chunk_size,
                       beam=None if method == "unpruned" else DEFAULT_BEAM)
    parameters = (encoder_out, weight, bias)

    def forward():
        return loss_function(encoder_out, weight, bias, targets, frame_counts,
                             target_lengths=target_lengths, **options)

    def step() -> float:
        for tensor in parameters:
            tensor.grad = None
        synchronize(device)
        start = time.perf_counter()
        forward().backward()
        synchronize(device)
        return time.perf_counter() - start

    for _ in range(warmup):  # also brings up one-time allocator and BLAS workspaces
        step()
    times = [step() for _ in range(runs)]
    for tensor in parameters:
        tensor.grad = None
    baseline = memory_mb(device, peak=False)
    reset_peak(device)
    loss = forward()
    forward_peak = memory_mb(device, peak=True)
    loss.backward()
    peak = memory_mb(device, peak=True)
    gradient_mb = sum(t.numel() * t.element_size() for t in (weight, bias)) / 2 ** 20
    # Pruned CTC's scalar reductions form the head's gradients during the forward pass.
    gradient_in_forward = gradient_mb if method != "standard" else 0.0
    activation = max(forward_peak - baseline - gradient_in_forward,
                     peak - baseline - gradient_mb)
    num_selected = int(torch.unique(targets).numel()) + 1  # targets never hold blank
    return dict(method=method, vocab_size=vocab_size, frames=num_frames, dim=dim,
                chunk_size=chunk_size if method != "standard" else "",
                selected_classes=num_selected, time_s=statistics.median(times),
                times_s=" ".join(f"{t:.4f}" for t in times),
                peak_extra_mb=round(peak - baseline, 1),
                forward_extra_mb=round(forward_peak - baseline, 1),
                activation_mb=round(activation, 1), gradient_mb=round(gradient_mb, 1),
                load_start=load_start, load_end=os.getloadavg()[0], oom=False,
                extrapolated=False)


def run_interleaved(methods: list[str], vocab_size: int, num_frames: int, dim: int,
                    chunk_size: int, device: str, rounds: int) -> dict:
    """Times the methods alternately on the same inputs in one process, ``rounds`` times
    after one warm-up each: a change of load hits them alike. Returns the median time of
    each method and the median over rounds of each method's time over standard CTC's."""
    from pruned_ctc import DEFAULT_BEAM, pruned_ctc_loss, standard_ctc_loss

    encoder_out, weight, bias, targets, frame_counts, target_lengths = trainable_head_batch(
        vocab_size, num_frames, dim, device)
    functions = {"standard": (standard_ctc_loss, {}),
                 "unpruned": (pruned_ctc_loss, dict(chunk_size=chunk_size, beam=None)),
                 "pruned": (pruned_ctc_loss, dict(chunk_size=chunk_size, beam=DEFAULT_BEAM))}

    def step(method: str) -> float:
        loss_function, options = functions[method]
        for tensor in (encoder_out, weight, bias):
            tensor.grad = None
        synchronize(device)
        start = time.perf_counter()
        loss_function(encoder_out, weight, bias, targets, frame_counts,
                      target_lengths=target_lengths, **options).backward()
        synchronize(device)
        return time.perf_counter() - start

    row = dict(vocab_size=vocab_size, frames=num_frames, dim=dim)
    row.update(interleaved_times({m: functools.partial(step, m) for m in methods}, rounds,
                                 reference="standard"))
    return row


def run_dp(num_frames: int, vocab_size: int, device: str, runs: int) -> dict:
    """The finite-beam DP vs torch's native CTC on the same reduced (M, K) input."""
    from pruned_ctc import DEFAULT_BEAM, ReducedBatch, alignment_loss, reduce_vocabulary

    if device == "cpu":
        unmap_freed_blocks()  # so that the resident set follows the DP's live tensors
    encoder_out, weight, bias, targets, frame_counts, target_lengths = head_batch(
        vocab_size, num_frames, 4, device)
    with torch.no_grad():
        batch = reduce_vocabulary(encoder_out, weight, bias, targets, frame_counts,
                                  target_lengths=target_lengths).batch
    num_selected = batch.selected_classes.numel()
    generator = torch.Generator().manual_seed(1)
    selected_log_probs = (torch.randn(num_frames, num_selected, generator=generator) * 2
                          ).log_softmax(-1).to(device)

    def ours(beam):
        reduced = ReducedBatch(selected_log_probs.detach().requires_grad_(True), batch)
        alignment_loss(reduced, beam=beam).backward()

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
               "dp_beam100_s": lambda: ours(DEFAULT_BEAM), "dp_exact_s": lambda: ours(None)}
    times = {name: [] for name in methods}
    load_before = os.getloadavg()[0]
    for name, function in methods.items():
        function()
    baseline = memory_mb(device, peak=False)
    reset_peak(device)
    ours(DEFAULT_BEAM)
    dp_peak_mb = memory_mb(device, peak=True) - baseline
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
               dp_peak_mb=round(dp_peak_mb, 1), runs=runs, load_before=load_before,
               load_after=os.getloadavg()[0])
    return row


def parse_args():
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--vocab-sizes", type=int, nargs="+",
                        default=[500, 2000, 5000, 10000, 20000, 50000, 100000])
    parser.add_argument("--frames", type=int, nargs="+", default=[2000, 4000],
                        help="M, total frames per batch (multiples of 100)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="Pruned CTC's C (default: pruned_ctc.DEFAULT_CHUNK_SIZE)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dp", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the alignment DP against torch's CTC")
    parser.add_argument("--dp-runs", type=int, default=15,
                        help="interleaved rounds of the DP timing (medians)")
    parser.add_argument("--only-dp", action="store_true",
                        help=f"time only the DP (V = {DP_VOCAB_SIZE:,}, each --frames) and "
                        "replace the DP section of an existing results file, keeping its grid")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/head_loss"))
    parser.add_argument("--memory-limit-mb", type=int, default=None,
                        help="emulate a smaller device: cap each configuration's process at "
                        "N MB (CPU: address space, including ~0.6 GB for Python and torch; "
                        "CUDA: per-process memory fraction); failures are marked OOM")
    parser.add_argument("--interleave-rounds", type=int, default=0,
                        help="also time the methods alternately in one fresh process per "
                        "(V, M), this many rounds (the fairest time ratio on a shared machine)")
    parser.add_argument("--single", help=argparse.SUPPRESS)
    parser.add_argument("--interleaved", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    for frames in args.frames:
        if frames % FRAMES_PER_UTTERANCE:
            parser.error(f"--frames {frames}: must be a multiple of {FRAMES_PER_UTTERANCE}")
    if args.chunk_size is None:
        from pruned_ctc import DEFAULT_CHUNK_SIZE
        args.chunk_size = DEFAULT_CHUNK_SIZE
    results = args.output_dir / f"results_{args.device}.md"
    if args.only_dp and not results.exists():
        parser.error(f"--only-dp: {results} does not exist (run the full grid first)")
    return args


def child_arguments(args, method: str, vocab_size: int, frames: int) -> list[str]:
    arguments = ["--single", f"{method},{vocab_size},{frames}", "--device",
                 args.device, "--dim", str(args.dim), "--chunk-size", str(args.chunk_size),
                 "--warmup", str(args.warmup), "--runs", str(args.runs)]
    if args.memory_limit_mb is not None:
        arguments += ["--memory-limit-mb", str(args.memory_limit_mb)]
    return arguments


def main() -> None:
    args = parse_args()
    if args.single:
        if args.memory_limit_mb is not None and args.device == "cuda":
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, args.memory_limit_mb * 2 ** 20 / total))
        method, vocab_size, frames = args.single.split(",")
        print_result(run_single(method, int(vocab_size), int(frames), args.dim,
                                args.chunk_size, args.device, args.warmup, args.runs))
        return
    if args.interleaved:
        vocab_size, frames = args.interleaved.split(",")
        print_result(run_interleaved(args.methods, int(vocab_size), int(frames), args.dim,
                                     args.chunk_size, args.device, args.interleave_rounds))
        return

    # Methods innermost: each V's methods run back to back, under about the same load.
    configurations = [] if args.only_dp else [
        (m, v, f) for f in args.frames for v in args.vocab_sizes for m in args.methods]
    rows = []
    started = time.time()
    for index, (method, vocab_size, frames) in enumerate(configurations, 1):
        preexec = None
        if args.memory_limit_mb is not None and args.device == "cpu":
            preexec = limit_address_space(args.memory_limit_mb)
        row, completed = run_fresh(__package__, child_arguments(args, method, vocab_size, frames),
                                   FIXED_MMAP_THRESHOLD, preexec)
        if row is None:
            out_of_memory, reason = failure_reason(completed.returncode, completed.stderr)
            if out_of_memory:
                rows.append(oom_row(method, vocab_size, frames, args.dim, args.chunk_size))
            print(f"[{index}/{len(configurations)}] {method} V={vocab_size} M={frames}: "
                  f"{reason}" + (" (marked OOM)" if out_of_memory else ", skipped"), flush=True)
            continue
        rows.append(row)
        elapsed = time.time() - started
        eta = elapsed / index * (len(configurations) - index)
        print(f"[{index}/{len(configurations)}] {method:9s} V={vocab_size:>6} M={frames}: "
              f"{row['time_s']:.3f} s, {row['peak_extra_mb']:.0f} MB peak "
              f"({row['activation_mb']:.0f} MB activation-only), load "
              f"{row['load_start']:.1f}-{row['load_end']:.1f} "
              f"(elapsed {elapsed:.0f} s, ETA {eta:.0f} s)", flush=True)
    interleaved_rows = []
    for frames, vocab_size in ([] if args.only_dp or not args.interleave_rounds else
                               [(f, v) for f in args.frames for v in args.vocab_sizes]):
        arguments = child_arguments(args, "-", vocab_size, frames)
        arguments[0:2] = ["--interleaved", f"{vocab_size},{frames}"]
        arguments += ["--methods", *args.methods, "--interleave-rounds",
                      str(args.interleave_rounds)]
        row, completed = run_fresh(__package__, arguments, FIXED_MMAP_THRESHOLD)
        if row is None:
            print(f"interleaved V={vocab_size} M={frames}: "
                  f"{failure_reason(completed.returncode, completed.stderr)[1]}", flush=True)
            continue
        interleaved_rows.append(row)
        print(f"interleaved V={vocab_size} M={frames}: {row}", flush=True)
    dp_rows = []
    if args.dp or args.only_dp:
        for frames in args.frames:
            dp_rows.append(run_dp(frames, DP_VOCAB_SIZE, args.device, args.dp_runs))
            print(f"DP M={frames}: {dp_rows[-1]}", flush=True)
    extrapolate_oom_rows(rows)
    write_outputs(rows, dp_rows, args, FIT_POINTS, interleaved_rows)
    print(f"wrote {args.output_dir}/results_{args.device}.md")


if __name__ == "__main__":
    main()
