"""Real-time factor of LLM-CTC against LLM-CE on the same model (paper Sec. 5.3, the
LLM-CE / LLM-CTC comparison table, timing protocol of App. D.3).

Protocol (App. D.3): batch 1, one CPU thread, greedy decoding (LLM-CE: greedy generation
with a KV cache stopping at EOS or the token limit; LLM-CTC: framewise greedy over the full
head, then collapse), ``--warmup`` utterances (32) before timing, then three timed passes
over the same utterances in the same order; a pass's RTF is its total recognition time
over the total audio duration, and the median of the three is reported. Timed per
utterance: the prepared fbank moved to the device, encoder, projector, LLM, LLM head and
detokenization (synchronized at both ends on CUDA). The systems take turns on every
utterance (in rotated order) within each pass, so that a change of load on a shared machine
reaches both alike (``--interleave pass``: whole passes in turn).

Both systems share every part: one randomly initialized model from configuration
(``--hidden-size``, ``--layers``...: the Qwen3 LM with its full 151,936 x D head, a
Zipformer encoder, the stack projector; LoRA off, as merged weights cost the same). The
paper times trained checkpoints, whose LLM-CE emits the transcript and EOS. A random
LLM-CE almost never emits EOS, so each utterance's generation is limited to |y_n| + 1
tokens (its reference transcript's Qwen3 tokens and EOS): exactly the steps, head products
and cache updates of a trained model that emits the reference. Generated lengths are
recorded.

Precision (App. D.3 "SPEAR-Qwen3 timing settings", the defaults, the same for both
systems; benchmarks/llm_rtf/systems.py): LLM weights BF16, the head a resident FP32 copy of its
weights, encoder and projector under BF16 autocast, attention 'sdpa'. Greedy search in
both systems takes the argmax of the FP32 head's logits without a log-softmax (LLM-CTC:
every frame, ``llm_ctc.decoding.recognize``; LLM-CE: every step), by default screened by a
BF16 product (``--argmax screened``, llm_ctc/head_argmax.py: the same ids as the FP32
product, which the run checks on every utterance of both systems).
``--compare-log-softmax`` also times LLM-CTC's former path (full-head log-probabilities,
then argmax) as a third system and checks it gives the same hypotheses.
``--reference-hypotheses`` counts the utterances whose hypotheses differ from another
run's (e.g. FP32 weights).

Paper (H100, BF16 LLM, FP32 head, SPEAR-XLarge encoder): LLM-CTC 7.2-10.3x faster than
LLM-CE from Qwen3-0.6B to 32B.

The committed CPU results, from the repository root (benchmarks/llm_rtf/README.md lists the
extra rows' commands):
    python -m benchmarks.llm_rtf --utterances 32 --compare-log-softmax
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.llm_rtf.systems import (add_precision_arguments, build_systems, precision_description,
                                        recognize_ce, recognize_ctc, recognize_ctc_by_log_softmax,
                                        warmup_and_timed_utterances)
from benchmarks.llm_support import add_input_arguments, add_model_arguments, model_description, start_run
from benchmarks.support import provenance_lines, synchronize, write_csv, write_text

# The paper's RTFs (size: LLM-CE, LLM-CTC), SPEAR-Qwen3 on GigaSpeech test, H100.
PAPER = {"0.6B": (0.0724, 0.0099), "1.7B": (0.0732, 0.0102), "4B": (0.0944, 0.0109),
         "8B": (0.0963, 0.0111), "14B": (0.1014, 0.0121), "32B": (0.1546, 0.0150)}


def timed_pass(recognize, utterances, device: str) -> tuple[float, list[int], list[str]]:
    """Seconds of recognition over the utterances, one at a time, generated lengths, texts."""
    return timed_passes([recognize], utterances, device)[0]


def timed_passes(systems, utterances, device: str) -> list[tuple[float, list[int], list[str]]]:
    """:func:`timed_pass` of each system, the systems taking turns on every utterance (in
    rotated order, so that none always runs first)."""
    totals, lengths, texts = [0.0] * len(systems), [[] for _ in systems], [[] for _ in systems]
    for index, utterance in enumerate(utterances):
        for turn in range(len(systems)):
            which = (index + turn) % len(systems)
            synchronize(device)
            started = time.perf_counter()
            text, generated = systems[which](utterance)
            synchronize(device)
            totals[which] += time.perf_counter() - started
            lengths[which].append(generated)
            texts[which].append(text)
    return list(zip(totals, lengths, texts))


def screen_agreement(args, ctc_model, ce_model, systems, utterances) -> dict:
    """Utterances whose hypothesis is the same with the exact float32 argmax as with the
    screened one (both systems; the screen must not change a single id)."""
    hypotheses = {name: [systems[name](u)[0] for u in utterances] for name in ("LLM-CTC", "LLM-CE")}
    for model in (ctc_model, ce_model):
        model.config.screened_argmax = False
    try:
        same = {name: sum(systems[name](u)[0] == h for u, h in zip(utterances, hypotheses[name]))
                for name in hypotheses}
    finally:
        for model in (ctc_model, ce_model):
            model.config.screened_argmax = True
    if any(count != len(utterances) for count in same.values()):
        raise RuntimeError(f"the screened argmax changed hypotheses: {same} of {len(utterances)} the same")
    return same


def measure(args, ctc_model, ce_model, utterances, warmup) -> dict:
    limits = {u.cut_id: len(t) + 1 for u, t in zip(utterances + warmup,
                                                 ce_model.encode_texts([u.text for u in utterances + warmup]))}
    systems = {
        "LLM-CTC": lambda u: recognize_ctc(ctc_model, u, args.device),
        "LLM-CE": lambda u: recognize_ce(ce_model, u, args.device, limits[u.cut_id]),
    }
    with torch.inference_mode():
        if args.compare_log_softmax:
            systems[LOG_SOFTMAX_SYSTEM] = lambda u: recognize_ctc_by_log_softmax(ctc_model, u, args.device)
            same = [recognize_ctc(ctc_model, u, args.device)[0] == systems[LOG_SOFTMAX_SYSTEM](u)[0]
                    for u in warmup + utterances]
            if not all(same):
                raise RuntimeError(f"greedy by argmax and by log-softmax differ on {same.count(False)} utterances")
        screened = (screen_agreement(args, ctc_model, ce_model, systems, warmup + utterances)
                    if args.argmax == "screened" and args.check_screen else None)
        for name, recognize in systems.items():
            timed_pass(recognize, warmup, args.device)
            print(f"{name}: {len(warmup)} warm-up utterances done", flush=True)
        audio = sum(u.duration for u in utterances)
        passes = {name: [] for name in systems}
        generated, hypotheses = [], {}
        for index in range(args.passes):
            # The systems take turns on every utterance (one pass of each), so that a shared
            # machine's changing load reaches all of them alike; --interleave pass runs whole
            # passes one after the other instead.
            if args.interleave == "utterance":
                rounds = [tuple(systems)]
            else:
                rounds = ([("LLM-CTC", LOG_SOFTMAX_SYSTEM), ("LLM-CE",)] if args.compare_log_softmax
                          else [(name,) for name in systems])
            for names in rounds:
                load = os.getloadavg()[0]
                timings = timed_passes([systems[name] for name in names], utterances, args.device)
                for name, (seconds, lengths, texts) in zip(names, timings):
                    hypotheses[name] = texts
                    passes[name].append(dict(system=name, pass_index=index + 1, seconds=seconds, audio_seconds=audio,
                                             rtf=seconds / audio, load_start=load, load_end=os.getloadavg()[0]))
                    if name == "LLM-CE":
                        generated = lengths
                    print(f"pass {index + 1} {name}: RTF {seconds / audio:.4f} (load {load:.2f})", flush=True)
    expected = [limits[u.cut_id] - 1 for u in utterances]
    return dict(passes=passes, audio=audio, generated=generated, expected=expected, hypotheses=hypotheses,
                screened=screened, cut_ids=[u.cut_id for u in utterances])


LOG_SOFTMAX_SYSTEM = "LLM-CTC, log-softmax greedy"


def write_results(args, result, elapsed: float) -> None:
    passes = result["passes"]
    median = {name: statistics.median(p["rtf"] for p in rows) for name, rows in passes.items()}
    speedup = median["LLM-CE"] / median["LLM-CTC"]
    rows = [row for name in passes for row in passes[name]]
    rows += [dict(system=name, pass_index="median", rtf=value) for name, value in median.items()]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    suffix = args.device + (f"_{args.label}" if args.label else "")
    write_csv(rows, args.output_dir / f"rtf_{suffix}.csv")
    write_hypotheses(result, args.output_dir / f"hypotheses_{suffix}.tsv")
    loads = [f"{p['load_start']:.2f}-{p['load_end']:.2f}" for name in passes for p in passes[name]]
    stopped_early = sum(g < e for g, e in zip(result["generated"], result["expected"]))
    lines = ["# LLM-CTC against LLM-CE: real-time factor on the same model (paper App. D.3 protocol)", "",
             *provenance_lines(args.device), "",
             f"Model: {model_description(args)}; {precision_description(args)}. Inputs: {args.input_description}, "
             f"{result['audio']:.1f} s of audio, after {args.warmup} warm-up utterances; batch 1, "
             f"{args.threads} torch thread(s), greedy; {args.passes} passes per system, the systems taking turns "
             f"{'on every utterance' if args.interleave == 'utterance' else 'pass by pass'}. "
             f"LLM-CE generated {sum(result['generated']):,} tokens in the last pass, |y_n| + 1 steps per "
             f"utterance, the last where a trained model emits EOS (references: "
             f"{sum(result['expected']):,} tokens; {stopped_early} utterances stopped at an EOS before "
             f"that). 1-minute load at the start-end of each pass: "
             f"{', '.join(loads)}. Wall time {elapsed:.0f} s.", "",
             "| system | RTF per pass | median RTF |", "|---|---|---|"]
    for name, values in passes.items():
        per_pass = " ".join(f"{p['rtf']:.4f}" for p in values)
        lines.append(f"| {name} | {per_pass} | {median[name]:.4f} |")
    per_pass = [ce["rtf"] / ctc["rtf"] for ctc, ce in zip(passes["LLM-CTC"], passes["LLM-CE"])]
    lines += ["", f"**LLM-CTC is {speedup:.2f}x faster than LLM-CE** (median RTF ratio; target >= 5x on CPU). "
                  f"Ratio in each pass: {', '.join(f'{r:.2f}x' for r in per_pass)}."]
    if LOG_SOFTMAX_SYSTEM in median:
        saved = 1.0 - median["LLM-CTC"] / median[LOG_SOFTMAX_SYSTEM]
        lines += ["", f"Greedy search by the argmax of the logits (LLM-CTC) instead of the (T, V) log-softmax "
                      f"({LOG_SOFTMAX_SYSTEM}; the same hypotheses on every utterance, the two timed in turn "
                      f"on each utterance): {100 * abs(saved):.1f}% {'less' if saved >= 0 else 'more'} time "
                      f"(median RTFs {median['LLM-CTC']:.4f} vs {median[LOG_SOFTMAX_SYSTEM]:.4f})."]
    if result["screened"]:
        total = args.warmup + len(result["cut_ids"])
        lines += ["", "Greedy argmax screened by a BF16 product against the exact float32 argmax: the same "
                      "hypotheses on " + ", ".join(f"{count} of {total} utterances ({name})"
                                                   for name, count in result["screened"].items()) + "."]
    if args.reference_hypotheses:
        lines += ["", compare_hypotheses(result, args.reference_hypotheses)]
    lines += ["", "Paper (SPEAR-Qwen3 on GigaSpeech test, H100, BF16 LLM, FP32 head):", "",
              "| Qwen3 | LLM-CE RTF | LLM-CTC RTF | speed-up |", "|---|---|---|---|"]
    for size, (ce, ctc) in PAPER.items():
        lines.append(f"| {size} | {ce:.4f} | {ctc:.4f} | {ce / ctc:.1f}x |")
    write_text("\n".join(lines) + "\n", args.output_dir / f"results_{suffix}.md")


def write_hypotheses(result, path: Path) -> None:
    """cut id, system, text of the last timed pass (tab-separated)."""
    rows = [f"{cut}\t{name}\t{text}" for name, texts in result["hypotheses"].items()
            for cut, text in zip(result["cut_ids"], texts)]
    write_text("cut_id\tsystem\ttext\n" + "\n".join(rows) + "\n", path)


def read_hypotheses(path: Path) -> dict:
    if not path.is_file():
        raise SystemExit(f"--reference-hypotheses: {path} does not exist (a hypotheses_*.tsv of an earlier run)")
    with open(path) as handle:
        header = handle.readline().rstrip("\n").split("\t")
        if header != ["cut_id", "system", "text"]:
            raise SystemExit(f"--reference-hypotheses: {path} has columns {header}, expected cut_id, system, text")
        return {tuple(line.rstrip("\n").split("\t")[:2]): line.rstrip("\n").split("\t", 2)[2] for line in handle}


def compare_hypotheses(result, path: Path) -> str:
    """How many utterances' hypotheses differ from those of another run (another precision)."""
    reference = read_hypotheses(path)
    parts = []
    for name, texts in result["hypotheses"].items():
        pairs = [(reference.get((cut, name)), text) for cut, text in zip(result["cut_ids"], texts)]
        missing = sum(r is None for r, _ in pairs)
        differ = sum(r is not None and r != t for r, t in pairs)
        parts.append(f"{name}: {differ} of {len(pairs) - missing} differ"
                     + (f" ({missing} not in it)" if missing else ""))
    return f"Hypotheses against {path.name}: " + "; ".join(parts) + "."


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_arguments(parser)
    parser.add_argument("--utterances", type=int, default=32, help="timed utterances (after the warm-up ones)")
    parser.add_argument("--warmup", type=int, default=32, help="warm-up utterances (App. D.3: 32)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per system (App. D.3: 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/llm_rtf"))
    parser.add_argument("--compare-log-softmax", action="store_true",
                        help="also time LLM-CTC greedy through the (T, V) log-softmax (the path before the argmax)")
    parser.add_argument("--no-check-screen", dest="check_screen", action="store_false",
                        help="skip decoding every utterance with the exact argmax too (the screened one's check)")
    parser.add_argument("--interleave", default="utterance", choices=["utterance", "pass"],
                        help="the systems take turns on every utterance, or pass by pass")
    parser.add_argument("--label", default="", help="suffix of the output files (results_cpu_LABEL.md...)")
    parser.add_argument("--reference-hypotheses", type=Path, default=None,
                        help="hypotheses_*.tsv of another run: count the utterances whose hypotheses differ")
    add_model_arguments(parser)
    add_precision_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("utterances", "passes", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    manifest = start_run(args)
    warmup, utterances = warmup_and_timed_utterances(args)
    args.input_description = (f"{len(utterances)} synthesized utterances" if manifest is None else
                              f"{len(utterances)} utterances of {manifest.name}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        work_dir = args.work_dir or Path(scratch)
        work_dir.mkdir(parents=True, exist_ok=True)
        ctc_model, ce_model = build_systems(args, work_dir)
        result = measure(args, ctc_model, ce_model, utterances, warmup)
    write_results(args, result, time.perf_counter() - started)
    print((args.output_dir / f"results_{args.device}{'_' + args.label if args.label else ''}.md").read_text())


if __name__ == "__main__":
    main()
