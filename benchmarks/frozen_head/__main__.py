"""A frozen 151,936-row LLM head (Qwen3's): memory and time of standard CTC, unpruned
reduced CTC (Pruned CTC with beam None) and Pruned CTC (beam 100), for the head and loss
alone and for a full LLM-CTC training step (paper App. C.3, the SPEAR-Qwen3 memory and
runtime table).

Head and loss (``--part head-loss``, App. C.3 "CTC computation" and "Measurement"): states
X (N, T, D) in FP32 with a gradient, the frozen head W (V, D) stored in ``--head-dtype``
(BF16 as in App. C.3; FP32 for the setting of the trained-head benchmark and of
``python -m benchmarks.head_products --frozen-head``), no gradient and no bias (Qwen3's),
and the learned blank offset eta on the blank logit (a gradient, the loss's
``blank_offset``, which keeps Pruned CTC on its frozen-head column schedule); App. C.2's
synthetic batch shape (utterances of 100 frames, about 25 Zipf targets each). Standard CTC
converts the whole head to FP32, forms (N, T, V) logits, log-softmax and torch's CTC; the
reduced methods convert it in chunks of ``--chunk-size``. Losses are divided by the
batch's target-token count. ``--warmup`` passes, then ``--runs`` measured forward +
backward passes (median time); memory is the peak above the resident head and inputs
after clearing their gradients (CPU: peak resident set; CUDA: ``max_memory_allocated``),
each method in a fresh process. ``--interleave-rounds N`` also times the methods
alternately on the same inputs in one more fresh process, N rounds after one warm-up each
(a change of load hits them alike: the fairest time ratio on a shared machine).

Full step (``--part full-step``): a randomly initialized LLM-CTC from configuration (Qwen3
layers in BF16 with LoRA, its 151,936-row head frozen, a Zipformer encoder, the stack
projector, query readout) on synthesized features: forward, loss, backward, AdamW update
and gradient reset. Memory is the peak of the whole process during the step, resident
model and optimizer included (App. C.1), and the increase over the resident set before
the step; time is the median of ``--runs`` steps after ``--warmup`` steps.

The committed CPU results (D = 1,024, M = 4,000 frames), from the repository root:
    python -m benchmarks.frozen_head --part head-loss --frames 4000 --dim 1024
    python -m benchmarks.frozen_head --part head-loss --head-dtype float32 --threads 2 \\
        --frames 4000 --dim 1024 --methods standard pruned --warmup 1 --runs 2 --interleave-rounds 2
    python -m benchmarks.frozen_head --part full-step --hidden-size 1024 --layers 2 \\
        --utterances 16 --warmup 1 --runs 2
Paper (A100, SPEAR-Qwen3-8B / 14B, M = 11,458, D = 4,096 / 5,120): head-and-loss memory
29.21 / 1.21 / 1.14 GiB (8B) and 29.79 / 1.33 / 1.20 GiB (14B) for standard / unpruned /
pruned, a 24.8-25.7x reduction; full step 56.06 / 34.67 / 34.67 GiB, 10.23 / 11.04 / 11.00 s
(8B).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.frozen_head.report import METHODS, QWEN3_HEAD_ROWS, results_path, write_results
from benchmarks.llm_support import add_model_arguments
from benchmarks.support import (FIXED_MMAP_THRESHOLD, failure_reason, head_batch,
                                interleaved_times, memory_mb, print_result, reset_peak,
                                run_fresh, synchronize, unmap_freed_blocks)

QWEN3_BLANK = 151_669  # the first head row beyond Qwen3's tokenizer (Sec. 4.2)


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


def frozen_head_batch(args) -> dict:
    """App. C.2's synthetic batch over a frozen head stored in ``args.head_dtype``, the
    head input and eta trainable."""
    states, weight, _, targets, lens, target_lengths = head_batch(
        QWEN3_HEAD_ROWS, args.frames, args.dim, args.device, seed=args.seed)
    # Targets are ordinary tokens: shift the Zipf ids so that none lands on the blank row.
    targets = torch.where(targets >= QWEN3_BLANK, targets - QWEN3_BLANK + 1, targets)
    return dict(states=states.requires_grad_(True), weight=weight.to(getattr(torch, args.head_dtype)),
                bias=None, eta=torch.zeros((), device=args.device, requires_grad=True),
                targets=targets, lens=lens, target_lengths=target_lengths)


def head_loss(method: str, batch: dict, chunk_size: int):
    batch["states"].grad, batch["eta"].grad = None, None
    return loss_of(method, batch["states"], batch["weight"], batch["bias"], batch["eta"],
                   batch["targets"], batch["lens"], batch["target_lengths"], chunk_size)


def timed_pass(method: str, batch: dict, args) -> float:
    synchronize(args.device)
    started = time.perf_counter()
    head_loss(method, batch, args.chunk_size).backward()
    synchronize(args.device)
    return time.perf_counter() - started


def head_loss_single(method: str, args) -> dict:
    """One method in this process: the warm-up and measured passes, then the peak."""
    batch = frozen_head_batch(args)
    for _ in range(args.warmup):
        timed_pass(method, batch, args)
    times = [timed_pass(method, batch, args) for _ in range(args.runs)]
    batch["states"].grad, batch["eta"].grad = None, None
    baseline = memory_mb(args.device, peak=False)
    reset_peak(args.device)
    loss = head_loss(method, batch, args.chunk_size)
    loss.backward()
    peak = memory_mb(args.device, peak=True)
    return dict(part="head-loss", method=method, vocab_size=QWEN3_HEAD_ROWS, frames=args.frames, dim=args.dim,
                head_dtype=args.head_dtype, loss=float(loss), time_s=statistics.median(times),
                times_s=" ".join(f"{t:.3f}" for t in times), peak_extra_mb=round(peak - baseline, 1),
                load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()))


def head_loss_interleaved(args) -> dict:
    """The methods alternately on one batch in this process (times only)."""
    batch = frozen_head_batch(args)
    steps = {method: functools.partial(timed_pass, method, batch, args) for method in args.methods}
    row = dict(vocab_size=QWEN3_HEAD_ROWS, frames=args.frames, dim=args.dim, head_dtype=args.head_dtype)
    row.update(interleaved_times(steps, args.interleave_rounds, reference="standard"))
    return row


def full_step_single(method: str, args) -> dict:
    """One method's full LLM-CTC training steps in this process."""
    from benchmarks.llm_support import batch_of, build_model, synthesized_utterances
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


