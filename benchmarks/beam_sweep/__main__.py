"""Alignment-beam sweep (paper App. B.3, Fig. 5): discarded posterior mass per utterance.

For every batch, the head and the selected log-probabilities S are computed once; the
alignment DP then runs unpruned (L_n) and at every beam beta (L_beta,n) on identical S, in
FP64. The estimated discarded alignment posterior mass of utterance n is
delta_n = -expm1(-(L_beta,n - L_n)), and the required beam of a batch is the smallest
tested beam with max_n delta_n <= 1e-11 (the paper's criterion).

Two kinds of input:

- synthetic (the default, no corpus needed): batches of utterances with exactly 100
  encoder frames and about 25 Zipf-distributed target tokens (App. C.2), head-input
  states drawn like those of a randomly initialized model (unit-variance entries, head
  weights with variance 1/D); one batch per (V, M, seed).
- ``--cuts``: real fbank features of a Lhotse cut manifest (default: the egs/mini training
  cuts) fed through a randomly initialized Zipformer CTC model (``--preset``, eval mode,
  one initialization per seed) as in the paper's GigaSpeech analysis, targets tokenized
  with the lang dir's BPE model (``--lang-dir``). Consecutive cuts whose targets fit
  their encoder frames fill batches of up to ``--max-duration`` seconds; no augmentation.
  Outputs are named ``*_real_<preset>_v<V>_<device>``.

Examples (the committed CPU results), from the repository root:
    python -m benchmarks.beam_sweep --vocab-sizes 500 2000 10000 50000 100000 \\
        --frames 2000 4000 --seeds 0 1 2
    python -m benchmarks.beam_sweep --cuts --seeds 0 1 2
    python -m benchmarks.beam_sweep --cuts --preset M --lang-dir egs/mini/data/full/lang_bpe_500 \\
        --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import torch

from benchmarks.support import (REPO, add_grid_arguments, discarded_mass, head_batch, provenance_lines,
                                write_csv, write_text)
from pruned_ctc import DEFAULT_CHUNK_SIZE

CRITERION = 1e-11
MINI_CUTS = REPO / "egs/mini/data/full/fbank/librispeech_cuts_train-clean-100.jsonl.gz"
MAKE_MINI_DATA = "cd egs/mini && ./run.sh --stop-stage 3"


def mini_lang_dir() -> Path:
    """The lang dir the mini recipe builds: lang_bpe_<vocab_size of egs/mini/conf/data.sh>."""
    settings = REPO / "egs/mini/conf/data.sh"
    match = re.search(r"^vocab_size=(\d+)", settings.read_text(), re.MULTILINE) if (
        settings.exists()) else None
    return REPO / f"egs/mini/data/full/lang_bpe_{match.group(1) if match else 500}"


def synthetic_discarded_mass(vocab_size: int, num_frames: int, seed: int, beams: list[float],
                             dim: int, chunk_size: int, device: str) -> dict[float, torch.Tensor]:
    """{beam: delta (N,) float64} for one synthetic batch."""
    encoder_out, weight, bias, targets, frame_counts, target_lengths = head_batch(
        vocab_size, num_frames, dim, device, seed=seed)
    return discarded_mass(encoder_out, frame_counts, weight, bias, targets, beams, chunk_size,
                          target_lengths)[1]


def check_real_inputs(cuts: Path, lang_dir: Path) -> None:
    """SystemExit naming what is missing and how to make it."""
    for option, path in (("--cuts", cuts), ("--lang-dir", lang_dir)):
        if not path.exists():
            raise SystemExit(f"{option}: {path} does not exist. The mini corpus's features "
                             f"and BPE models ({MINI_CUTS.relative_to(REPO)}, "
                             f"{mini_lang_dir().relative_to(REPO)}) are made by `{MAKE_MINI_DATA}`; "
                             "another corpus's can be given with --cuts and --lang-dir")


def features_root(cut, manifest: Path) -> Optional[Path]:
    """Where a cut's relative feature paths start: recipes store them relative to the
    recipe folder (where run.sh ran), so the manifest's nearest ancestor holding them;
    None if they resolve from the working directory."""
    storage = Path(cut.features.storage_path)
    if storage.is_absolute() or storage.exists():
        return None
    for ancestor in manifest.resolve().parents:
        if (ancestor / storage).exists():
            return ancestor
    raise FileNotFoundError(f"{manifest}: cut {cut.id}'s features {storage} are found neither "
                            "from the working directory nor from any folder above the manifest")


def real_feature_batches(manifest: Path, tokenizer, max_duration: float,
                         num_batches: int) -> Iterator[dict]:
    """Batches of consecutive cuts (up to ``max_duration`` seconds) whose BPE targets fit
    their encoder frames, as asr.data.AsrDataset yields them plus ``targets``."""
    from lhotse import CutSet, load_manifest_lazy

    from asr.cut_filters import cut_num_frames, cut_text, is_alignable
    from asr.data import AsrDataset

    dataset = AsrDataset()
    root: Optional[Path] = None
    pending, seconds, produced = [], 0.0, 0

    def collate(cuts):
        batch = dataset[CutSet.from_cuts(cuts)]
        batch["targets"] = tokenizer.encode(batch["texts"])
        return batch

    for index, cut in enumerate(load_manifest_lazy(manifest)):
        if index == 0:
            root = features_root(cut, manifest)
        targets = tokenizer.encode([cut_text(cut)])[0]
        if not targets or not is_alignable(cut_num_frames(cut), targets):
            continue
        if root is not None:
            cut = cut.with_features_path_prefix(str(root))
        if pending and seconds + cut.duration > max_duration:
            yield collate(pending)
            produced += 1
            if produced == num_batches:
                return
            pending, seconds = [], 0.0
        pending.append(cut)
        seconds += cut.duration
    if pending:
        yield collate(pending)


def sweep_real_features(args, beams: List[float]):
    """Rows per (initialization, batch, beam) and the required beam per batch."""
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset
    from asr.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.lang_dir)
    batches = list(real_feature_batches(args.cuts, tokenizer, args.max_duration, args.num_batches))
    if not batches:
        raise SystemExit(f"--cuts {args.cuts}: no cut has targets that fit its frames")
    rows, required = [], []
    started = time.time()
    total = len(args.seeds) * len(batches)
    for seed in args.seeds:
        torch.manual_seed(seed)
        model = CTCModel(get_preset(args.preset, vocab_size=tokenizer.vocab_size,
                                    blank_id=tokenizer.blank_id)).to(args.device).eval()
        args.params = model.num_parameters()
        for number, batch in enumerate(batches):
            with torch.no_grad():
                encoder_out, frame_counts = model.encode(batch["features"].to(args.device),
                                                         batch["feature_lens"].to(args.device))
            _, deltas = discarded_mass(
                encoder_out, frame_counts, model.head.weight.detach(), model.head.bias.detach(),
                batch["targets"], beams, args.chunk_size, blank_id=tokenizer.blank_id)
            described = dict(seed=seed, batch=number, utterances=len(batch["targets"]),
                             audio_s=round(batch["feature_lens"].sum().item() / 100, 2),
                             frames=int(frame_counts.sum()), vocab_size=tokenizer.vocab_size,
                             selected_classes=1 + len({t for ids in batch["targets"] for t in ids}))
            needed = record(rows, required, described, deltas, beams)
            done = len(required)
            elapsed = time.time() - started
            print(f"[{done}/{total}] seed {seed} batch {number} ({described['utterances']} "
                  f"utterances, M={described['frames']}): required beam {needed} (elapsed "
                  f"{elapsed:.0f} s, ETA {elapsed / done * (total - done):.0f} s)", flush=True)
    return rows, required


def record(rows: list, required: list, described: dict, deltas: Dict[float, torch.Tensor],
           beams: List[float]) -> Optional[float]:
    """Appends one batch's per-beam rows and its required beam; returns the latter."""
    needed = next((b for b in beams if float(deltas[b].max()) <= CRITERION), None)
    required.append(dict(described, required_beam=needed if needed is not None else ""))
    for beam in beams:
        delta = deltas[beam]
        rows.append(dict(described, beam=beam, utterances=delta.numel(),
                         max_delta=f"{float(delta.max()):.3e}",
                         above_criterion=int((delta > CRITERION).sum())))
    return needed


