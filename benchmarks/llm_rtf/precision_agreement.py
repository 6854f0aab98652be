"""Do the RTF benchmark's timing precision settings change a trained model's greedy
hypotheses? A trained LLM-CTC or LLM-CE checkpoint of the toolkit (egs/mini stages 7-9) is
decoded twice, utterance by utterance (batch 1): as trained (FP32 weights, FP32
encoder/projector, exact float32 head argmax) and at the paper's timing settings (App. D.3:
BF16 LLM weights, a resident FP32 head, BF16-autocast encoder/projector, the screened
argmax; benchmarks/llm_rtf/systems.py). Reports the utterances whose hypotheses differ and both WERs.

From the repository root (the egs/mini test cuts by default):
    python -m benchmarks.llm_rtf.precision_agreement \\
        --checkpoint egs/mini/exp/full_llm_ctc/checkpoint-600.pt --utterances 200 \\
        --output benchmarks/llm_rtf/precision_trained_llm_ctc.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import kaldialign
import torch

from benchmarks.llm_rtf.systems import PAPER_PRECISION, apply_precision
from benchmarks.llm_support import MINI_TEST_CUTS, batch_of, load_utterances
from benchmarks.support import provenance_lines, write_text


def load(checkpoint: Path, entry: str, paper_precision: bool):
    from llm_ctc.build import build_model
    from llm_ctc.config import LLMASRConfig

    contents = torch.load(checkpoint, map_location="cpu", weights_only=False)
    try:
        config = LLMASRConfig.from_dict(contents["config"]["model"])
        state = contents[entry]
    except (KeyError, TypeError) as error:
        raise SystemExit(f"--checkpoint: {checkpoint} is not a toolkit LLM-CTC/LLM-CE checkpoint with "
                         f"config.model and {entry!r} ({error})") from error
    # Paths the run saved relative to its recipe folder (egs/mini: data/full/tiny_qwen3)
    # resolve from wherever this runs, as asr.decode resolves them.
    from asr.weights import resolve_path, run_directory
    from llm_ctc.family import FAMILY

    bases = (run_directory(checkpoint.parent, (contents.get("config", {}).get("train") or {}).get("exp_dir", "")),
             checkpoint.parent.resolve())
    for name in FAMILY.path_fields:
        setattr(config, name, resolve_path(getattr(config, name), *bases))
    if paper_precision:
        config.llm_dtype = PAPER_PRECISION["llm_dtype"]
    model = build_model(config)
    model.load_checkpoint_state_dict(state)
    model.prepare_for_decoding()
    model.eval()
    if paper_precision:
        apply_precision(model, argparse.Namespace(device="cpu", **PAPER_PRECISION))
    return model


def recognize(model, utterance) -> str:
    features, lengths = batch_of([utterance])
    with torch.inference_mode():
        if model.config.objective == "ctc":
            from llm_ctc.decoding import recognize as ctc_recognize

            return ctc_recognize(model, features, lengths)[1][0]
        return model.decode_ids(model.generate_ids(features, lengths)[0])


def word_errors(reference: str, hypothesis: str) -> int:
    """Substitutions + deletions + insertions of the word-level Levenshtein alignment (kaldialign)."""
    return kaldialign.edit_distance(reference.split(), hypothesis.split())["total"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_rtf.precision_agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--entry", default="model_avg", choices=["model", "model_avg", "trainable"],
                        help="the trainable weights: a toolkit checkpoint's model / model_avg, or the "
                             "'trainable' entry of llm_ctc.checkpoint.save_model_checkpoint")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--cuts", type=Path, default=MINI_TEST_CUTS)
    source.add_argument("--synthesized", action="store_true", help="random features and word-list sentences")
    parser.add_argument("--utterances", type=int, default=200)
    parser.add_argument("--output", type=Path, required=True, help="markdown report")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        raise SystemExit(f"--checkpoint: {args.checkpoint} does not exist")
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    utterances = load_utterances(None if args.synthesized else args.cuts, args.utterances)
    models = {"as trained (FP32)": load(args.checkpoint, args.entry, False),
              "paper timing settings (BF16 LLM, FP32 head)": load(args.checkpoint, args.entry, True)}
    hypotheses = {name: [recognize(model, u) for u in utterances] for name, model in models.items()}
    references = [u.text.lower() for u in utterances]
    words = sum(len(r.split()) for r in references)
    (first, a), (second, b) = hypotheses.items()
    differ = sum(x != y for x, y in zip(a, b))
    objective = next(iter(models.values())).config.objective
    lines = [f"# Greedy hypotheses of a trained LLM-{objective.upper()} at two precisions", "",
             *provenance_lines("cpu"), "",
             f"Checkpoint {args.checkpoint} ({args.entry}); {len(utterances)} utterances of "
             f"{'synthesized features' if args.synthesized else args.cuts.name} "
             f"({words} words), batch 1, greedy. Wall time {time.perf_counter() - started:.0f} s.", "",
             f"**{differ} of {len(utterances)} utterances' hypotheses differ.**", "",
             "| setting | WER |", "|---|---|"]
    for name, texts in hypotheses.items():
        errors = sum(word_errors(r, h) for r, h in zip(references, texts))
        lines.append(f"| {name} | {100 * errors / words:.2f}% |")
    write_text("\n".join(lines) + "\n", args.output)
    print(args.output.read_text())


if __name__ == "__main__":
    main()
