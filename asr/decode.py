"""Decode test sets with a trained CTC model of any family, for every corpus.

    python -m asr.decode --config egs/librispeech/conf/train.yaml decode.epoch=last decode.avg=15 \\
        decode.test_cuts=data/fbank/librispeech_cuts_test-clean.jsonl.gz
    python -m asr.decode --exp-dir exp/m --epoch 30 --avg 15 --method ctc-prefix-beam-search \\
        --test-cuts data/fbank/librispeech_cuts_test-clean.jsonl.gz

The ``decode`` section of the run's configuration (:class:`asr.config.DecodeOptions`)
chooses the weights as icefall's decoders do (``epoch`` or ``iter``, each a number or
``last``; ``avg``; ``use_averaged_model``) and the search (``methods``, ``beam``,
``token_penalty``); the model and lexicon come from the configuration saved in the
chosen checkpoint. With ``--config`` the preset and its overrides give the decode
section; without it, the checkpoint's saved configuration does. The icefall-style flags
(``--exp-dir``, ``--epoch``, ``--avg``, ...) are the same overrides under their familiar
names.

The program reads top to bottom: checkpoints and their configuration, model, lexicon,
then per test set batches -> full-vocabulary log-probs -> search -> text -> scores and
icefall's ``recogs-*``, ``errs-*``, ``wer-summary-*`` files in the experiment folder. A
test set whose summary already lists every decoding setting is not decoded again; the
table of every test set's error rates is printed at the end.

A streaming LLM-CTC model (``model.streaming``) also decodes by ``ctc-streaming-greedy-search``
/ ``ctc-streaming-prefix-beam-search``: each utterance chunk by chunk with a bounded KV
cache, one setting per ``decode.history_seconds`` value (``..._history-8s`` in the file
names); the largest cache of every utterance is checked against P + 2A + J (paper App. E).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from asr.averaging import decoding_checkpoint_paths, weights_for_decoding
from asr.checkpoint import (
    CheckpointConfigMismatch,
    check_config_matches,
    list_epoch_checkpoints,
    list_iteration_checkpoints,
    load_model_weights,
    read_checkpoint_entry,
)
from asr.config import (CHANGEABLE_ON_RESUME, GENERATION_METHODS, STREAMING_METHODS, DecodeOptions, RunConfig,
                        load_run_config)
from asr.cut_filters import FRAME_SHIFT_SECONDS, cut_text
from asr.data import build_valid_dataloader, load_cuts_lazy
from asr.family import load_family, load_lexicon_of
from asr.logs import format_duration, setup_logging
from asr.scoring import Result, normalize_gigaspeech_text, read_wer_summary, save_results
from asr.search import ctc_collapse, ctc_greedy_search, ctc_prefix_beam_search
from asr.tokenizer import CharTokenizer, Tokenizer

TEXT_NORMALIZERS: Dict[str, Optional[Callable[[str], str]]] = {
    "none": None,
    "gigaspeech": normalize_gigaspeech_text,
}

# icefall-style flags and the override each stands for.
FLAG_OVERRIDES = {
    "exp_dir": "train.exp_dir", "lang_dir": "train.lang_dir", "num_workers": "data.num_workers",
    "epoch": "decode.epoch", "iter": "decode.iter", "avg": "decode.avg",
    "use_averaged_model": "decode.use_averaged_model", "method": "decode.methods", "beam_size": "decode.beam_size",
    "token_penalty": "decode.token_penalty", "test_cuts": "decode.test_cuts",
    "max_duration": "decode.max_duration", "compute_cer": "decode.compute_cer",
    "text_normalization": "decode.text_normalization", "device": "decode.device",
    "history_seconds": "decode.history_seconds",
}


@dataclass
class Weights:
    """The chosen checkpoint(s) and the configuration they were trained with."""

    epoch: int  # the chosen epoch-<epoch>.pt, or 0
    iteration: int  # the chosen checkpoint-<iteration>.pt, or 0
    paths: List[Path]  # oldest first; the last one is the chosen checkpoint
    suffix: str  # icefall's part of the result file names, e.g. epoch-30_avg-15_use-averaged-model
    saved: RunConfig


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Returns test set -> decoding setting -> WER/CER in percent (as in the files)."""
    args = parse_args(argv)
    try:
        config = effective_config(args)
        options = config.decode
        exp_dir = Path(config.train.exp_dir)
        if not exp_dir.is_dir():
            raise FileNotFoundError(f"train.exp_dir: experiment folder not found: {exp_dir}")
        weights = choose_weights(exp_dir, options)
        test_sets = parse_test_sets(options.test_cuts)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    keys = [key for _, _, key in decoding_settings(options)]
    setup_logging(exp_dir, f"decode-{weights.suffix}")
    tokenizer = load_lexicon(config.train.lang_dir, weights.saved)
    compute_cer = options.compute_cer == "true" or (options.compute_cer == "auto" and isinstance(tokenizer, CharTokenizer))
    unit = "CER" if compute_cer else "WER"

    # Test sets decoded already (their summary lists every setting) are only reported.
    rates: Dict[str, Dict[str, float]] = {}
    todo = []
    for name, manifest in test_sets:
        done = read_wer_summary(exp_dir, name, weights.suffix)
        if all(key in done for key in keys):
            logging.info("%s: decoded already (wer-summary-%s-%s.txt), skipping", name, name, weights.suffix)
            rates[name] = {key: done[key] for key in keys}
        else:
            todo.append((name, manifest))
    if not todo:
        print_summary(rates, exp_dir, weights.suffix, unit)
        return rates

    # Model and lexicon, as trained.
    logging.info("decoding with %s (%s)", ", ".join(str(p) for p in weights.paths), weights.suffix)
    real_time_factors: Dict[str, Dict[str, float]] = {}
    device = choose_device(options.device)
    model = load_family(weights.saved.family).build_model(weights.saved.model, tokenizer.vocab_size,
                                                           tokenizer.blank_id)
    check_methods(model, options.methods, weights.saved.family)
    load_model_weights(model, weights_for_decoding(exp_dir, epoch=weights.epoch, iteration=weights.iteration,
                                                   avg=options.avg, use_averaged_model=options.use_averaged_model))
    if hasattr(model, "prepare_for_decoding"):
        model.prepare_for_decoding()
    model.to(device).eval()
    data = dataclasses.replace(config.data, max_duration=options.max_duration or config.data.max_duration)

    for name, manifest in todo:
        num_cuts, seconds = count_cuts(manifest)
        if num_cuts == 0:
            print(f"Test set {name} ({manifest}) has no cuts: nothing to decode, no result files written.")
            continue
        logging.info("test set %s: %d cuts, %.1f minutes of audio, from %s", name, num_cuts, seconds / 60, manifest)
        loader = build_valid_dataloader(dataclasses.replace(data, valid_cuts=str(manifest)))
        results, rtfs = decode_test_set(model, loader, tokenizer, options, device, name, num_cuts, seconds)
        rates[name] = save_results(exp_dir, name, results, compute_cer=compute_cer,
                                   text_normalizer=TEXT_NORMALIZERS[options.text_normalization], suffix=weights.suffix)
        real_time_factors[name] = rtfs
    print_summary(rates, exp_dir, weights.suffix, unit, real_time_factors)
    return rates


