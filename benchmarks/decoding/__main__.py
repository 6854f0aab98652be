"""Real-time factor of CTC greedy and prefix beam search on synthetic posteriors.

The posteriors look like a trained CTC model's: 25 frames per second, a label
sequence of about 3.5 tokens per second, each token held 1-2 frames with blanks in
between, and per frame one dominant class whose probability is between about 0.6 and
0.999 over unit-variance noise on every other class. Our search (asr.search,
compiled with numba; no pruning that changes its result) runs against pyctcdecode's
beam search on the same posteriors, same beam, no LM, once with pyctcdecode's default
pruning and once with its token and beam pruning switched off (what the test suite
compares with). RTF = decoding CPU time / audio duration (lower is faster). The
one-time cost of the first call in a process (numba loading its cached machine code,
or compiling it after an install) is measured apart and left out of the timings.
Results go to <output-dir>/results.csv and <output-dir>/README.md, with the command,
machine, torch version and date.

From the repository root (the committed results):
  python -m benchmarks.decoding --repeats 10
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Callable, List, Sequence

import torch

from asr.search import ctc_greedy_search, ctc_prefix_beam_search
from benchmarks.support import provenance_lines, write_csv, write_text

FRAMES_PER_SECOND = 25
# CPU seconds of this process: with one thread on an idle machine they equal wall
# time; on a shared machine they leave out the time spent waiting for a core, which
# would otherwise favor whichever decoder ran while the machine was quiet.
CLOCK = time.process_time
TOKENS_PER_SECOND = 3.5


def synthetic_posteriors(
    num_utterances: int, vocab_size: int, min_seconds: float, max_seconds: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T, V) peaky log-probs with blank 0, and (N,) lengths in frames."""
    generator = torch.Generator().manual_seed(seed)
    seconds = min_seconds + (max_seconds - min_seconds) * torch.rand(num_utterances, generator=generator)
    lengths = (seconds * FRAMES_PER_SECOND).long()
    num_frames = int(lengths.max())
    dominant = torch.zeros(num_utterances, num_frames, dtype=torch.long)
    for utterance, length in enumerate(lengths.tolist()):
        frame = 0
        gap = FRAMES_PER_SECOND / TOKENS_PER_SECOND
        while True:
            frame += int(torch.randint(1, int(2 * gap), (1,), generator=generator))
            hold = int(torch.randint(1, 3, (1,), generator=generator))
            if frame + hold > length:
                break
            token = int(torch.randint(1, vocab_size, (1,), generator=generator))
            dominant[utterance, frame : frame + hold] = token
            frame += hold
    logits = torch.randn(num_utterances, num_frames, vocab_size, generator=generator)
    # Margin log(V) + U(1, 8): the dominant class takes 0.6 to 0.999 of the mass for any V.
    margin = math.log(vocab_size) + 1.0 + 7.0 * torch.rand(num_utterances, num_frames, generator=generator)
    logits.scatter_add_(2, dominant.unsqueeze(-1), margin.unsqueeze(-1))
    return logits.log_softmax(-1), lengths


def time_batched(
    search: Callable[[torch.Tensor, torch.Tensor], List[List[int]]],
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    batch_size: int,
    repeats: int,
) -> tuple[float, List[List[int]]]:
    """Best CPU time over ``repeats`` of decoding all utterances in batches."""
    best = math.inf
    for _ in range(repeats):
        outputs: List[List[int]] = []
        start = CLOCK()
        for first in range(0, log_probs.size(0), batch_size):
            batch_lengths = lengths[first : first + batch_size]
            batch = log_probs[first : first + batch_size, : int(batch_lengths.max())]
            outputs += search(batch, batch_lengths)
        best = min(best, CLOCK() - start)
    return best, outputs


