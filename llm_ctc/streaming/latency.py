"""Per-chunk compute and KV-cache size of streaming LLM-CTC over one long input (paper
Sec. 4.3, App. E: the cache never holds more than P + 2A + J positions, so the work per
chunk stops growing once the history is full)::

    python -m llm_ctc.streaming.latency --config conf/llm_ctc.yaml \\
        train.exp_dir=exp/full_llm_ctc_streaming_lookahead0.32 model.streaming_lookahead_seconds=0.32 \\
        --cuts data/full/fbank/librispeech_cuts_test-clean.jsonl.gz --seconds 60 --history 8 \\
        --output-dir exp/full_llm_ctc_streaming_lookahead0.32/latency

The weights are those the configuration's decode section chooses (as ``asr.decode``).
Test utterances' audio is concatenated in manifest order up to ``--seconds`` and fed one
chunk at a time to :class:`llm_ctc.streaming.recognizer.StreamingRecognizer` (greedy
search, one torch thread by default), which computes each chunk's fbank from its own
samples as training does (App. D.4). Writes ``chunks.csv`` (chunk index, start second,
cache positions attended by the chunk, cache positions kept after it, milliseconds from
the chunk's audio to its hypothesis: fbank, encoder, projector, LLM, head, search) and
``summary.md``; exits with an error if a chunk attends to more than P + 2A + J positions.
"""

from __future__ import annotations

import argparse
import csv
import io
import platform
import statistics
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import time

import torch

from asr.atomic_io import write_text_atomically
from llm_ctc.streaming.layout import SAMPLE_RATE


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None,
                        help="the training preset (asr.config); without it: the defaults and the overrides")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides (train.exp_dir=...)")
    parser.add_argument("--cuts", type=Path, required=True, help="cut manifest with audio (test utterances)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the concatenated input")
    parser.add_argument("--history", type=int, default=8, help="left history h in seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--output-dir", type=Path, required=True)
    return parser.parse_args(argv)


def load_streaming_model(config_path: Optional[Path], overrides: Sequence[str]):
    """The streaming model with the weights of the decode section's choice, ready to decode,
    and the weights' suffix."""
    from asr.config import load_run_config
    from asr.decode_methods import STREAMING
    from asr.weights import explicit_choice, load_trained_model

    config = load_run_config(config_path, explicit_choice(overrides))
    trained = load_trained_model(config.train.exp_dir, config.decode)
    if STREAMING not in trained.model.decoding:
        raise ValueError(f"{trained.weights.paths[-1]} is not a streaming LLM-CTC model (model.streaming is false)")
    return trained.model, trained.weights.suffix


def long_input(manifest: Path, seconds: float) -> torch.Tensor:
    """16 kHz samples (S,) of the manifest's cuts, concatenated up to ``seconds``."""
    from asr.data import load_cuts_lazy

    wanted, parts, samples = int(round(seconds * SAMPLE_RATE)), [], 0
    for cut in load_cuts_lazy(manifest, "--cuts"):
        if cut.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"--cuts {manifest}: cut {cut.id} has {cut.sampling_rate} Hz audio, not {SAMPLE_RATE}")
        audio = torch.from_numpy(cut.load_audio()).reshape(-1)
        parts.append(audio)
        samples += audio.numel()
        if samples >= wanted:
            return torch.cat(parts)[:wanted]
    raise ValueError(f"--cuts {manifest} holds {samples / SAMPLE_RATE:.1f} s of audio, fewer than "
                     f"--seconds {seconds:g}")


def measure(model, samples: torch.Tensor, history: int) -> List[dict]:
    """One row per chunk: its start, the cache positions it attends to (kept ones and its
    own 2 T_b), the positions kept after it, and the time from its audio to its hypothesis."""
    from llm_ctc.streaming.recognizer import StreamingRecognizer

    recognizer = StreamingRecognizer(model, history, model.chunk_seconds)
    per_chunk = model.chunk_seconds * SAMPLE_RATE
    rows = []
    for start in range(0, samples.numel(), per_chunk):
        began = time.perf_counter()
        results = recognizer.accept_waveform(samples[start:start + per_chunk])
        if start + per_chunk >= samples.numel():
            results += recognizer.finish()
        elapsed = time.perf_counter() - began
        # One chunk of audio in, one chunk recognized (with a lookahead the one before it;
        # the last call also recognizes the last chunk: each of those rows its own compute).
        for result in results:
            rows.append({"chunk": result.index, "start_seconds": result.index * model.chunk_seconds,
                         "attended_positions": result.attended, "kept_positions": recognizer.llm.cache_size,
                         "milliseconds": round(1000 * (elapsed if len(results) == 1 else result.seconds), 2)})
    return rows


def summary(rows: List[dict], bound: int, history: int, seconds: float, suffix: str, threads: int,
            lookahead: float = 0.0) -> str:
    times = [row["milliseconds"] for row in rows]
    full = rows[:-1] or rows  # the last chunk may be short
    most = max(row["attended_positions"] for row in full)
    steady = [row["milliseconds"] for row in full if row["attended_positions"] == most]
    lines = [
        f"# Streaming LLM-CTC per-chunk compute over a {seconds:g} s input ({suffix})",
        "",
        f"h = {history} s, {len(rows)} chunks, {threads} torch thread(s), {platform.processor() or platform.machine()}; "
        f"cache bound P + 2A + J = {bound} positions." + (f" Lookahead {lookahead:g} s: each chunk's hypothesis "
                                                          f"waits that long after its audio, before its compute."
                                                          if lookahead else ""),
        "",
        f"- largest cache attended by a chunk: {max(r['attended_positions'] for r in rows)} positions",
        f"- first chunk {times[0]:.1f} ms; median of chunks 2-5 {statistics.median(times[1:5] or times):.1f} ms; "
        f"median of the last 10 {statistics.median(times[-10:]):.1f} ms; "
        f"median of the {len(steady)} chunks at the full cache {statistics.median(steady):.1f} ms",
        "",
        "| chunk | start (s) | attended positions | kept after | ms |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['chunk']} | {r['start_seconds']:g} | {r['attended_positions']} | {r['kept_positions']} | "
              f"{r['milliseconds']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> List[dict]:
    args = parse_args(argv)
    if args.history < 1 or args.seconds <= 0:
        raise SystemExit(f"ERROR: --history must be >= 1 and --seconds > 0, got {args.history} and {args.seconds}")
    torch.set_num_threads(args.threads)
    try:
        model, suffix = load_streaming_model(args.config, args.overrides)
        samples = long_input(args.cuts, args.seconds)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    with torch.inference_mode():
        rows = measure(model, samples, args.history)
    bound = model.cache_bound(args.history)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomically(args.output_dir / "chunks.csv", table.getvalue())
    text = summary(rows, bound, args.history, args.seconds, suffix, args.threads,
                   model.config.streaming_lookahead_seconds)
    write_text_atomically(args.output_dir / "summary.md", text)
    print("\n".join(text.splitlines()[:8]))
    largest = max(row["attended_positions"] for row in rows)
    if largest > bound:
        raise SystemExit(f"ERROR: a chunk attended to {largest} cache positions, more than P + 2A + J = {bound}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