def effective_config(args: argparse.Namespace) -> RunConfig:
    """The run configuration whose decode section (and paths) this decoding uses."""
    overrides = list(args.overrides) + flag_overrides(args)
    if args.config is not None:
        return load_run_config(args.config, overrides)
    exp_dir = next((o.partition("=")[2] for o in reversed(overrides) if o.startswith("train.exp_dir=")), None)
    if exp_dir is None:
        raise ValueError("give --config (the training preset) or --exp-dir (train.exp_dir=...)")
    if not Path(exp_dir).is_dir():
        raise FileNotFoundError(f"train.exp_dir: experiment folder not found: {exp_dir}")
    newest = newest_checkpoint(Path(exp_dir))
    return RunConfig.from_dict(read_checkpoint_entry(newest, "config"), overrides)


def flag_overrides(args: argparse.Namespace) -> List[str]:
    overrides = []
    for flag, key in FLAG_OVERRIDES.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return overrides


def newest_checkpoint(exp_dir: Path) -> Path:
    found = list_epoch_checkpoints(exp_dir) + list_iteration_checkpoints(exp_dir)
    if not found:
        raise FileNotFoundError(f"no epoch-*.pt or checkpoint-*.pt in {exp_dir}")
    return max(found, key=lambda item: item[1].stat().st_mtime)[1]


