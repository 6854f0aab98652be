"""The Zipformer's SwooshL/R activations on a CPU: the plain formula
log(1 + e^(x - s)) - 0.08 x - c (five passes over x and five new tensors,
``zipformer.scaling.swoosh_l_reference``) against ``zipformer.scaling.swoosh_value``
(logaddexp(x, s) - s, the slope and offset taken off in place: three passes, one new
tensor), at three levels, each pair timed alternately in one process
(:func:`benchmarks.support.interleaved_times`):

1. the activation alone, forward, on a float32 (frames, dim) tensor, beside one pass
   that writes a new tensor (``torch.neg``), the floor of any activation;
2. a feed-forward layer's activation, dropout and linear layer, forward and backward:
   ``ActivationDropoutAndLinear`` (one autograd node, the derivative
   sigmoid(x - s) - 0.08 in backward) against plain autograd through the formula;
3. the step of egs/mini's stage-10 encoder (``conf/train_streaming.yaml``, training mode,
   forward and backward over one batch's chunk windows as ``asr.chunk_windows.encode_windows``
   batches them, paper Sec. 4.3, App. D.4), with ``swoosh_value`` or the plain formula.

Writes ``results_threads<N>.md`` and ``swoosh_threads<N>.csv``::

    python -m benchmarks.swoosh --output-dir benchmarks/swoosh --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from pathlib import Path
from typing import Iterator, Sequence
from unittest import mock

import torch
import torch.nn.functional as F

from asr.atomic_io import write_text_atomically
from asr.chunk_windows import encode_windows
from asr.config import load_run_config
from asr.family import load_family
from benchmarks.support import REPO, batch_windows, interleaved_times, provenance_lines, write_csv
from zipformer import scaling

SHIFTS = {"SwooshL": (4.0, scaling.SWOOSH_L_OFFSET), "SwooshR": (1.0, scaling.SWOOSH_R_OFFSET)}


def plain_swoosh(x: torch.Tensor, shift: float, offset: float) -> torch.Tensor:
    """The formula as written: softplus(x - s) - 0.08 x - c, five passes."""
    return F.softplus(x - shift) - scaling.SWOOSH_SLOPE * x - offset


@contextlib.contextmanager
def plain_formula() -> Iterator[None]:
    """The Zipformer's activations and feed-forward layers computing the plain formula."""
    with mock.patch.object(scaling, "swoosh_value", plain_swoosh):
        yield


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def activation_row(name: str, frames: int, dim: int, rounds: int) -> dict:
    shift, offset = SHIFTS[name]
    x = torch.randn(frames, dim) * 4
    row = dict(level="activation", case=f"{name}, ({frames}, {dim}), forward")
    row.update(interleaved_times({
        "plain": lambda: timed(lambda: plain_swoosh(x, shift, offset)),
        "logaddexp": lambda: timed(lambda: scaling.swoosh_value(x, shift, offset)),
        "one_pass": lambda: timed(lambda: torch.neg(x))}, rounds, reference="logaddexp"))
    return row


def feed_forward_row(name: str, frames: int, dim: int, out_dim: int, rounds: int) -> dict:
    torch.manual_seed(0)
    layer = scaling.ActivationDropoutAndLinear(dim, out_dim, activation=name, dropout_p=0.1).train()
    x = (torch.randn(1, frames, dim) * 4).requires_grad_()
    shift, offset = SHIFTS[name]

    def fused() -> None:
        layer(x).square().mean().backward()

    def plain() -> None:
        mask = (torch.rand(1, 1, dim) >= 0.1).float() / 0.9
        F.linear(plain_swoosh(x, shift, offset) * mask, layer.weight, layer.bias).square().mean().backward()

    row = dict(level="feed_forward", case=f"{name}, ({frames}, {dim}) -> {out_dim}, forward + backward")
    row.update(interleaved_times({"plain": lambda: timed(plain), "logaddexp": lambda: timed(fused)},
                                 rounds, reference="logaddexp"))
    return row


def encoder_row(config_path: Path, history: int, rounds: int) -> dict:
    torch.manual_seed(0)
    config = load_run_config(config_path)
    encoder = load_family(config.family).build_model(config.model, 500, 0).train().encoder
    windows = batch_windows("sentences", config.data.max_duration, history, random.Random(history))

    def step() -> None:
        sum(output.square().mean() for output in encode_windows(encoder, windows)).backward()

    def plain() -> None:
        with plain_formula():
            step()

    row = dict(level="encoder", case=f"stage-10 encoder, {len(windows)} windows of one batch, h = {history} s, "
                                     "forward + backward")
    row.update(interleaved_times({"plain": lambda: timed(plain), "logaddexp": lambda: timed(step)},
                                 rounds, reference="logaddexp"))
    return row


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "egs/mini/conf/train_streaming.yaml")
    parser.add_argument("--frames", type=int, default=8000, help="rows of the activation and feed-forward inputs")
    parser.add_argument("--dim", type=int, default=384, help="the feed-forward layer's hidden width")
    parser.add_argument("--out-dim", type=int, default=128, help="the feed-forward layer's output width")
    parser.add_argument("--histories", type=int, nargs="+", default=[2, 8], help="h in seconds (encoder level)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per row")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.rounds, args.threads, args.frames, args.dim, args.out_dim) < 1 or min(args.histories) < 0:
        raise SystemExit("ERROR: --rounds, --threads, --frames, --dim and --out-dim must be >= 1, "
                         "--histories >= 0")
    torch.set_num_threads(args.threads)
    rows = [activation_row(name, args.frames, args.dim, args.rounds) for name in SHIFTS]
    rows += [feed_forward_row(name, args.frames, args.dim, args.out_dim, args.rounds) for name in SHIFTS]
    rows += [encoder_row(args.config, history, args.rounds) for history in args.histories]
    for row in rows:
        print(f"{row['case']}: plain {row['plain_s']:.4f} s, logaddexp {row['logaddexp_s']:.4f} s "
              f"({row['plain_over_logaddexp']:.2f}x)", flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"swoosh_threads{args.threads}.csv")
    config = args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
    lines = ["# SwooshL/R: the plain formula against logaddexp in place", "", *provenance_lines("cpu"), "",
             f"{args.threads} thread(s); median of {args.rounds} alternate rounds after a warm-up each "
             "(the per-round ratio's median in the ratio column). The encoder level is the preset "
             f"`{config}` in training mode.", "",
             "| level | case | plain formula (s) | logaddexp (s) | plain / logaddexp | one pass (s) | load |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        one_pass = f"{r['one_pass_s']:.4f}" if "one_pass_s" in r else "-"
        lines.append(f"| {r['level']} | {r['case']} | {r['plain_s']:.4f} | {r['logaddexp_s']:.4f} "
                     f"| {r['plain_over_logaddexp']:.2f}x | {one_pass} | {r['load_min']:.2f}-{r['load_max']:.2f} |")
    write_text_atomically(args.output_dir / f"results_threads{args.threads}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