def sweep_synthetic(args, beams: List[float]):
    rows, required = [], []
    configurations = [(v, m, s) for m in args.frames for v in args.vocab_sizes
                      for s in args.seeds]
    started = time.time()
    for index, (vocab_size, frames, seed) in enumerate(configurations, 1):
        deltas = synthetic_discarded_mass(vocab_size, frames, seed, beams, args.dim, args.chunk_size,
                                args.device)
        needed = record(rows, required, dict(vocab_size=vocab_size, frames=frames, seed=seed),
                        deltas, beams)
        elapsed = time.time() - started
        print(f"[{index}/{len(configurations)}] V={vocab_size} M={frames} seed={seed}: "
              f"required beam {needed} (elapsed {elapsed:.0f} s, ETA "
              f"{elapsed / index * (len(configurations) - index):.0f} s)", flush=True)
    return rows, required


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(parser)
    parser.add_argument("--beams", type=float, nargs="+",
                        default=[float(b) for b in range(10, 151, 10)])
    parser.add_argument("--dim", type=int, default=512, help="synthetic head-input dimension D")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/beam_sweep"))
    real = parser.add_argument_group("real features (--cuts)")
    real.add_argument("--cuts", type=Path, nargs="?", const=MINI_CUTS, default=None,
                      help=f"cut manifest with features (alone: {MINI_CUTS.relative_to(REPO)}); "
                      "--vocab-sizes, --frames and --dim then do not apply")
    real.add_argument("--lang-dir", type=Path, default=mini_lang_dir(),
                      help="lang dir with bpe.model (or a char tokens.txt): the targets and V")
    real.add_argument("--preset", default="mini", help="Zipformer preset, randomly initialized")
    real.add_argument("--max-duration", type=float, default=60.0, help="seconds of audio per batch")
    real.add_argument("--num-batches", type=int, default=10)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    beams = sorted(args.beams)
    if args.cuts is not None:
        check_real_inputs(args.cuts, args.lang_dir)
        rows, required = sweep_real_features(args, beams)
    else:
        rows, required = sweep_synthetic(args, beams)
    write_outputs(rows, required, beams, args)


