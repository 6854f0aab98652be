"""Decode test sets with a trained Zipformer CTC model, for every corpus.

    python -m zipformer.decode --exp-dir exp/m --epoch 30 --avg 15 \\
        --method ctc-greedy-search ctc-prefix-beam-search \\
        --test-cuts data/fbank/librispeech_cuts_test-clean.jsonl.gz,data/fbank/librispeech_cuts_test-other.jsonl.gz

The model, lexicon and feature settings come from the configuration that
``zipformer.train`` saved in the checkpoints of ``--exp-dir``; only the checkpoint
choice and the search are given here. Checkpoints are chosen as icefall's decoders
do (``--epoch``/``--iter``, ``--avg``, ``--use-averaged-model``). The program reads
top to bottom: checkpoints and their configuration, model, lexicon, then per test set
batches -> full-vocabulary log-probs -> search -> text -> scores and icefall's
``recogs-*``, ``errs-*``, ``wer-summary-*`` files in the experiment folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import logging
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

# The private helpers are the path rules of weights_for_decoding itself: the configuration
# check below must look at exactly the files it averages.
from zipformer.averaging import _epoch_paths, _iteration_paths, weights_for_decoding
from zipformer.checkpoint import CheckpointConfigMismatch, check_config_matches
from zipformer.cut_filters import cut_text
from zipformer.data import DataOptions, build_valid_dataloader, load_cuts_lazy
from zipformer.model import CTCModel
from zipformer.presets import config_from_dict
from zipformer.run_config import CHANGEABLE_ON_RESUME
from zipformer.scoring import Result, normalize_gigaspeech_text, save_results
from zipformer.search import ctc_greedy_search, ctc_prefix_beam_search
from zipformer.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

METHODS = ("ctc-greedy-search", "ctc-prefix-beam-search")
TEXT_NORMALIZERS: Dict[str, Optional[Callable[[str], str]]] = {
    "none": None,
    "gigaspeech": normalize_gigaspeech_text,
}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Returns test set -> decoding setting -> WER/CER in percent (as in the files)."""
    args = parse_args(argv)
    exp_dir = Path(args.exp_dir)
    if not exp_dir.is_dir():
        raise SystemExit(f"ERROR: --exp-dir: experiment folder not found: {exp_dir}")
    suffix = checkpoint_suffix(args)
    setup_logging(exp_dir, suffix)
    device = choose_device(args.device)

    # Checkpoints and the configuration they were trained with.
    try:
        paths = checkpoint_paths(args)
        config = saved_configuration(paths)
        weights = weights_for_decoding(exp_dir, epoch=args.epoch, iteration=args.iter, avg=args.avg,
                                       use_averaged_model=args.use_averaged_model)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    logging.info("decoding with %s (%s)", ", ".join(str(p) for p in paths), suffix)

    # Model and lexicon.
    model_config = config_from_dict(config["model"])
    model = CTCModel(model_config)
    model.load_state_dict(weights)
    model.to(device).eval()
    tokenizer = load_lexicon(args.lang_dir or config["train"]["lang_dir"], model_config.vocab_size)
    compute_cer = args.compute_cer == "true" or (args.compute_cer == "auto" and isinstance(tokenizer, CharTokenizer))
    data_options = DataOptions.from_dict(config["data"])
    data_options = dataclasses.replace(
        data_options, max_duration=args.max_duration or data_options.max_duration, num_workers=args.num_workers)

    # Test sets.
    rates: Dict[str, Dict[str, float]] = {}
    for name, manifest in parse_test_sets(args.test_cuts):
        num_cuts, seconds = count_cuts(manifest)
        if num_cuts == 0:
            print(f"Test set {name} ({manifest}) has no cuts: nothing to decode, no result files written.")
            continue
        logging.info("test set %s: %d cuts, %.1f minutes of audio, from %s", name, num_cuts, seconds / 60, manifest)
        loader = build_valid_dataloader(dataclasses.replace(data_options, valid_cuts=str(manifest)))
        results = decode_test_set(model, loader, tokenizer, args, device, name, num_cuts, seconds)
        rates[name] = save_results(exp_dir, name, results, compute_cer=compute_cer,
                                   text_normalizer=TEXT_NORMALIZERS[args.text_normalization], suffix=suffix)
    print_summary(rates, "CER" if compute_cer else "WER", suffix)
    return rates