def time_pyctcdecode(
    log_probs: torch.Tensor, lengths: torch.Tensor, beam: int, pruning: bool
) -> tuple[float, List[List[int]]]:
    """CPU time of pyctcdecode's beam search, one utterance at a time; token ids back."""
    import pyctcdecode

    first_char = 0x4E00  # one CJK character per token: no spaces, no word handling
    labels = [""] + [chr(first_char + token) for token in range(1, log_probs.size(2))]
    decoder = pyctcdecode.build_ctcdecoder(labels)
    options = {} if pruning else {"beam_prune_logp": -1e9, "token_min_logp": -1e9}
    outputs = []
    start = CLOCK()
    for utterance, length in enumerate(lengths.tolist()):
        text = decoder.decode_beams(log_probs[utterance, :length].numpy(), beam_width=beam, **options)[0][0]
        outputs.append([ord(char) - first_char for char in text.replace(" ", "")])
    return CLOCK() - start, outputs


def agreement(ours: Sequence[List[int]], theirs: Sequence[List[int]]) -> float:
    return sum(a == b for a, b in zip(ours, theirs)) / max(len(theirs), 1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--num-utterances", type=int, default=64)
    parser.add_argument("--min-seconds", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=15.0)
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 16, 64],
        help="utterances per call of our search (decoding with --max-duration 600 s gives about 64)",
    )
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (pyctcdecode uses one)")
    parser.add_argument("--repeats", type=int, default=3, help="every timing is the best of this many runs")
    parser.add_argument(
        "--pyctcdecode-utterances", type=int, default=64,
        help="first utterances decoded by pyctcdecode; its RTF is over their audio",
    )
    parser.add_argument(
        "--unpruned-max-vocab", type=int, default=1000,
        help="run pyctcdecode without pruning only up to this vocabulary size (it expands every token)",
    )
    parser.add_argument("--unpruned-utterances", type=int, default=4)
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/decoding"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.num_utterances < 1 or min(args.batch_sizes) < 1 or args.pyctcdecode_utterances < 0:
        parser.error("--num-utterances and --batch-sizes must be >= 1, --pyctcdecode-utterances >= 0")
    if not 0 < args.min_seconds <= args.max_seconds:
        parser.error(f"need 0 < --min-seconds <= --max-seconds, got {args.min_seconds}, {args.max_seconds}")
    torch.set_num_threads(args.threads)
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
    start = CLOCK()
    ctc_prefix_beam_search(torch.randn(1, 8, 6).log_softmax(-1), torch.tensor([8]), beam=args.beam)
    args.first_call_seconds = CLOCK() - start
    print(f"first call of ctc_prefix_beam_search: {args.first_call_seconds:.2f} CPU s", flush=True)

    rows = []
    for vocab_size in args.vocab_sizes:
        log_probs, lengths = synthetic_posteriors(
            args.num_utterances, vocab_size, args.min_seconds, args.max_seconds, args.seed
        )
        first_row = len(rows)
        common = {"vocab_size": vocab_size, "beam": args.beam, "threads": args.threads}
        audio_seconds = float(lengths.sum()) / FRAMES_PER_SECOND
        searches = {
            "ours greedy": ctc_greedy_search,
            "ours prefix beam": lambda lp, ln: ctc_prefix_beam_search(lp, ln, beam=args.beam),
        }
        ours = []
        for batch_size in args.batch_sizes:
            for name, search in searches.items():
                seconds, outputs = time_batched(search, log_probs, lengths, batch_size, args.repeats)
                if name == "ours prefix beam":
                    ours = outputs
                rows.append({**common, "decoder": f"{name}, batch {batch_size}", "utterances": len(lengths),
                             "audio_seconds": audio_seconds, "decode_cpu_seconds": seconds, "agreement": ""})
        runs = [(True, "pyctcdecode (default pruning)", args.pyctcdecode_utterances)]
        if vocab_size <= args.unpruned_max_vocab:
            unpruned = min(args.unpruned_utterances, args.pyctcdecode_utterances)
            runs.append((False, "pyctcdecode (no pruning)", unpruned))
        for pruning, name, count in runs:
            count = min(count, len(lengths))
            if count == 0:
                continue
            subset = log_probs[:count].double()
            seconds, theirs = min(
                (time_pyctcdecode(subset, lengths[:count], args.beam, pruning) for _ in range(args.repeats)),
                key=lambda run: run[0],
            )
            rows.append({**common, "decoder": name, "utterances": count,
                         "audio_seconds": float(lengths[:count].sum()) / FRAMES_PER_SECOND,
                         "decode_cpu_seconds": seconds,
                         "agreement": f"{agreement(ours[:count], theirs):.3f}"})
        for row in rows[first_row:]:
            row["rtf"] = row["decode_cpu_seconds"] / row["audio_seconds"]
            print(f"V={vocab_size:5d} {row['decoder']:32s} RTF {row['rtf']:.2e} "
                  f"({row['decode_cpu_seconds']:.3f} CPU s for {row['audio_seconds']:.0f} s of audio)",
                  flush=True)
    write_outputs(args, rows)


