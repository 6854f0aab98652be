"""The chunk-window Zipformer's encoder step (paper Sec. 4.3, App. D.4): forward and
backward over the chunk windows of one training batch, all windows zero-padded into one
batch (the reference, built here) against :func:`asr.chunk_windows.encode_windows`
(windows batched by length). The model is the preset's (default egs/mini's stage-10
encoder, ``conf/train_streaming.yaml``), in training mode; the batches are synthetic fbank
shaped like that stage's: sentences of 2-4 s, or sentences joined into examples of 8-10 s
(``data.concatenate_seconds=10``), each batch filled to ``data.max_duration`` seconds.
The two are timed alternately (:func:`benchmarks.support.interleaved_times`). Writes
``results_threads<N>.md`` and ``chunk_windows_threads<N>.csv``::

    python -m benchmarks.chunk_windows --output-dir benchmarks/chunk_windows --threads 1
    python -m benchmarks.chunk_windows --output-dir benchmarks/chunk_windows --threads 2
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import List, Sequence

import torch

from asr.atomic_io import write_text_atomically
from asr.chunk_windows import encode_windows, padded_batch
from asr.config import load_run_config
from asr.family import load_family
from benchmarks.support import (FRAMES_PER_SECOND, REPO, batch_windows, interleaved_times, provenance_lines,
                                write_csv)



def one_padded_batch(encoder, windows: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Every window padded to the longest, one encoder call (the reference)."""
    batch, lens = padded_batch(windows)
    encoded, encoded_lens = encoder(batch, lens)
    return [encoded[m, :int(encoded_lens[m])] for m in range(len(windows))]


def timed_step(encode, encoder, windows) -> float:
    start = time.perf_counter()
    outputs = encode(encoder, windows)
    sum(output.square().mean() for output in outputs).backward()
    return time.perf_counter() - start


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "egs/mini/conf/train_streaming.yaml")
    parser.add_argument("--histories", type=int, nargs="+", default=[2, 8], help="h in seconds")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1 or min(args.histories) < 0:
        raise SystemExit("ERROR: --rounds and --threads must be >= 1 and --histories >= 0")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = load_run_config(args.config)
    model = load_family(config.family).build_model(config.model, 500, 0)
    model.train()
    encoder = model.encoder
    rows = []
    for kind in ("sentences", "joined"):
        for history in args.histories:
            windows = batch_windows(kind, config.data.max_duration, history, random.Random(history))
            lengths = [window.shape[0] for window in windows]
            row = dict(batch=kind, history_s=history, windows=len(windows),
                       window_seconds=round(sum(lengths) / FRAMES_PER_SECOND, 1),
                       padded_seconds=round(len(lengths) * max(lengths) / FRAMES_PER_SECOND, 1))
            row.update(interleaved_times({
                "one_batch": lambda: timed_step(one_padded_batch, encoder, windows),
                "by_length": lambda: timed_step(encode_windows, encoder, windows)},
                args.rounds, reference="by_length"))
            rows.append(row)
            print(f"{kind}, h = {history} s: one batch {row['one_batch_s']:.3f} s, by length "
                  f"{row['by_length_s']:.3f} s ({row['one_batch_over_by_length']:.2f}x)", flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / f"chunk_windows_threads{args.threads}.csv")
    lines = ["# The chunk-window Zipformer's encoder step: one padded batch against batches by length", "",
             *provenance_lines("cpu"), "",
             f"Preset `{args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config}`, "
             f"training mode, {args.threads} thread(s); forward and backward of one batch's windows, median of "
             f"{args.rounds} alternate rounds (per-round ratio's median in the last column).", "",
             "| batch | h (s) | windows | window audio (s) | padded to one batch (s) | one batch (s) | by length (s) "
             "| one batch / by length | load |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['history_s']} | {r['windows']} | {r['window_seconds']} | {r['padded_seconds']} "
              f"| {r['one_batch_s']:.3f} | {r['by_length_s']:.3f} | {r['one_batch_over_by_length']:.2f}x "
              f"| {r['load_min']:.2f}-{r['load_max']:.2f} |" for r in rows]
    write_text_atomically(args.output_dir / f"results_threads{args.threads}.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
