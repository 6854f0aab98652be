"""Streaming consistency of LLM-CTC (paper App. E, "Streaming consistency checks", Fig. 7):
parallel batch computation of all chunks under the streaming mask against per-utterance
cached computation chunk by chunk (KV cache with eviction), with fixed speech embeddings.

Per attention implementation / precision (eager FP32, eager BF16, sdpa FP32, sdpa BF16)
and per left history h = 1..8 s, pooled over the valid query positions of the batch:
relative full-vocabulary logit error ||Z_cache - Z_par||_F / ||Z_par||_F, maximum
absolute logit error, and greedy frame-label disagreement rate. The head is FP32 over
the LLM's weights (App. E). Also measured: per-chunk cached LLM time and cache size over
a 60-second utterance at h = 8 s (the cache bound P + 2A + J and bounded per-chunk work).

No pretrained weights are downloaded: the LLM is a randomly initialized Qwen3 built from
a config (``--layers``, ``--width``, the real 151,936-row head scaled to give peaked
posteriors), or any local causal LM directory with ``--llm``. The speech embeddings are
random at the embedding table's scale (the paper's fixed-input condition).

From the repository root:
    python -m benchmarks.streaming_consistency
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

import torch

from asr.chunk_windows import feature_chunk_frames
from benchmarks.support import provenance_lines, write_csv, write_text
from llm_ctc.head import head_logits
from llm_ctc.streaming.llm import CachedStreamingLLM, parallel_query_states
from llm_ctc.streaming.layout import Qwen3ASRGrid, utterance_layout

CONDITIONS = [("eager", torch.float32), ("eager", torch.bfloat16), ("sdpa", torch.float32), ("sdpa", torch.bfloat16)]


@dataclass
class LLMSide:
    """What the streaming functions use of an LLM-CTC model: backbone, prompt, query."""

    llm: torch.nn.Module
    prompt_ids: List[int]
    query: torch.Tensor

    def embed_tokens(self, ids):
        return self.llm.get_input_embeddings()(ids)

    @property
    def device(self):
        return self.query.device


def build_llm(args, attn_implementation: str, dtype: torch.dtype):
    """(backbone, head weight) with identical weights for every condition."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if args.llm:
        full = AutoModelForCausalLM.from_pretrained(args.llm, dtype=dtype, attn_implementation=attn_implementation)
    else:
        config = Qwen3Config(vocab_size=151_936, hidden_size=args.width, intermediate_size=3 * args.width,
                             num_hidden_layers=args.layers, num_attention_heads=args.width // 32,
                             num_key_value_heads=max(1, args.width // 128), head_dim=32, tie_word_embeddings=True,
                             max_position_embeddings=8192, attn_implementation=attn_implementation)
        torch.manual_seed(args.seed)
        full = Qwen3ForCausalLM(config)
        with torch.no_grad():
            full.lm_head.weight.mul_(20.0)
        full = full.to(dtype)
    full.eval()
    return full.get_decoder(), full.get_output_embeddings().weight


def batch_layouts(args, prompt_len: int):
    generator = torch.Generator().manual_seed(args.seed + 1)
    seconds = torch.randint(args.min_seconds * 100, args.max_seconds * 100 + 1, (args.utterances,),
                            generator=generator).tolist()
    return [utterance_layout(prompt_len, feature_chunk_frames(frames), Qwen3ASRGrid()) for frames in seconds]


def compare(model, head, layouts, speech, h):
    with torch.no_grad():
        parallel, lens = parallel_query_states(model, speech, layouts, h)
        par_rows, cache_rows = [], []
        for n, layout in enumerate(layouts):
            state = CachedStreamingLLM(model, h, Qwen3ASRGrid())
            start = 0
            for frames, count in zip(layout.chunk_frames, layout.chunk_lens):
                cache_rows.append(state.step(speech[n, start:start + count], frames))
                start += count
            par_rows.append(parallel[n, :int(lens[n])])
        z_par = head_logits(torch.cat(par_rows), head, None)
        z_cache = head_logits(torch.cat(cache_rows), head, None)
    difference = (z_cache.double() - z_par.double())
    return {
        "relative_logit_error": float(difference.norm() / z_par.double().norm()),
        "max_abs_logit_error": float(difference.abs().max()),
        "greedy_disagreement": float((z_cache.argmax(-1) != z_par.argmax(-1)).double().mean()),
        "frames": int(z_par.shape[0]),
    }


def chunk_costs(model, prompt_len, width, h=8, seconds=60, seed=0):
    layout = utterance_layout(prompt_len, feature_chunk_frames(seconds * 100), Qwen3ASRGrid())
    generator = torch.Generator().manual_seed(seed)
    speech = torch.randn(layout.num_frames, width, generator=generator) * 0.05
    state = CachedStreamingLLM(model, h, Qwen3ASRGrid())
    rows, start = [], 0
    with torch.no_grad():
        for b, (frames, count) in enumerate(zip(layout.chunk_frames, layout.chunk_lens)):
            state.largest_cache = 0
            began = time.perf_counter()
            state.step(speech[start:start + count], frames)
            rows.append({"chunk": b, "ms": 1000 * (time.perf_counter() - began),
                         "cache_during": state.largest_cache, "cache_after": state.cache_size})
            start += count
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/streaming_consistency"))
    parser.add_argument("--llm", default=None, help="local causal LM directory (default: random Qwen3)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--utterances", type=int, default=4)
    parser.add_argument("--min-seconds", type=int, default=5)
    parser.add_argument("--max-seconds", type=int, default=20)
    parser.add_argument("--prompt-len", type=int, default=6)
    parser.add_argument("--histories", type=int, nargs="+", default=list(range(1, 9)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows, cost_rows = [], []
    for attn, dtype in CONDITIONS:
        backbone, head = build_llm(args, attn, dtype)
        width = head.shape[1]
        generator = torch.Generator().manual_seed(args.seed + 2)
        query = (torch.randn(width, generator=generator) * 0.02).to(dtype)
        model = LLMSide(backbone, list(range(100, 100 + args.prompt_len)), query)
        layouts = batch_layouts(args, args.prompt_len)
        with torch.no_grad():
            scale = float(model.embed_tokens(torch.arange(1000)).float().std())
        speech = (torch.randn(len(layouts), max(x.num_frames for x in layouts), width, generator=generator)
                  * scale).to(dtype)
        for h in args.histories:
            result = compare(model, head, layouts, speech, h)
            rows.append({"attention": attn, "dtype": str(dtype).replace("torch.", ""), "history_s": h, **result})
            print(rows[-1], flush=True)
        if attn == "sdpa" and dtype == torch.float32:
            cost_rows = chunk_costs(model, args.prompt_len, width)
    write_csv(rows, args.output_dir / "consistency.csv")
    write_csv(cost_rows, args.output_dir / "chunk_costs.csv")
    write_text(report(args, rows, cost_rows), args.output_dir / "results.md")


def report(args, rows, cost_rows) -> str:
    lines = ["# Streaming consistency (App. E, Fig. 7): parallel vs cached computation", ""]
    lines += provenance_lines("cpu") + [""]
    model = args.llm or f"random Qwen3, {args.layers} layers, width {args.width}, 151,936-row head"
    lines += [f"LLM: {model}; {args.utterances} utterances of {args.min_seconds}-{args.max_seconds} s, "
              f"2 s chunks (Qwen3-ASR time grid, 26 positions per chunk), prompt {args.prompt_len}, "
              "fixed random speech embeddings, FP32 head.", "",
              "| attention | dtype | h (s) | relative logit error | max abs logit error | greedy disagreement |",
              "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['attention']} | {row['dtype']} | {row['history_s']} | {row['relative_logit_error']:.2e} "
                     f"| {row['max_abs_logit_error']:.2e} | {row['greedy_disagreement']:.4f} |")
    if cost_rows:
        def mean_ms(first, last):
            times = [r["ms"] for r in cost_rows[first:last + 1]]
            return f"{sum(times) / len(times):.1f}"

        lines += ["", "## Per-chunk cached LLM cost over a 60 s utterance (sdpa FP32, h = 8 s)", "",
                  f"Largest cache during a chunk: {max(r['cache_during'] for r in cost_rows)} positions, "
                  f"after a chunk: {max(r['cache_after'] for r in cost_rows)} (P = {args.prompt_len}; bound "
                  f"P + 260 and P + 208). Mean chunk time (LLM step only): chunks 5-9 {mean_ms(5, 9)} ms, "
                  f"15-19 {mean_ms(15, 19)} ms, 25-29 {mean_ms(25, 29)} ms; every row in chunk_costs.csv."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
