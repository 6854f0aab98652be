"""Decode test sets with a trained CTC model of any family, for every corpus.

    python -m asr.decode --config egs/librispeech/conf/train.yaml decode.epoch=last decode.avg=15 \\
        decode.test_cuts=data/fbank/librispeech_cuts_test-clean.jsonl.gz
    python -m asr.decode --exp-dir exp/m --epoch 30 --avg 15 --method ctc-prefix-beam-search \\
        --test-cuts data/fbank/librispeech_cuts_test-clean.jsonl.gz

The ``decode`` section of the run's configuration (:class:`asr.config.DecodeOptions`)
chooses the weights as icefall's decoders do (``epoch`` or ``iter``, each a number or
``last``; ``avg``; ``use_averaged_model``) and the search (``methods``, ``beam_size``,
``token_penalty``; ``blank_penalty``, one setting per value); the model and lexicon come
from the configuration saved in the chosen checkpoint. With ``--config`` the preset and
its overrides give the decode section; without it, the checkpoint's saved configuration
does. The icefall-style flags (``--exp-dir``, ``--epoch``, ``--avg``, ...) are the same
overrides under their familiar names.

The program reads top to bottom: checkpoints and their configuration, model, lexicon,
then per test set batches -> full-vocabulary log-probs -> search -> text -> scores and
icefall's ``recogs-*``, ``errs-*``, ``wer-summary-*`` files in the experiment folder. A
test set whose summary already lists every decoding setting is not decoded again; the
table of every test set's error rates is printed at the end.

A streaming LLM-CTC model (``model.streaming``) also decodes by ``ctc-streaming-greedy-search``
/ ``ctc-streaming-prefix-beam-search``: each utterance chunk by chunk with a bounded KV
cache, one setting per ``decode.history_seconds`` value (``..._history-8s`` in the file
names); the largest cache of every utterance is checked against P + 2A + J (paper App. E).
``decode.tail_padding_seconds`` (``--tail-padding-seconds``) follows every test cut with that
much silence, as a stream's end is fed to a recognizer (``..._tail-padding-<s>s``);
``decode.lead_padding_seconds`` (``--lead-padding-seconds``) puts it before every test cut,
as a stream starts (``..._lead-padding-<s>s``).

Under torchrun (``python -m torch.distributed.run --nproc-per-node N -m asr.decode ...``;
recipes: ``--cpu-processes N``) the N processes share each test set, batch by batch, and
rank 0 writes the same files one process would.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from asr.config import DecodeOptions, RunConfig, load_run_config
from asr.cut_filters import FRAME_SHIFT_SECONDS
from asr.data import build_valid_dataloader
from asr.decode_methods import (CTC_SEARCH, BatchOutputs, DecodeMethod, SearchSettings, check_model_decodes,
                                method_of)
from asr.logs import format_duration, setup_logging
from asr.scoring import TEXT_NORMALIZERS, Result, read_wer_summary, save_results
from asr.test_sets import count_cuts, parse_test_sets
from asr.threads import choose_threads, describe as describe_threads
from asr.tokenizer import CharTokenizer, Tokenizer
from asr.train_helpers import Distributed, setup_distributed
from asr.weights import build_trained_model, choose_weights, explicit_choice, load_lexicon, saved_run_config

# icefall-style flags and the override each stands for.
FLAG_OVERRIDES = {
    "exp_dir": "train.exp_dir", "lang_dir": "train.lang_dir", "num_workers": "data.num_workers",
    "epoch": "decode.epoch", "iter": "decode.iter", "avg": "decode.avg",
    "use_averaged_model": "decode.use_averaged_model", "method": "decode.methods", "beam_size": "decode.beam_size",
    "token_penalty": "decode.token_penalty", "blank_penalty": "decode.blank_penalty", "test_cuts": "decode.test_cuts",
    "max_duration": "decode.max_duration", "compute_cer": "decode.compute_cer",
    "text_normalization": "decode.text_normalization", "device": "decode.device",
    "history_seconds": "decode.history_seconds", "tail_padding_seconds": "decode.tail_padding_seconds",
    "lead_padding_seconds": "decode.lead_padding_seconds", "seam_merge_seconds": "decode.seam_merge_seconds",
}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Returns test set -> decoding setting -> WER/CER in percent (as in the files; on
    rank 0 of several processes, empty on the others)."""
    args = parse_args(argv)
    try:
        config = effective_config(args)
        options = config.decode
        exp_dir = Path(config.train.exp_dir)
        if not exp_dir.is_dir():
            raise FileNotFoundError(f"train.exp_dir: experiment folder not found: {exp_dir}")
        weights = choose_weights(exp_dir, options)
        test_sets = parse_test_sets(options.test_cuts)
        # The lexicon the run trained with, unless the command line names another.
        given = any(o.startswith("train.lang_dir=") for o in list(args.overrides) + flag_overrides(args))
        lang_dir = weights.resolve(config.train.lang_dir) if given else weights.saved.train.lang_dir
        tokenizer = load_lexicon(lang_dir, weights.saved)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    keys = [setting.key for setting in decoding_settings(options)]
    ranks = decoding_ranks(options.device)
    setup_logging(exp_dir, f"decode-{weights.suffix}", ranks.rank)
    choose_threads()
    logging.info("threads: %s", describe_threads())
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
        return finish(ranks, rates, exp_dir, weights.suffix, unit)

    # Model and lexicon, as trained.
    logging.info("decoding with %s (%s)", ", ".join(str(p) for p in weights.paths), weights.suffix)
    real_time_factors: Dict[str, Dict[str, float]] = {}
    device = ranks.device
    try:
        model = build_trained_model(weights, tokenizer, device)
        check_model_decodes(model.decoding, options.methods, f"{weights.saved.family} model ({type(model).__name__})")
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    data = dataclasses.replace(config.data, max_duration=options.max_duration or config.data.max_duration)

    for name, manifest in todo:
        num_cuts, seconds = count_cuts(manifest)
        if num_cuts == 0:
            print(f"Test set {name} ({manifest}) has no cuts: nothing to decode, no result files written.")
            continue
        logging.info("test set %s: %d cuts, %.1f minutes of audio, from %s", name, num_cuts, seconds / 60, manifest)
        loader = build_valid_dataloader(dataclasses.replace(data, valid_cuts=str(manifest)),
                                        tail_padding_seconds=options.tail_padding_seconds,
                                        lead_padding_seconds=options.lead_padding_seconds)
        results, rtfs = decode_test_set(model, loader, tokenizer, options, device, name, num_cuts, seconds, ranks)
        if not ranks.is_main:
            continue
        rates[name] = save_results(exp_dir, name, results, compute_cer=compute_cer,
                                   text_normalizer=TEXT_NORMALIZERS[options.text_normalization], suffix=weights.suffix)
        real_time_factors[name] = rtfs
    return finish(ranks, rates, exp_dir, weights.suffix, unit, real_time_factors)