def write_outputs(args: argparse.Namespace, rows: List[dict]) -> None:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    columns = ["vocab_size", "decoder", "beam", "threads", "utterances", "audio_seconds",
               "decode_cpu_seconds", "rtf", "agreement"]
    write_csv([{key: (f"{row[key]:.6g}" if isinstance(row[key], float) else row[key])
                for key in columns} for row in rows], args.output_dir / "results.csv")
    lines = [
        "# CTC decoding speed: ours vs pyctcdecode",
        "",
        *provenance_lines("cpu"),
        "",
        "Synthetic peaky posteriors (see the program's docstring), 25 frames/s, blank 0, "
        f"{args.num_utterances} utterances of {args.min_seconds:g}-{args.max_seconds:g} s. "
        "RTF = decoding CPU time (time.process_time of this single-threaded process) / audio time. "
        "pyctcdecode decodes the first "
        f"{args.pyctcdecode_utterances} utterances one by one (Python; without pruning only the first "
        f"{args.unpruned_utterances}, and only for V <= {args.unpruned_max_vocab}); \"agreement\" is the "
        "fraction of those where its best output equals ours. Every time is the best of "
        f"{args.repeats} runs. The first call of our prefix beam search in this process (numba loading "
        f"its cached machine code) took {args.first_call_seconds:.2f} CPU s and is not in the table; "
        "after an install, the first call compiles it (about 9 CPU s, and about 2 more for a second input dtype).",
        "",
        "| V | decoder | beam | utterances | audio (s) | decode CPU (s) | RTF | agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['vocab_size']} | {row['decoder']} | {row['beam']} | {row['utterances']} | "
            f"{row['audio_seconds']:.0f} | {row['decode_cpu_seconds']:.3f} | {row['rtf']:.2e} | "
            f"{row['agreement']} |"
        )
    lines += ["", "Our prefix beam search relative to pyctcdecode (RTF ratio, > 1 = ours faster):", ""]
    lines += [f"- {line}" for line in speedups(rows)]
    write_text("\n".join(lines) + "\n", args.output_dir / "README.md")


def speedups(rows: List[dict]) -> List[str]:
    """One sentence per vocabulary size and pyctcdecode setting."""
    sentences = []
    for vocab_size in sorted({row["vocab_size"] for row in rows}):
        same_vocab = [row for row in rows if row["vocab_size"] == vocab_size]
        ours = [row for row in same_vocab if row["decoder"].startswith("ours prefix")]
        for theirs in (row for row in same_vocab if "pyctcdecode" in row["decoder"]):
            ratios = ", ".join(
                f"{theirs['rtf'] / row['rtf']:.3g}x at {row['decoder'].split(', ')[1]}" for row in ours
            )
            sentences.append(f"V={vocab_size}, vs {theirs['decoder']}: {ratios}")
    return sentences


if __name__ == "__main__":
    main()