def choose_weights(exp_dir: Path, options: DecodeOptions) -> Weights:
    """Resolve ``last`` and find the files to average; their configurations must agree."""
    if options.iter != "0":
        iteration = resolve_last(options.iter, list_iteration_checkpoints(exp_dir), exp_dir, "checkpoint-*.pt")
        epoch, suffix = 0, f"iter-{iteration}_avg-{options.avg}"
    else:
        epoch = resolve_last(options.epoch, list_epoch_checkpoints(exp_dir), exp_dir, "epoch-*.pt")
        iteration, suffix = 0, f"epoch-{epoch}_avg-{options.avg}"
    suffix += "_use-averaged-model" if options.use_averaged_model else ""
    paths = decoding_checkpoint_paths(exp_dir, epoch=epoch, iteration=iteration, avg=options.avg,
                                      use_averaged_model=options.use_averaged_model)
    chosen = read_checkpoint_entry(paths[-1], "config")
    for path in paths[:-1]:
        try:
            check_config_matches(read_checkpoint_entry(path, "config"), chosen, source=path, ignore=CHANGEABLE_ON_RESUME)
        except CheckpointConfigMismatch as error:
            raise ValueError(f"{error} {paths[-1]} (cannot average checkpoints of different models)") from None
    return Weights(epoch, iteration, paths, suffix, RunConfig.from_dict(chosen))


def resolve_last(value: str, found: List[Tuple[int, Path]], exp_dir: Path, pattern: str) -> int:
    if value != "last":
        return int(value)
    if not found:
        raise FileNotFoundError(f"'last' asks for the newest {pattern} of {exp_dir}, but there is none")
    return found[0][0]


def check_methods(model: torch.nn.Module, methods: Sequence[str], family: str) -> None:
    """CTC search needs ``log_probs``, generation ``generate_ids``, streaming decoding
    ``streaming_ids`` (asr.family)."""
    for method in methods:
        if method in STREAMING_METHODS:
            if not hasattr(model, "streaming_ids"):
                raise SystemExit(f"ERROR: decode.methods: {method} needs a streaming model (streaming_ids(); "
                                 f"LLM-CTC trained with model.streaming=true), not this {family} model "
                                 f"({type(model).__name__})")
            continue
        needed = "generate_ids" if method in GENERATION_METHODS else "log_probs"
        if not hasattr(model, needed):
            kind = "generation (llm-* methods)" if needed == "log_probs" else "CTC search (ctc-* methods)"
            raise SystemExit(f"ERROR: decode.methods: {method} needs a model with {needed}(), but this "
                             f"{family} model ({type(model).__name__}) decodes by {kind} only")


def decode_test_set(
    model: torch.nn.Module, loader: torch.utils.data.DataLoader, tokenizer: Tokenizer, options: DecodeOptions,
    device: torch.device, name: str, num_cuts: int, seconds: float,
) -> Tuple[Dict[str, List[Result]], Dict[str, float]]:
    """Decoding setting -> (cut_id, reference words, hypothesis words) of every cut, and
    decoding setting -> real-time factor (seconds of computation per second of audio;
    the CTC methods share the time of the model's one forward pass per batch)."""
    settings = decoding_settings(options)
    results: Dict[str, List[Result]] = {key: [] for _, _, key in settings}
    busy = {key: 0.0 for _, _, key in settings}
    largest_cache: Dict[str, int] = {}
    ctc_methods = [m for m in options.methods if m not in GENERATION_METHODS + STREAMING_METHODS]
    started, done_cuts, done_seconds = time.monotonic(), 0, 0.0
    last_report = started
    for batch_index, batch in enumerate(loader, start=1):
        features, feature_lens = batch["features"].to(device), batch["feature_lens"].to(device)
        # An LLM tokenizer's hypotheses are lowercased: so are its references.
        references = [tokenizer.normalize_reference(text).split() for text in batch["texts"]]
        forward_seconds = 0.0
        if ctc_methods:
            forward_started = time.perf_counter()
            with torch.inference_mode():
                if ctc_methods == ["ctc-greedy-search"] and hasattr(model, "best_frame_ids"):
                    # Greedy search alone needs each frame's argmax, not (N, T', V) log-probs.
                    log_probs, lengths = model.best_frame_ids(features, feature_lens)
                else:
                    log_probs, lengths = model.log_probs(features, feature_lens)
            forward_seconds = time.perf_counter() - forward_started
        for method, history, key in settings:
            method_started = time.perf_counter()
            if method in STREAMING_METHODS:
                token_ids, caches = model.streaming_ids(features, feature_lens, history, method, beam=options.beam_size,
                                                        token_penalty=options.token_penalty)
                largest_cache[key] = max(largest_cache.get(key, 0), *caches)
            else:
                token_ids = search_batch(model, method, options, tokenizer.blank_id, features, feature_lens,
                                         *((log_probs, lengths) if method in ctc_methods else (None, None)))
            hypotheses = [text.split() for text in tokenizer.decode_batch(token_ids)]
            busy[key] += time.perf_counter() - method_started + (forward_seconds if method in ctc_methods else 0.0)
            results[key].extend(zip(batch["cut_ids"], references, hypotheses))
        done_cuts += len(batch["cut_ids"])
        done_seconds += batch["feature_lens"].sum().item() * FRAME_SHIFT_SECONDS
        now = time.monotonic()
        if now - last_report >= 10.0 or done_cuts == num_cuts:
            last_report = now
            elapsed = max(now - started, 1e-9)
            eta = (seconds - done_seconds) / max(done_seconds / elapsed, 1e-9)
            logging.info("%s: batch %d, %d/%d cuts, %.1f cuts/s, real-time factor %.4f, ETA %s",
                         name, batch_index, done_cuts, num_cuts, done_cuts / elapsed,
                         elapsed / max(done_seconds, 1e-9), format_duration(eta))
    rtfs = {key: spent / max(done_seconds, 1e-9) for key, spent in busy.items()}
    for key, rtf in rtfs.items():
        logging.info("%s, %s: real-time factor %.4f (%.1f s for %.1f s of audio)", name, key, rtf, busy[key],
                     done_seconds)
    for (_, history, key) in settings:
        if key in largest_cache:  # the model raised if any utterance exceeded the bound
            logging.info("%s, %s: largest KV cache %d positions, within the bound P + 2A + J = %d on every "
                         "utterance", name, key, largest_cache[key], model.cache_bound(history))
    return results, rtfs


