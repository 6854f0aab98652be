"""Where LLM-CTC's and LLM-CE's recognition time goes, per component, on the model and at
the settings of the RTF benchmark, ``python -m benchmarks.llm_rtf`` (paper App. D.3: batch 1, one CPU thread, greedy).

Each component's forward is wrapped with a wall-clock timer (inclusive times; the
decoder layers' attention and MLP are nested in the layers, the layers in the LLM call):
encoder, projector, LLM prefill, LLM decode steps (LLM-CE), the head (LLM-CTC's block-wise
argmax over T_n frames; LLM-CE's argmax of the last position's logits per step), CTC
collapse, detokenization. "Other" is the utterance's total minus the timed
components: Python, sequence building, readout gather, transformers' mask and cache
bookkeeping outside the layers.

Alongside, the memory-bound floor of one decode step: the bytes of every weight a step
reads (decoder layers and the head) over the bandwidth of a one-thread matrix-vector
product measured here on the same head.

From the repository root (the egs/mini test cuts by default):
    python -m benchmarks.llm_rtf.profile --utterances 16 --warmup 4
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from pathlib import Path
from typing import Callable, Dict

import torch

from benchmarks.llm_rtf.systems import (add_precision_arguments, build_systems, precision_description,
                                        recognize_ce, recognize_ctc, warmup_and_timed_utterances)
from benchmarks.llm_support import add_input_arguments, add_model_arguments, model_description, start_run
from benchmarks.support import provenance_lines, write_csv, write_text


class Timers:
    """Inclusive wall-clock seconds and call counts per component name."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = collections.defaultdict(float)
        self.calls: Dict[str, int] = collections.defaultdict(int)
        self.phase = ""  # "prefill" or "step": which LLM call the layers belong to

    def wrap(self, name: Callable[..., str], function: Callable) -> Callable:
        def timed(*arguments, **options):
            started = time.perf_counter()
            result = function(*arguments, **options)
            key = name(*arguments, **options)
            self.seconds[key] += time.perf_counter() - started
            self.calls[key] += 1
            return result

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(model, timers: Timers, system: str) -> None:
    """Timers around the parts of one model (instance attributes: the other model is untouched)."""
    fixed = lambda label: (lambda *a, **k: label)  # noqa: E731
    model.encoder.forward = timers.wrap(fixed("encoder"), model.encoder.forward)
    model.projector.forward = timers.wrap(fixed("projector"), model.projector.forward)
    llm_forward = model.llm.forward

    def llm_call(*arguments, **options):
        embeds = options.get("inputs_embeds")
        timers.phase = "prefill" if embeds is None or embeds.shape[1] > 1 else "step"
        return llm_forward(*arguments, **options)

    model.llm.forward = timers.wrap(lambda *a, **k: f"LLM {timers.phase}", llm_call)
    for layer in model.llm.layers:
        layer.forward = timers.wrap(lambda *a, **k: f"LLM {timers.phase}: decoder layers", layer.forward)
        layer.self_attn.forward = timers.wrap(lambda *a, **k: f"LLM {timers.phase}: attention",
                                              layer.self_attn.forward)
        layer.mlp.forward = timers.wrap(lambda *a, **k: f"LLM {timers.phase}: MLP", layer.mlp.forward)
    if system == "LLM-CE":
        model.decode_ids = timers.wrap(fixed("detokenize"), model.decode_ids)


def instrument_modules(timers: Timers) -> None:
    """Module-level functions the two decoding paths look up at call time."""
    import asr.search as search
    import llm_ctc.generation as generation
    import llm_ctc.head_argmax as argmax
    import llm_ctc.model as ctc_model
    from llm_ctc.tokenizer import LLMTokenizer

    # LLMCTCModel.frame_argmax calls it from llm_ctc.model, or through llm_ctc.head_rows
    # (a head of repeated rows), which imports it when called.
    for module in (ctc_model, argmax):
        module.head_argmax = timers.wrap(lambda *a, **k: "head argmax (block-wise, T_n frames)", module.head_argmax)
    # asr.decode_methods.ctc_search imports it from asr.search when called.
    search.ctc_collapse = timers.wrap(lambda *a, **k: "CTC collapse", search.ctc_collapse)
    LLMTokenizer.decode_batch = timers.wrap(lambda *a, **k: "detokenize", LLMTokenizer.decode_batch)
    generation._last_argmax = timers.wrap(lambda *a, **k: f"head argmax ({timers.phase})", generation._last_argmax)