def decoding_ranks(device_option: str) -> Distributed:
    """This process's rank and device: torchrun's process group when WORLD_SIZE > 1
    (gloo on the CPU, NCCL on GPUs, one GPU per rank), else one process on ``decode.device``."""
    try:
        return setup_distributed(device_option, "decode.device")
    except (ValueError, RuntimeError) as error:
        raise SystemExit(f"ERROR: {error}") from None


def finish(ranks: Distributed, rates: Dict[str, Dict[str, float]], exp_dir: Path, suffix: str, unit: str,
           real_time_factors: Optional[Dict[str, Dict[str, float]]] = None) -> Dict[str, Dict[str, float]]:
    """Rank 0 prints the table; every rank leaves the process group together."""
    if ranks.is_main:
        print_summary(rates, exp_dir, suffix, unit, real_time_factors)
    if ranks.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return rates if ranks.is_main else {}


def effective_config(args: argparse.Namespace) -> RunConfig:
    """The run configuration whose decode section (and paths) this decoding uses: the
    preset's (``--config``) or the newest checkpoint's, with the overrides and flags on
    top (an explicit epoch wins over a saved ``decode.iter``: :func:`asr.weights.explicit_choice`)."""
    overrides = explicit_choice(list(args.overrides) + flag_overrides(args))
    if args.config is not None:
        return load_run_config(args.config, overrides)
    exp_dir = next((o.partition("=")[2] for o in reversed(overrides) if o.startswith("train.exp_dir=")), None)
    if exp_dir is None:
        raise ValueError("give --config (the training preset) or --exp-dir (train.exp_dir=...)")
    return saved_run_config(exp_dir, overrides)