def child_arguments(args, *single: str) -> list[str]:
    """This run's options for a child process, with ``single`` (its one job) first."""
    arguments = [*single, "--part", args.part, "--head-dtype", args.head_dtype, "--frames", str(args.frames),
                 "--dim", str(args.dim), "--chunk-size", str(args.chunk_size), "--warmup", str(args.warmup),
                 "--runs", str(args.runs), "--device", args.device, "--seed", str(args.seed),
                 "--threads", str(args.threads), "--utterances", str(args.utterances),
                 "--lora-rank", str(args.lora_rank), "--methods", *args.methods,
                 "--interleave-rounds", str(args.interleave_rounds)]
    for name in ("hidden_size", "layers", "intermediate_size", "heads", "kv_heads", "head_dim",
                 "encoder_preset", "projector_stack", "projector_hidden", "readout"):
        arguments += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return arguments


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["head-loss", "full-step"], default="head-loss")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--head-dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="head-loss: the frozen head's storage (App. C.3: BF16)")
    parser.add_argument("--frames", type=int, default=4000, help="head-loss: M (a multiple of 100)")
    parser.add_argument("--dim", type=int, default=1024, help="head-loss: D")
    parser.add_argument("--interleave-rounds", type=int, default=0,
                        help="head-loss: also time the methods alternately in one fresh process, "
                        "this many rounds")
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
    parser.add_argument("--interleaved", action="store_true", help=argparse.SUPPRESS)
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    if args.frames < 100 or args.frames % 100:
        parser.error(f"--frames must be a positive multiple of 100 (utterances of 100 frames), got {args.frames}")
    for name in ("dim", "utterances", "chunk_size", "runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.interleave_rounds < 0:
        parser.error(f"--interleave-rounds must be >= 0, got {args.interleave_rounds}")
    if args.interleave_rounds and args.part != "head-loss":
        parser.error("--interleave-rounds: only the head-loss part times the methods interleaved")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.single or args.interleaved:
        if args.device == "cpu":
            unmap_freed_blocks()
        if args.interleaved:
            print_result(head_loss_interleaved(args))
        else:
            single = head_loss_single if args.part == "head-loss" else full_step_single
            print_result(single(args.single, args))
        return
    environment = dict(FIXED_MMAP_THRESHOLD, HF_HUB_OFFLINE="1")
    rows = []
    for method in args.methods:
        print(f"{args.part}: {method}, load {os.getloadavg()[0]:.2f}", flush=True)
        result, completed = run_fresh(__package__, child_arguments(args, "--single", method), environment)
        if result is None:
            out_of_memory, reason = failure_reason(completed.returncode, completed.stderr)
            print(completed.stderr[-3000:], flush=True)
            result = dict(part=args.part, method=method, failed=True, out_of_memory=out_of_memory, reason=reason)
        rows.append(result)
        print(result, flush=True)
    interleaved = None
    if args.interleave_rounds:
        interleaved, completed = run_fresh(__package__, child_arguments(args, "--interleaved"), environment)
        if interleaved is None:
            print(f"interleaved: {failure_reason(completed.returncode, completed.stderr)[1]}", flush=True)
        print(f"interleaved: {interleaved}", flush=True)
    write_results(rows, interleaved, args)
    print(results_path(args).read_text())


if __name__ == "__main__":
    main()