def decode_test_set(
    model: CTCModel, loader: torch.utils.data.DataLoader, tokenizer: Tokenizer, args: argparse.Namespace,
    device: torch.device, name: str, num_cuts: int, seconds: float,
) -> Dict[str, List[Result]]:
    """Decoding setting -> (cut_id, reference words, hypothesis words) of every cut."""
    results: Dict[str, List[Result]] = {method_key(m, args): [] for m in args.method}
    started, done_cuts, done_seconds = time.monotonic(), 0, 0.0
    last_report = started
    for batch_index, batch in enumerate(loader, start=1):
        with torch.inference_mode():
            log_probs, lengths = model.log_probs(batch["features"].to(device), batch["feature_lens"].to(device))
        references = [text.split() for text in batch["texts"]]
        for method in args.method:
            if method == "ctc-greedy-search":
                token_ids = ctc_greedy_search(log_probs, lengths, blank_id=tokenizer.blank_id)
            else:
                token_ids = ctc_prefix_beam_search(log_probs, lengths, beam=args.beam, blank_id=tokenizer.blank_id,
                                                   token_penalty=args.token_penalty)
            hypotheses = [text.split() for text in tokenizer.decode_batch(token_ids)]
            results[method_key(method, args)].extend(zip(batch["cut_ids"], references, hypotheses))
        done_cuts += len(batch["cut_ids"])
        done_seconds += batch["feature_lens"].sum().item() * 0.01
        now = time.monotonic()
        if now - last_report >= 10.0 or done_cuts == num_cuts:
            last_report = now
            elapsed = max(now - started, 1e-9)
            eta = (seconds - done_seconds) / max(done_seconds / elapsed, 1e-9)
            logging.info("%s: batch %d, %d/%d cuts, %.1f cuts/s, real-time factor %.4f, ETA %s",
                         name, batch_index, done_cuts, num_cuts, done_cuts / elapsed,
                         elapsed / max(done_seconds, 1e-9), datetime.timedelta(seconds=round(max(eta, 0))))
    return results


def method_key(method: str, args: argparse.Namespace) -> str:
    """The setting's name in file names and summaries (icefall's, plus a nonzero token penalty)."""
    if method == "ctc-greedy-search":
        return method
    key = f"{method}_beam-{args.beam}"
    if args.token_penalty:
        key += f"_token-penalty-{args.token_penalty:g}"
    return key


def checkpoint_suffix(args: argparse.Namespace) -> str:
    """icefall's suffix: ``epoch-E_avg-A`` or ``iter-I_avg-A``, plus ``_use-averaged-model``."""
    suffix = f"iter-{args.iter}_avg-{args.avg}" if args.iter > 0 else f"epoch-{args.epoch}_avg-{args.avg}"
    return suffix + ("_use-averaged-model" if args.use_averaged_model else "")


def checkpoint_paths(args: argparse.Namespace) -> List[Path]:
    """The checkpoint files ``weights_for_decoding`` reads, oldest first (the last is the chosen one)."""
    if args.avg < 1:
        raise ValueError(f"--avg must be >= 1, got {args.avg}")
    if args.iter > 0:
        count = args.avg + 1 if args.use_averaged_model else args.avg
        return _iteration_paths(args.exp_dir, args.iter, count)
    return _epoch_paths(args.exp_dir, args.epoch, args.avg, args.use_averaged_model)


def saved_configuration(paths: Sequence[Path]) -> dict:
    """The training configuration of the chosen (last) checkpoint, after checking that every
    other checkpoint to be averaged comes from the same configuration."""
    chosen = _load_config(paths[-1])
    for path in paths[:-1]:
        try:
            check_config_matches(_load_config(path), chosen, source=path, ignore=CHANGEABLE_ON_RESUME)
        except CheckpointConfigMismatch as error:
            raise ValueError(f"{error} {paths[-1]} (cannot average checkpoints of different models)") from None
    return chosen


def _load_config(path: Path) -> dict:
    # mmap: only the small config entry is read, not the tensors.
    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    config = checkpoint.get("config") if isinstance(checkpoint, dict) else None
    if not config or "model" not in config:
        raise ValueError(f"{path} holds no training configuration: was it written by zipformer.train?")
    return config