def flag_overrides(args: argparse.Namespace) -> List[str]:
    overrides = []
    for flag, key in FLAG_OVERRIDES.items():
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return overrides


def decode_test_set(
    model: torch.nn.Module, loader: torch.utils.data.DataLoader, tokenizer: Tokenizer, options: DecodeOptions,
    device: torch.device, name: str, num_cuts: int, seconds: float, ranks: Optional[Distributed] = None,
) -> Tuple[Dict[str, List[Result]], Dict[str, float]]:
    """Decoding setting -> (cut_id, reference words, hypothesis words) of every cut, and
    decoding setting -> real-time factor (seconds of computation per second of audio;
    the CTC searches share the time of the model's one forward pass per batch). With
    several ``ranks`` each decodes every world_size-th batch and all of them return every
    cut's results in the loader's order (the factors: all ranks' computation)."""
    rank, world_size = (ranks.rank, ranks.world_size) if ranks is not None else (0, 1)
    settings = decoding_settings(options)
    searches = {setting.key: SearchSettings(tokenizer.blank_id, options.beam_size, options.token_penalty,
                                            setting.blank_penalty, options.seam_merge_seconds) for setting in settings}
    # Greedy search alone may skip the log-probs only where no setting penalizes blank.
    penalized = any(setting.blank_penalty for setting in settings)
    batches: List[Tuple[int, Dict[str, List[Result]]]] = []  # (batch index, its results)
    busy = {setting.key: 0.0 for setting in settings}
    largest_cache: Dict[str, int] = {}
    started, done_cuts, done_seconds = time.monotonic(), 0, 0.0
    last_report = started
    for batch_index, batch in enumerate(loader, start=1):
        if (batch_index - 1) % world_size != rank:
            continue
        batches.append((batch_index, {setting.key: [] for setting in settings}))
        outputs = BatchOutputs(model, batch["features"].to(device), batch["feature_lens"].to(device), options.methods,
                               penalize_blank=penalized)
        # An LLM tokenizer's hypotheses are lowercased: so are its references.
        references = [tokenizer.normalize_reference(text).split() for text in batch["texts"]]
        for method, history, _, key in settings:
            method_started = time.perf_counter()
            output = method.run(outputs, searches[key], history)
            hypotheses = [text.split() for text in tokenizer.decode_batch(output.ids)]
            shared = outputs.ctc_seconds if method.needs == CTC_SEARCH else 0.0
            busy[key] += time.perf_counter() - method_started + shared
            if output.largest_cache is not None:
                largest_cache[key] = max(largest_cache.get(key, 0), *output.largest_cache)
            batches[-1][1][key].extend(zip(batch["cut_ids"], references, hypotheses))
        done_cuts += len(batch["cut_ids"])
        done_seconds += batch["feature_lens"].sum().item() * FRAME_SHIFT_SECONDS
        now = time.monotonic()
        if now - last_report >= 10.0 or done_cuts * world_size >= num_cuts:
            last_report = now
            elapsed = max(now - started, 1e-9)
            # The ranks progress alike: this one's share stands for all.
            eta = (seconds / world_size - done_seconds) / max(done_seconds / elapsed, 1e-9)
            logging.info("%s: batch %d, %d/%d cuts%s, %.1f cuts/s, real-time factor %.4f, ETA %s",
                         name, batch_index, done_cuts, num_cuts, f" (rank {rank} of {world_size})" * (world_size > 1),
                         done_cuts * world_size / elapsed, elapsed / max(done_seconds * world_size, 1e-9),
                         format_duration(eta))
    if world_size > 1:
        logging.info("%s: rank %d of %d decoded %d of the %d cuts", name, rank, world_size, done_cuts, num_cuts)
        gathered: List = [None] * world_size
        dist.all_gather_object(gathered, (batches, busy, largest_cache, done_seconds))
        batches = sorted((item for part in gathered for item in part[0]), key=lambda item: item[0])
        busy = {key: sum(part[1][key] for part in gathered) for key in busy}
        largest_cache = {key: max(part[2][key] for part in gathered if key in part[2])
                         for key in {key for part in gathered for key in part[2]}}
        done_seconds = sum(part[3] for part in gathered)
    results = {s.key: [result for _, by_key in batches for result in by_key[s.key]] for s in settings}
    rtfs = {key: spent / max(done_seconds, 1e-9) for key, spent in busy.items()}
    for key, rtf in rtfs.items():
        logging.info("%s, %s: real-time factor %.4f (%.1f s for %.1f s of audio)", name, key, rtf, busy[key],
                     done_seconds)
    for (_, history, _, key) in settings:
        if key in largest_cache:  # the model raised if any utterance exceeded the bound
            logging.info("%s, %s: largest KV cache %d positions, within the bound P + 2A + J = %d on every "
                         "utterance", name, key, largest_cache[key], model.cache_bound(history))
    return results, rtfs