def median_seconds(function, repeats: int = 5) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return sorted(times)[repeats // 2]


def matrix_vector_floor(weights) -> tuple:
    """(bytes, seconds) of one-row products with each weight in turn, as one decode step
    reads them (together larger than the caches, so memory-bound)."""
    inputs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    seconds = median_seconds(lambda: [x @ w.t() for x, w in zip(inputs, weights)])
    return sum(w.numel() * w.element_size() for w in weights), seconds


COMPONENTS = {
    "LLM-CTC": ["encoder", "projector", "LLM prefill", "head argmax (block-wise, T_n frames)", "CTC collapse",
                "detokenize"],
    "LLM-CE": ["encoder", "projector", "LLM prefill", "head argmax (prefill)", "LLM step", "head argmax (step)",
               "detokenize"],
}
NESTED = ["LLM prefill: decoder layers", "LLM prefill: attention", "LLM prefill: MLP", "LLM step: decoder layers",
          "LLM step: attention", "LLM step: MLP"]


def profile(args, ctc_model, ce_model, utterances, warmup) -> dict:
    timers = Timers()
    instrument(ctc_model, timers, "LLM-CTC")
    instrument(ce_model, timers, "LLM-CE")
    instrument_modules(timers)
    limits = {u.cut_id: len(t) + 1 for u, t in zip(utterances + warmup,
                                                 ce_model.encode_texts([u.text for u in utterances + warmup]))}
    systems = {"LLM-CTC": lambda u: recognize_ctc(ctc_model, u, args.device),
               "LLM-CE": lambda u: recognize_ce(ce_model, u, args.device, limits[u.cut_id])}
    results = {}
    for name, recognize in systems.items():
        # The warm-up utterances, then one untimed pass over the profiled ones: the timed
        # pass sees every input shape a second time, as the benchmark's median pass does
        # (oneDNN makes its kernels per shape the first time).
        for utterance in warmup + utterances:
            recognize(utterance)
        timers.reset()
        load = os.getloadavg()[0]
        total, steps = 0.0, 0
        for utterance in utterances:
            started = time.perf_counter()
            _, generated = recognize(utterance)
            total += time.perf_counter() - started
            steps += generated
        results[name] = dict(seconds=dict(timers.seconds), calls=dict(timers.calls), total=total,
                             load=(load, os.getloadavg()[0]), generated=steps)
        print(f"{name}: {total:.2f} s for {len(utterances)} utterances (load {load:.2f})", flush=True)
    from llm_ctc.head_argmax import bfloat16_screen

    linears = [m.weight for m in ce_model.llm.layers.modules() if isinstance(m, torch.nn.Linear)]
    head = ce_model.lm_head.weight
    results["floor"] = dict(layers=matrix_vector_floor(linears), head=matrix_vector_floor([head]),
                            head_bf16=matrix_vector_floor([bfloat16_screen(head)[0]]))
    return results


def table(result: dict, system: str, count: int, audio: float) -> list:
    seconds, calls = result["seconds"], result["calls"]
    lines = [f"### {system}: {1000 * result['total'] / count:.1f} ms per utterance, RTF "
             f"{result['total'] / audio:.4f} (1-minute load {result['load'][0]:.2f}-{result['load'][1]:.2f})", "",
             "| component | ms per utterance | share | calls per utterance |", "|---|---|---|---|"]
    accounted = 0.0
    for name in COMPONENTS[system]:
        value = seconds.get(name, 0.0)
        accounted += value
        lines.append(f"| {name} | {1000 * value / count:.1f} | {100 * value / result['total']:.1f}% | "
                     f"{calls.get(name, 0) / count:.1f} |")
    for name in NESTED:
        if name in seconds:
            lines.append(f"| &nbsp;&nbsp;of which {name} | {1000 * seconds[name] / count:.1f} | "
                         f"{100 * seconds[name] / result['total']:.1f}% | {calls[name] / count:.1f} |")
    other = result["total"] - accounted
    lines.append(f"| other (Python, sequence building, readout gather, template) | {1000 * other / count:.1f} | "
                 f"{100 * other / result['total']:.1f}% | |")
    return lines


def write_report(args, results: dict, utterances, elapsed: float) -> Path:
    count, audio = len(utterances), sum(u.duration for u in utterances)
    floor = results["floor"]
    ce = results["LLM-CE"]
    steps = ce["calls"].get("LLM step", 0)
    lines = ["# LLM-CTC and LLM-CE: where the recognition time goes (one CPU thread)", "",
             *provenance_lines(args.device), "",
             f"Model: {model_description(args)}; {precision_description(args)}. Inputs: {count} "
             f"{args.input_description} utterances ({audio:.1f} s of audio) after {len(args.warmup_ids)} warm-up "
             f"ones and an untimed pass over the same ones; batch 1; "
             f"LLM-CE limited to |y_n| + 1 steps ({ce['generated']} tokens generated). Inclusive wall-clock "
             f"timers around each component; wall time {elapsed:.0f} s.", ""]
    for system in ("LLM-CTC", "LLM-CE"):
        lines += table(results[system], system, count, audio) + [""]
    if steps:
        step_ms = 1000 * ce["seconds"]["LLM step"] / steps
        head_ms = 1000 * ce["seconds"].get("head argmax (step)", 0.0) / steps
        (layer_bytes, layer_s), (head_bytes, head_s), (low_bytes, low_s) = (
            floor["layers"], floor["head"], floor["head_bf16"])
        layers_label = "the decoder layers' linears"

        def read(label: str, size: int, seconds: float) -> str:
            return f"{label} ({size / 1e6:.0f} MB) {1000 * seconds:.1f} ms ({size / seconds / 1e9:.1f} GB/s)"

        lines += ["### LLM-CE decode step against its memory-bound floor", "",
                  f"Per step: LLM {step_ms:.1f} ms (decoder layers "
                  f"{1000 * ce['seconds'].get('LLM step: decoder layers', 0) / steps:.1f} ms), head argmax "
                  f"{head_ms:.1f} ms. Floor, one-row products reading each weight once: "
                  f"{read(layers_label, layer_bytes, layer_s)}; "
                  f"{read('the FP32 head', head_bytes, head_s)}; {read('its BF16 screen', low_bytes, low_s)}.", ""]
    path = args.output_dir / f"profile_{args.device}.md"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows = [dict(system=system, component=name, seconds=seconds, calls=results[system]["calls"][name],
                 utterances=count)
            for system in COMPONENTS for name, seconds in sorted(results[system]["seconds"].items())]
    rows += [dict(system=system, component="total", seconds=results[system]["total"], calls=count, utterances=count)
             for system in COMPONENTS]
    write_csv(rows, args.output_dir / f"profile_{args.device}.csv")
    write_text("\n".join(lines) + "\n", path)
    return path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_rtf.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(parser)
    parser.add_argument("--utterances", type=int, default=16, help="profiled utterances (after the warm-up ones)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/llm_rtf"))
    add_model_arguments(parser)
    add_precision_arguments(parser)
    args = parser.parse_args(argv)
    if args.utterances < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--utterances and --threads must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> None:
    import tempfile

    args = parse_args(argv)
    manifest = start_run(args)
    warmup, utterances = warmup_and_timed_utterances(args)
    args.warmup_ids = [u.cut_id for u in warmup]
    args.input_description = "synthesized" if manifest is None else f"{manifest.name}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        work_dir = args.work_dir or Path(scratch)
        work_dir.mkdir(parents=True, exist_ok=True)
        ctc_model, ce_model = build_systems(args, work_dir)
        with torch.inference_mode():
            results = profile(args, ctc_model, ce_model, utterances, warmup)
    path = write_report(args, results, utterances, time.perf_counter() - started)
    print(path.read_text())


if __name__ == "__main__":
    main()
