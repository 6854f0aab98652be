"""The LLM-CTC loss on egs/mini's tiny LM head, over all its rows and over its distinct rows
(llm_ctc/head_rows.py): forward + backward time of ``pruned_ctc_loss`` with the frozen
151,936 x 128 head as it is, with the same head grouped into its distinct rows (each with
log m_g on its bias, the targets' rows split off), and the bare floor of the ungrouped
loss: the two head products the frozen-head schedule needs (Z = X W^T and P W).

The head is built as local/pretrain_tiny_lm.py leaves it: ``--tokens`` rows (the tokens of
the training text) drawn at random, every other row one shared vector, blank (the first row
beyond Qwen3's tokenizer) among them but a class of its own (eta starts at log c_bl, App.
D.2). Each batch is utterances of 100 frames with 25 targets drawn from the token rows.
The methods are timed alternately (``--rounds`` rounds after a warm-up: a change of load
hits them alike), and both losses and gradients are compared with the full head's in
float64. Committed results, from the repository root::

    python -m benchmarks.distinct_head_rows --threads 1 --output-dir benchmarks/distinct_head_rows
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from benchmarks.support import interleaved_times, provenance_lines, write_csv, write_text
from llm_ctc.head_rows import find_row_groups, grouped_head
from pruned_ctc import pruned_ctc_loss

QWEN3_HEAD_ROWS = 151_936
QWEN3_BLANK = 151_669
FRAMES_PER_UTTERANCE = 100
TOKENS_PER_UTTERANCE = 25


def tiny_lm_head(vocab: int, dim: int, tokens: int, generator: torch.Generator):
    """(weight (V, D), the token rows): ``tokens`` random rows below blank, every other row
    (blank's too, as in the tiny LM) one shared vector."""
    weight = torch.randn(1, dim, generator=generator).expand(vocab, dim).clone()
    own = torch.randperm(QWEN3_BLANK, generator=generator)[:tokens]
    weight[own] = torch.randn(own.numel(), dim, generator=generator)
    return weight, own


def batch(own: torch.Tensor, frames: int, dim: int, generator: torch.Generator):
    utterances = frames // FRAMES_PER_UTTERANCE
    states = torch.randn(utterances, FRAMES_PER_UTTERANCE, dim, generator=generator)
    targets = own[torch.randint(own.numel(), (utterances, TOKENS_PER_UTTERANCE), generator=generator)]
    return states, targets, torch.full((utterances,), FRAMES_PER_UTTERANCE)


def measure(weight, groups, states, targets, lens, eta, rounds: int) -> dict:
    target_lengths = torch.full((targets.shape[0],), targets.shape[1])

    def full() -> float:
        x = states.clone().requires_grad_(True)
        start = time.perf_counter()
        loss = pruned_ctc_loss(x, weight, None, targets, lens, target_lengths=target_lengths,
                               blank_id=QWEN3_BLANK, blank_offset=eta)
        loss.backward()
        full.loss, full.grad = loss.item(), x.grad
        return time.perf_counter() - start

    def grouped() -> float:
        x = states.clone().requires_grad_(True)
        start = time.perf_counter()
        head, bias, class_of = grouped_head(groups, weight, None, targets.flatten())
        loss = pruned_ctc_loss(x, head, bias, class_of[targets], lens, target_lengths=target_lengths,
                               blank_id=int(class_of[QWEN3_BLANK]), blank_offset=eta)
        loss.backward()
        grouped.loss, grouped.grad = loss.item(), x.grad
        return time.perf_counter() - start

    def products() -> float:
        x = states.flatten(0, 1)
        start = time.perf_counter()
        logits = x @ weight.t()
        logits @ weight
        return time.perf_counter() - start

    row = interleaved_times(dict(full=full, grouped=grouped, products=products), rounds, reference="full")
    # The reference: the full head in float64 (not timed).
    x = states.double().requires_grad_(True)
    loss = pruned_ctc_loss(x, weight.double(), None, targets, lens, target_lengths=target_lengths,
                           blank_id=QWEN3_BLANK, blank_offset=eta.detach().double())
    loss.backward()
    scale = x.grad.abs().max()
    for name, method in (("full", full), ("grouped", grouped)):
        row[f"{name}_loss_error"] = abs(method.loss - loss.item()) / abs(loss.item())
        row[f"{name}_gradient_error"] = float((method.grad.double() - x.grad).abs().max() / scale)
    return row



def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, nargs="+", default=[400, 1600],
                        help="LLM-CTC frames per batch (egs/mini: about 400-800 per 10 s half-batch)")
    parser.add_argument("--dim", type=int, default=128, help="head width (the tiny LM's: 128)")
    parser.add_argument("--tokens", type=int, default=793,
                        help="rows of their own (the tiny LM's: the 793 tokens of egs/mini's training text)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="folder for results_cpu.md and distinct_head_rows_cpu.csv (default: print only)")
    args = parser.parse_args(argv)
    for name in ("dim", "rounds", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"ERROR: --{name} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.tokens < QWEN3_BLANK:
        raise SystemExit(f"ERROR: --tokens must be in [1, {QWEN3_BLANK}), got {args.tokens}")
    if any(f < FRAMES_PER_UTTERANCE for f in args.frames):
        raise SystemExit(f"ERROR: --frames must each be >= {FRAMES_PER_UTTERANCE} (one utterance), got {args.frames}")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weight, own = tiny_lm_head(QWEN3_HEAD_ROWS, args.dim, args.tokens, generator)
    start = time.perf_counter()
    groups = find_row_groups(weight, None, apart=[QWEN3_BLANK])
    found_s = time.perf_counter() - start
    eta = torch.tensor(math.log(QWEN3_HEAD_ROWS - args.tokens))
    rows = []
    for frames in args.frames:
        states, targets, lens = batch(own, frames, args.dim, generator)
        row = dict(frames=frames, vocab_size=QWEN3_HEAD_ROWS, dim=args.dim, distinct_rows=groups.num_groups)
        row.update(measure(weight, groups, states, targets, lens, eta.requires_grad_(True), args.rounds))
        rows.append(row)
        print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                        if not k.endswith("_times_s")), flush=True)
    if args.output_dir is None:
        return
    header = ["frames", "distinct_rows", "full_s", "grouped_s", "products_s", "grouped_over_full",
              "products_over_full", "full_loss_error", "grouped_loss_error", "full_gradient_error",
              "grouped_gradient_error", "load_min", "load_max"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        table.append("| " + " | ".join(f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k])
                                       for k in header) + " |")
    text = "\n".join(["# The tiny LM's head: the loss over all rows and over its distinct rows", "",
                      *provenance_lines("cpu"), "",
                      f"Head {QWEN3_HEAD_ROWS:,} x {args.dim}, {groups.num_groups:,} distinct rows (found in "
                      f"{found_s:.2f} s, once per model); forward + backward of pruned_ctc_loss, median of "
                      f"{args.rounds} alternating rounds; `products`: X W^T and P W alone (the ungrouped "
                      "loss's floor). Errors: relative to the same loss over the full head in float64 (the "
                      "gradient's largest difference over its largest element): the float32 full head sums "
                      "the 151,000 equal rows' terms one by one, the groups once with their count.", "", *table, ""])
    write_text(text, args.output_dir / "results_cpu.md")
    write_csv(rows, args.output_dir / "distinct_head_rows_cpu.csv")


if __name__ == "__main__":
    main()