def write_outputs(rows, required, beams, args) -> None:
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    # A real-feature run is named by its model and vocabulary: runs of several coexist.
    tag = f"real_{args.preset}_v{rows[0]['vocab_size']}_" if args.cuts is not None else ""
    for name, table in (("discarded_mass", rows), ("required_beam", required)):
        write_csv(table, output / f"{name}_{tag}{args.device}.csv")
    title = "real features through a random Zipformer" if args.cuts is not None else "synthetic"
    lines = [f"# Alignment-beam sweep, {title} ({args.device})", ""] + provenance_lines(
        args.device) + [""]
    lines += real_summary(required, args) if args.cuts is not None else synthetic_summary(
        required, args)
    lines += ["", "Largest delta_n over all batches per beam:", "",
              "| beam | max delta_n | utterances above criterion |", "|---|---|---|"]
    for beam in beams:
        selected = [r for r in rows if r["beam"] == beam]
        largest = max(float(r["max_delta"]) for r in selected)
        above = sum(r["above_criterion"] for r in selected)
        total = sum(r["utterances"] for r in selected)
        lines.append(f"| {beam:g} | {largest:.2e} | {above} / {total} |")
    write_text("\n".join(lines) + "\n", output / f"results_{tag}{args.device}.md")
    plot(rows, beams, "seed" if args.cuts is not None else "vocab_size",
         output / f"beam_sweep_{tag}{args.device}.png")


def synthetic_summary(required, args) -> List[str]:
    lines = [f"Required beam = smallest tested beam with max_n delta_n <= {CRITERION:g}; "
             "min / median / max over seeds.", "",
             "| M | V | required beam (min / median / max) |", "|---|---|---|"]
    for frames in args.frames:
        for vocab_size in args.vocab_sizes:
            values = sorted(r["required_beam"] for r in required
                            if r["frames"] == frames and r["vocab_size"] == vocab_size
                            and r["required_beam"] != "")
            if values:
                lines.append(f"| {frames} | {vocab_size} | {values[0]:g} / "
                             f"{values[len(values) // 2]:g} / {values[-1]:g} |")
    return lines


def real_summary(required, args) -> List[str]:
    first = [r for r in required if r["seed"] == args.seeds[0]]
    utterances = sum(r["utterances"] for r in first)
    audio = sum(r["audio_s"] for r in first)
    lines = [f"Cuts `{display(args.cuts)}`, targets from `{display(args.lang_dir)}` "
             f"(V = {required[0]['vocab_size']}); {len(first)} batches of consecutive cuts up "
             f"to {args.max_duration:g} s ({utterances} utterances, {audio:.0f} s of audio, "
             f"M = {min(r['frames'] for r in first)}-{max(r['frames'] for r in first)} encoder "
             f"frames, K = {min(r['selected_classes'] for r in first)}-"
             f"{max(r['selected_classes'] for r in first)}); no augmentation. Zipformer preset "
             f"`{args.preset}` ({args.params:,} parameters), randomly initialized with each seed, "
             "eval mode (no dropout), FP32 head input.", "",
             f"Required beam = smallest tested beam with max_n delta_n <= {CRITERION:g} for the "
             "batch; per initialization, min / median / max over the batches.", "",
             "| seed | batches | required beam (min / median / max) | batches not meeting it "
             "at any beam |", "|---|---|---|---|"]
    for seed in args.seeds:
        own = [r["required_beam"] for r in required if r["seed"] == seed]
        values = sorted(v for v in own if v != "")
        span = (f"{values[0]:g} / {statistics.median_low(values):g} / {values[-1]:g}"
                if values else "-")
        lines.append(f"| {seed} | {len(own)} | {span} | {len(own) - len(values)} |")
    return lines


def display(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def plot(rows, beams, series: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for value in sorted({r[series] for r in rows}):
        largest = [max(float(r["max_delta"]) for r in rows
                       if r["beam"] == b and r[series] == value) for b in beams]
        label = f"V = {value:,}" if series == "vocab_size" else f"{series} {value}"
        axis.semilogy(beams, [max(x, 1e-18) for x in largest], marker="o", label=label)
    axis.axhline(CRITERION, color="gray", linestyle="--", label="1e-11")
    axis.axvline(100, color="black", linestyle=":", label="training beam 100")
    axis.set_xlabel("alignment beam")
    axis.set_ylabel("max discarded mass delta_n (floored at 1e-18)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    temporary = path.with_name("." + path.name + ".tmp.png")
    figure.savefig(temporary, dpi=110)
    os.replace(temporary, path)


if __name__ == "__main__":
    main()