def search_batch(model: torch.nn.Module, method: str, options: DecodeOptions, blank_id: int, features: torch.Tensor,
                 feature_lens: torch.Tensor, log_probs: Optional[torch.Tensor],
                 lengths: Optional[torch.Tensor]) -> List[List[int]]:
    """Token ids per utterance of one decoding method; ``log_probs`` (N, T', V), or for
    greedy search alone each frame's best class (N, T')."""
    if method == "ctc-greedy-search":
        if not log_probs.is_floating_point():
            return ctc_collapse(log_probs, lengths, blank_id=blank_id)
        return ctc_greedy_search(log_probs, lengths, blank_id=blank_id)
    if method == "ctc-prefix-beam-search":
        return ctc_prefix_beam_search(log_probs, lengths, beam=options.beam_size, blank_id=blank_id,
                                      token_penalty=options.token_penalty)
    with torch.inference_mode():
        return model.generate_ids(features, feature_lens, beam=None if method == "llm-greedy-search" else options.beam_size)


def decoding_settings(options: DecodeOptions) -> List[Tuple[str, Optional[int], str]]:
    """(method, history seconds or None, key) of every setting: one per method, and one
    per ``decode.history_seconds`` value for the streaming methods."""
    settings = []
    for method in options.methods:
        histories = options.history_seconds if method in STREAMING_METHODS else (None,)
        settings += [(method, history, method_key(method, options, history)) for history in histories]
    return settings


def method_key(method: str, options: DecodeOptions, history: Optional[int] = None) -> str:
    """The setting's name in file names and summaries (icefall's, plus a nonzero token
    penalty, plus the left history of a streaming method: ``_history-8s``)."""
    suffix = "" if history is None else f"_history-{history}s"
    if method in ("ctc-greedy-search", "llm-greedy-search", "ctc-streaming-greedy-search"):
        return method + suffix
    key = f"{method}_beam-{options.beam_size}"
    if options.token_penalty and method in ("ctc-prefix-beam-search", "ctc-streaming-prefix-beam-search"):
        key += f"_token-penalty-{options.token_penalty:g}"
    return key + suffix


def load_lexicon(lang_dir: str, saved: RunConfig) -> Tokenizer:
    """The tokenizer of ``lang_dir`` (or the family's own); its size must be the trained
    model's output size."""
    try:
        tokenizer = load_lexicon_of(saved.family, saved.model, lang_dir)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: train.lang_dir: {error}") from None
    trained_size = getattr(saved.model, "vocab_size", tokenizer.vocab_size)
    if tokenizer.vocab_size != trained_size:
        raise SystemExit(
            f"ERROR: train.lang_dir {lang_dir} has {tokenizer.vocab_size} tokens but the model was trained "
            f"with field 'model.vocab_size' = {trained_size}: give the lang dir used for training")
    return tokenizer