class Setting(NamedTuple):
    """One decoding setting: a method, its history (streaming methods; else None), its
    blank penalty, and the key it writes into file names and summaries."""

    method: DecodeMethod
    history: Optional[int]
    blank_penalty: float
    key: str


def decoding_settings(options: DecodeOptions) -> List[Setting]:
    """Every setting: one per method and blank penalty (``decode.blank_penalty``, CTC
    searches), and per ``decode.history_seconds`` value for the streaming methods."""
    settings = []
    for name in options.methods:
        method = method_of(name)
        for history in (options.history_seconds if method.per_history else (None,)):
            for penalty in (options.blank_penalty if method.uses_blank_penalty else (0.0,)):
                key = method.key(options.beam_size, options.token_penalty, history, penalty,
                                 options.seam_merge_seconds)
                if options.lead_padding_seconds:
                    key += f"_lead-padding-{options.lead_padding_seconds:g}s"
                if options.tail_padding_seconds:
                    key += f"_tail-padding-{options.tail_padding_seconds:g}s"
                settings.append(Setting(method, history, penalty, key))
    return settings


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
    parser.add_argument("--blank-penalty", nargs="+", help="decode.blank_penalty: one setting per value")
    parser.add_argument("--test-cuts", help="decode.test_cuts: comma-separated manifests or NAME=PATH items")
    parser.add_argument("--lang-dir", help="train.lang_dir")
    parser.add_argument("--compute-cer", help="decode.compute_cer: auto, true, false")
    parser.add_argument("--text-normalization", help="decode.text_normalization: none, gigaspeech")
    parser.add_argument("--max-duration", help="decode.max_duration")
    parser.add_argument("--num-workers", help="data.num_workers")
    parser.add_argument("--device", help="decode.device: auto, cpu, cuda")
    parser.add_argument("--history-seconds", nargs="+", help="decode.history_seconds (ctc-streaming-* methods)")
    parser.add_argument("--tail-padding-seconds", help="decode.tail_padding_seconds: silence after every test cut")
    parser.add_argument("--lead-padding-seconds", help="decode.lead_padding_seconds: silence before every test cut")
    parser.add_argument("--seam-merge-seconds", help="decode.seam_merge_seconds: > 0 merges the seams of a "
                                                     "lookahead's overlapping chunks (ctc-streaming-* methods)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
