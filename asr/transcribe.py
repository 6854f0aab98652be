"""Transcribe audio files with a trained model of any family: one line of text per file.

    python -m asr.transcribe --exp-dir egs/mini/exp/full_pruned_ctc a.flac b.wav
    python -m asr.transcribe --exp-dir exp/llm_ctc --epoch 3 --avg 1 --method ctc-prefix-beam-search \\
        --token-penalty 0.3 speech.wav

The weights are chosen as ``asr.decode`` chooses them (``--epoch`` or ``--iter``, ``--avg``,
``--use-averaged-model``; without them the decode section saved with the run), from any
working directory: paths the run stored (its lang dir, a pretrained LLM) are found where
the run was trained. Any file soundfile reads is accepted (WAV of any PCM or float
format, FLAC, OGG); several channels are mixed down, other sample rates resampled to
16 kHz (:mod:`asr.audio`). The features are the model's own log-mel fbank. The method is
any of ``asr.decode_methods`` the model supports (default: greedy CTC search, or greedy
generation for LLM-CE; a streaming method decodes chunk by chunk at the first
``decode.history_seconds``). Prints ``<file><TAB><text>`` per file.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from asr.audio import SAMPLE_RATE, read_audio
from asr.config import load_run_config
from asr.decode_methods import CTC_SEARCH, BatchOutputs, SearchSettings, check_model_decodes, method_of
from asr.threads import choose_threads, describe as describe_threads
from asr.weights import explicit_choice, load_trained_model, saved_run_config

FLAG_OVERRIDES = {"epoch": "decode.epoch", "iter": "decode.iter", "avg": "decode.avg",
                  "use_averaged_model": "decode.use_averaged_model", "beam_size": "decode.beam_size",
                  "token_penalty": "decode.token_penalty", "blank_penalty": "decode.blank_penalty",
                  "history_seconds": "decode.history_seconds"}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """Returns file -> text (also printed)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s")
    choose_threads(args.threads)
    logging.info("threads: %s", describe_threads())
    try:
        overrides = explicit_choice(list(args.overrides) + [f"{key}={getattr(args, flag)}"
                                                            for flag, key in FLAG_OVERRIDES.items()
                                                            if getattr(args, flag) is not None])
        config = (load_run_config(args.config, overrides + ([f"train.exp_dir={args.exp_dir}"] if args.exp_dir else []))
                  if args.config else saved_run_config(args.exp_dir, overrides))
        trained = load_trained_model(args.exp_dir or config.train.exp_dir, config.decode, args.lang_dir, args.device)
        model, tokenizer = trained.model, trained.tokenizer
        name = args.method or default_method(model.decoding)
        check_model_decodes(model.decoding, [name], f"{trained.weights.saved.family} model ({type(model).__name__})")
        method = method_of(name, "--method")
        audio = {path: read_audio(path, "audio file") for path in args.audio}
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    search = SearchSettings(tokenizer.blank_id, config.decode.beam_size, config.decode.token_penalty,
                            config.decode.blank_penalty[0] if method.uses_blank_penalty else 0.0,
                            config.decode.seam_merge_seconds)
    history = config.decode.history_seconds[0] if method.per_history else None
    texts = {}
    for path, samples in audio.items():
        features = log_mel_features(samples, model.feature_dim).to(model_device(model))
        lengths = torch.tensor([features.shape[1]], device=features.device)
        output = method.run(BatchOutputs(model, features, lengths, [name], bool(search.blank_penalty)), search, history)
        texts[str(path)] = tokenizer.decode(output.ids[0])
        print(f"{path}\t{texts[str(path)]}", flush=True)
    return texts


def default_method(decoding) -> str:
    """Greedy CTC search, or greedy generation for a model decoded by generation only."""
    return "ctc-greedy-search" if CTC_SEARCH in decoding else "llm-greedy-search"


def log_mel_features(samples, num_mel_bins: int) -> torch.Tensor:
    """(1, T, bins) Lhotse fbank of 16 kHz samples, as the data pipeline computes it."""
    from lhotse import Fbank, FbankConfig

    features = Fbank(FbankConfig(num_mel_bins=num_mel_bins)).extract(samples, SAMPLE_RATE)
    return torch.from_numpy(features).unsqueeze(0)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Transcribe audio files with a trained model.",
                                     epilog="Overrides: section.field=value, e.g. decode.beam_size=8.")
    parser.add_argument("audio", nargs="+", type=Path, help="audio files (WAV, FLAC, OGG; any rate, any channels)")
    parser.add_argument("--exp-dir", help="the training run's folder (train.exp_dir)")
    parser.add_argument("--config", type=Path, help="a preset whose train.exp_dir and decode section to use")
    parser.add_argument("--epoch", help="decode.epoch: a number or 'last'")
    parser.add_argument("--iter", help="decode.iter: a batch number, 'last', or 0 (use --epoch)")
    parser.add_argument("--avg", help="decode.avg")
    parser.add_argument("--use-averaged-model", help="decode.use_averaged_model (true/false)")
    parser.add_argument("--method", help="a decode method the model supports (asr/decode_methods.py)")
    parser.add_argument("--beam-size", help="decode.beam_size: prefixes of ctc-prefix-beam-search, hypotheses of "
                                            "llm-beam-search")
    parser.add_argument("--token-penalty", help="decode.token_penalty")
    parser.add_argument("--blank-penalty", help="decode.blank_penalty (CTC searches; the first value of a list)")
    parser.add_argument("--history-seconds", help="decode.history_seconds (streaming methods)")
    parser.add_argument("--lang-dir", help="default: the run's train.lang_dir (or the family's own tokenizer)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the cores idle at the start, asr/threads.py)")
    parser.add_argument("--verbose", action="store_true", help="log what is loaded and how the audio is converted")
    parser.add_argument("--override", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="a configuration override (repeatable)")
    args = parser.parse_args(argv)
    if not args.exp_dir and not args.config:
        parser.error("give --exp-dir (the training run's folder) or --config")
    return args


if __name__ == "__main__":
    main()