def parse_test_sets(text: str) -> List[Tuple[str, Path]]:
    """``NAME=PATH`` or ``PATH`` items, comma separated; a path's name is what follows
    ``_cuts_`` in its file name (``librispeech_cuts_test-clean.jsonl.gz`` -> ``test-clean``,
    ``dev_cuts.jsonl.gz`` -> ``dev``)."""
    test_sets = []
    for item in (piece.strip() for piece in text.split(",")):
        if not item:
            continue
        name, _, path = item.rpartition("=")
        path = Path(path)
        if not name:
            stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
            name = stem.rpartition("_cuts_")[2] if "_cuts_" in stem else stem.removesuffix("_cuts")
        if not path.is_file():
            raise FileNotFoundError(f"decode.test_cuts: cut manifest not found: {path}")
        test_sets.append((name, path))
    if not test_sets:
        raise ValueError(f"decode.test_cuts: no cut manifest given ({text!r})")
    names = [name for name, _ in test_sets]
    if len(set(names)) != len(names):
        raise ValueError(f"decode.test_cuts: test set names {names} repeat; name them as NAME=PATH")
    return test_sets


def count_cuts(manifest: Path) -> Tuple[int, float]:
    """Number of cuts and their total duration in seconds (one lazy pass)."""
    opener = gzip.open if manifest.name.endswith(".gz") else open
    with opener(manifest, "rt", encoding="utf-8") as lines:
        if not any(line.strip() for line in lines):
            return 0, 0.0  # Lhotse cannot read an empty manifest back
    count, seconds = 0, 0.0
    for cut in load_cuts_lazy(manifest, "decode.test_cuts"):
        if cut_text(cut) is not None:
            count += 1
            seconds += cut.duration
    return count, seconds


def print_summary(rates: Dict[str, Dict[str, float]], exp_dir: Path, suffix: str, unit: str,
                  real_time_factors: Optional[Dict[str, Dict[str, float]]] = None) -> None:
    """The table of error rates (and the real-time factor of the sets decoded now)."""
    if not rates:
        print("No test set had cuts: nothing was decoded.")
        return
    real_time_factors = real_time_factors or {}
    lines = [f"{unit} (%) of {exp_dir}, {suffix}:"]
    for name, by_key in rates.items():
        for key, rate in sorted(by_key.items(), key=lambda item: item[1]):
            rtf = real_time_factors.get(name, {}).get(key)
            lines.append(f"  {name:<16} {key:<40} {rate:6.2f}" + ("" if rtf is None else f"   RTF {rtf:.4f}"))
    print("\n".join(lines))


def choose_device(option: str) -> torch.device:
    if option == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if option == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ERROR: decode.device=cuda but no CUDA device is available")
    return torch.device(option)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Decode test sets with a trained CTC model.",
        epilog="Overrides: section.field=value, e.g. decode.epoch=last decode.avg=15 decode.beam_size=8. "
               "Each flag below is one of them under icefall's name (no defaults of its own: "
               "asr.config.DecodeOptions holds them).")
    parser.add_argument("--config", type=Path, default=None, help="the training preset (else: the checkpoint's)")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides")
    parser.add_argument("--exp-dir", help="train.exp_dir")
    parser.add_argument("--epoch", help="decode.epoch: a number or 'last'")
    parser.add_argument("--iter", help="decode.iter: a batch number, 'last', or 0 (use --epoch)")
    parser.add_argument("--avg", help="decode.avg")
    parser.add_argument("--use-averaged-model", help="decode.use_averaged_model (true/false)")
    parser.add_argument("--method", nargs="+", help="decode.methods")
    parser.add_argument("--beam-size", help="decode.beam_size")
    parser.add_argument("--token-penalty", help="decode.token_penalty")
    parser.add_argument("--test-cuts", help="decode.test_cuts: comma-separated manifests or NAME=PATH items")
    parser.add_argument("--lang-dir", help="train.lang_dir")
    parser.add_argument("--compute-cer", help="decode.compute_cer: auto, true, false")
    parser.add_argument("--text-normalization", help="decode.text_normalization: none, gigaspeech")
    parser.add_argument("--max-duration", help="decode.max_duration")
    parser.add_argument("--num-workers", help="data.num_workers")
    parser.add_argument("--device", help="decode.device: auto, cpu, cuda")
    parser.add_argument("--history-seconds", nargs="+", help="decode.history_seconds (ctc-streaming-* methods)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
