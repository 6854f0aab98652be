"""Can a 2-layer Qwen3 learn the query readout's position-finding (Sec. 4.2) from text
alone? Sequences ``BOS c_1 .. c_T Q^T`` of random tokens, where the i-th Q must name c_i
(T uniform in --min-len .. --max-len; ``--chunk B``: the streaming layout, chunks of B
content positions each followed by its B queries). A model built from a config and trained
from scratch; the share of held-out query positions it names, every 100 steps. Writes
``results.md`` and ``accuracy.csv`` (egs/mini RESULTS.md, "The query readout on the laptop")::

    python -m benchmarks.query_task --output-dir benchmarks/query_task
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import torch

from asr.atomic_io import write_text_atomically
from benchmarks.support import provenance_lines, write_csv


def example(rng: random.Random, vocab: int, min_len: int, max_len: int, chunk: int) -> Tuple[List[int], List[int]]:
    """Token ids and targets (-100: not scored) of one sequence; BOS = vocab, Q = vocab + 1."""
    bos, query = vocab, vocab + 1
    content = [rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))]
    size = chunk if chunk > 0 else len(content)
    ids, targets = [bos], [-100]
    for start in range(0, len(content), size):
        block = content[start:start + size]
        ids += block + [query] * len(block)
        targets += [-100] * len(block) + block
    return ids, targets


def batch(examples: Sequence[Tuple[List[int], List[int]]]):
    width = max(len(ids) for ids, _ in examples)
    ids = torch.zeros(len(examples), width, dtype=torch.long)
    targets = torch.full((len(examples), width), -100)
    mask = torch.zeros(len(examples), width, dtype=torch.long)
    for n, (row, target) in enumerate(examples):
        ids[n, :len(row)], targets[n, :len(target)], mask[n, :len(row)] = torch.tensor(row), torch.tensor(target), 1
    return ids, targets, mask


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--min-len", type=int, default=10)
    parser.add_argument("--max-len", type=int, default=50)
    parser.add_argument("--chunk", type=int, default=0, help="streaming layout with chunks of this many positions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.min_len <= args.max_len or args.steps < 1 or args.hidden % args.heads:
        raise SystemExit("ERROR: need 1 <= --min-len <= --max-len, --steps >= 1 and --hidden a multiple of --heads")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    size = args.vocab + 2
    config = Qwen3Config(vocab_size=size, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=max(1, args.heads // 2), head_dim=args.hidden // args.heads,
                         tie_word_embeddings=True, max_position_embeddings=2048)
    model = Qwen3ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    draw = lambda count: batch([example(rng, args.vocab, args.min_len, args.max_len, args.chunk)  # noqa: E731
                                for _ in range(count)])
    held_out = draw(256)
    rows, started = [], time.monotonic()
    for step in range(1, args.steps + 1):
        ids, targets, mask = draw(args.batch_size)
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, size), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps:
            with torch.no_grad():
                ids, targets, mask = held_out
                best = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
                scored = targets != -100
                named = float((best[scored] == targets[scored]).double().mean())
            rows.append({"step": step, "named": round(named, 4), "seconds": round(time.monotonic() - started, 1)})
            print(f"step {step}: {100 * named:.1f}% of the held-out query positions named "
                  f"({rows[-1]['seconds']:.0f} s)", flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.output_dir / "accuracy.csv")
    layout = f"chunks of {args.chunk}" if args.chunk else "offline"
    lines = ["# The query readout's task on text, learned from scratch", "", *provenance_lines("cpu"), "",
             f"A {args.layers}-layer Qwen3 of width {args.hidden} ({args.heads} heads), {layout} layout, T "
             f"{args.min_len}-{args.max_len}, {args.vocab} random tokens, batch {args.batch_size}, AdamW {args.lr} "
             "one-cycle; share of 256 held-out sequences' query positions named by the argmax:", "",
             "| step | named | seconds |", "|---|---|---|"]
    lines += [f"| {r['step']} | {100 * r['named']:.1f}% | {r['seconds']:.0f} |" for r in rows]
    write_text_atomically(args.output_dir / "results.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