def load_lexicon(lang_dir: str, vocab_size: int) -> Tokenizer:
    """The tokenizer of ``lang_dir``; its size must be the model's output size."""
    try:
        tokenizer = load_tokenizer(lang_dir)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: --lang-dir: {error}") from None
    if tokenizer.vocab_size != vocab_size:
        raise SystemExit(
            f"ERROR: --lang-dir {lang_dir} has {tokenizer.vocab_size} tokens but the model was trained "
            f"with field 'model.vocab_size' = {vocab_size}: give the lang dir used for training")
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
            raise SystemExit(f"ERROR: --test-cuts: cut manifest not found: {path}")
        test_sets.append((name, path))
    if not test_sets:
        raise SystemExit(f"ERROR: --test-cuts: no cut manifest given ({text!r})")
    names = [name for name, _ in test_sets]
    if len(set(names)) != len(names):
        raise SystemExit(f"ERROR: --test-cuts: test set names {names} repeat; name them as NAME=PATH")
    return test_sets


def count_cuts(manifest: Path) -> Tuple[int, float]:
    """Number of cuts and their total duration in seconds (one lazy pass)."""
    opener = gzip.open if manifest.name.endswith(".gz") else open
    with opener(manifest, "rt", encoding="utf-8") as lines:
        if not any(line.strip() for line in lines):
            return 0, 0.0  # Lhotse cannot read an empty manifest back
    count, seconds = 0, 0.0
    for cut in load_cuts_lazy(manifest, "--test-cuts"):
        if cut_text(cut) is not None:
            count += 1
            seconds += cut.duration
    return count, seconds


def print_summary(rates: Dict[str, Dict[str, float]], unit: str, suffix: str) -> None:
    if not rates:
        print("No test set had cuts: nothing was decoded.")
        return
    lines = [f"{unit} ({suffix}):"]
    for name, by_key in rates.items():
        for key, rate in sorted(by_key.items(), key=lambda item: item[1]):
            lines.append(f"  {name:<16} {key:<40} {rate:6.2f}%")
    print("\n".join(lines))


def choose_device(option: str) -> torch.device:
    if option == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if option == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ERROR: --device cuda but no CUDA device is available")
    return torch.device(option)


def setup_logging(exp_dir: Path, suffix: str) -> None:
    """Console + ``exp_dir/log/log-decode-<suffix>-<time>``."""
    log_dir = exp_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H-%M-%S")
    logging.basicConfig(
        level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(message)s",
        handlers=[logging.FileHandler(log_dir / f"log-decode-{suffix}-{stamp}"), logging.StreamHandler(sys.stdout)],
    )


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Decode test sets with a Zipformer CTC model.")
    parser.add_argument("--exp-dir", required=True, help="experiment folder of zipformer.train")
    parser.add_argument("--epoch", type=int, default=30, help="decode epoch-<epoch>.pt (with --avg)")
    parser.add_argument("--iter", type=int, default=0, help="> 0: decode checkpoint-<iter>.pt instead of an epoch")
    parser.add_argument("--avg", type=int, default=15, help="number of checkpoints (or averaging steps) to average")
    parser.add_argument("--use-averaged-model", type=_boolean, default=True,
                        help="true: exact average of the weights between epoch E-A and E from the running "
                             "average (icefall); false: mean of the A newest checkpoints")
    parser.add_argument("--method", nargs="+", choices=METHODS, default=["ctc-prefix-beam-search"])
    parser.add_argument("--beam", type=int, default=4, help="prefixes kept per frame by ctc-prefix-beam-search")
    parser.add_argument("--token-penalty", type=float, default=0.0,
                        help="added to a prefix's score per token (positive: longer outputs)")
    parser.add_argument("--test-cuts", required=True,
                        help="comma-separated cut manifests with features (or NAME=PATH items)")
    parser.add_argument("--lang-dir", default=None, help="default: the training run's train.lang_dir")
    parser.add_argument("--compute-cer", choices=("auto", "true", "false"), default="auto",
                        help="score characters; auto: when the lexicon is a character table (AISHELL)")
    parser.add_argument("--text-normalization", choices=tuple(TEXT_NORMALIZERS), default="none",
                        help="applied to references and hypotheses before scoring (gigaspeech: official rules)")
    parser.add_argument("--max-duration", type=float, default=0.0,
                        help="seconds of audio per batch (default: the training run's data.max_duration)")
    parser.add_argument("--num-workers", type=int, default=0, help="data loader workers")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error(f"--beam must be >= 1, got {args.beam}")
    if args.max_duration < 0:
        parser.error(f"--max-duration must be positive, got {args.max_duration}")
    if args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    args.method = list(dict.fromkeys(args.method))
    return args


if __name__ == "__main__":
    main()
