"""Transcribe an audio file with streaming LLM-CTC, printing the hypothesis after each chunk
with that chunk's compute time (Sec. 4.3)::

    python -m llm_ctc.streaming.stream --exp-dir exp/streaming_llm_ctc --audio a.flac --history 8
    python -m llm_ctc.streaming.stream --checkpoint exp/streaming_llm_ctc/checkpoint-1200.pt --audio a.wav \
        --method ctc-prefix-beam-search --beam 4 --token-penalty 0.7

The model: a training run's folder with the weight choice of ``asr.decode`` (``--epoch`` /
``--iter``, ``--avg``, ``--use-averaged-model``; default the decode section saved with the
run), one of its checkpoints (``--checkpoint exp/x/epoch-3.pt``: that file's weights), or a
model file of :func:`llm_ctc.save_model_checkpoint`. Paths the run stored are found from
any working directory. The audio: any file soundfile reads, mixed down to mono and
resampled to 16 kHz (:mod:`asr.audio`). It is fed one chunk at a time as it would arrive;
each chunk's fbank is computed from its own samples with the encoder's number of mel
bins, as training computes it (App. D.4). LoRA is merged for inference.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional

import torch

from asr.audio import SAMPLE_RATE, read_audio
from asr.decode_methods import CTC_SEARCHES, STREAMING


def load_streaming_model(args: argparse.Namespace):
    """The streaming model the arguments name, prepared for decoding."""
    from asr.config import DecodeOptions, build_section
    from asr.weights import explicit_choice, load_trained_model, saved_run_config

    choice = {"epoch": args.epoch, "iter": args.iter, "avg": args.avg, "use_averaged_model": args.use_averaged_model}
    overrides = [f"decode.{key}={value}" for key, value in choice.items() if value is not None]
    exp_dir = args.exp_dir
    if args.checkpoint is not None:
        if args.checkpoint.is_dir():
            raise ValueError(f"--checkpoint {args.checkpoint} is a folder: give it as --exp-dir (with --epoch/--iter "
                             "and --avg), or name one of its checkpoint files")
        if not args.checkpoint.is_file():
            raise FileNotFoundError(f"--checkpoint: no such file: {args.checkpoint}")
        match = re.fullmatch(r"(epoch|checkpoint)-(\d+)\.pt", args.checkpoint.name)
        if match is None:  # a model file of llm_ctc.save_model_checkpoint
            from llm_ctc.checkpoint import load_model_checkpoint

            model = load_model_checkpoint(args.checkpoint)
            model.prepare_for_decoding()
            return model.eval()
        exp_dir = args.checkpoint.parent
        key = "decode.epoch" if match.group(1) == "epoch" else "decode.iter"
        overrides = [f"{key}={match.group(2)}", "decode.avg=1", "decode.use_averaged_model=false"]
    options = saved_run_config(exp_dir, explicit_choice(overrides)).decode if exp_dir else \
        build_section(DecodeOptions, {}, overrides, "decode")
    trained = load_trained_model(exp_dir, options)
    if STREAMING not in trained.model.decoding:
        raise ValueError(f"{trained.weights.paths[-1]} is not a streaming LLM-CTC model (model.streaming is false): "
                         "python -m asr.transcribe decodes it offline")
    return trained.model


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, help="a streaming LLM-CTC training run's folder")
    parser.add_argument("--checkpoint", type=Path, help="one checkpoint of a run, or a model file")
    parser.add_argument("--epoch", help="with --exp-dir: decode.epoch, a number or 'last'")
    parser.add_argument("--iter", help="with --exp-dir: decode.iter, a batch number or 'last'")
    parser.add_argument("--avg", help="with --exp-dir: decode.avg")
    parser.add_argument("--use-averaged-model", help="with --exp-dir: decode.use_averaged_model (true/false)")
    parser.add_argument("--audio", "--wav", dest="audio", type=Path, required=True,
                        help="an audio file (WAV, FLAC, OGG; any rate, any channels)")
    parser.add_argument("--history", type=int, default=8, help="left history h in seconds (App. D.4: 8)")
    parser.add_argument("--chunk-seconds", type=int, default=None, help="default: the model's")
    parser.add_argument("--method", choices=CTC_SEARCHES, default="ctc-greedy-search")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--token-penalty", type=float, default=0.0)
    parser.add_argument("--blank-penalty", type=float, default=0.0,
                        help="subtracted from blank's log-probability at every frame")
    parser.add_argument("--tail-padding-seconds", type=float, default=0.0,
                        help="silence fed after the audio's end (as sherpa-onnx's tail padding)")
    parser.add_argument("--seam-merge-seconds", type=float, default=0.0,
                        help="a model with a lookahead: tokens written within this many seconds before a chunk "
                             "boundary and again as soon after it are written once (asr.streaming_search)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if (args.exp_dir is None) == (args.checkpoint is None):
        parser.error("give one of --exp-dir and --checkpoint")
    return args


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    if args.history < 1 or (args.chunk_seconds is not None and args.chunk_seconds < 1):
        raise SystemExit(f"ERROR: --history and --chunk-seconds must be >= 1, got {args.history} and "
                         f"{args.chunk_seconds}")
    if not 0 <= args.tail_padding_seconds < float("inf"):
        raise SystemExit(f"ERROR: --tail-padding-seconds must be a finite number of seconds >= 0, "
                         f"got {args.tail_padding_seconds}")
    torch.set_num_threads(args.threads)
    from llm_ctc.streaming.recognizer import StreamingRecognizer

    try:
        samples = torch.from_numpy(read_audio(args.audio, "--audio"))
        model = load_streaming_model(args)
        chunk_seconds = args.chunk_seconds or model.config.streaming_chunk_seconds
        recognizer = StreamingRecognizer(model, args.history, chunk_seconds, args.method, args.beam,
                                         args.token_penalty, args.blank_penalty, args.seam_merge_seconds)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    per_chunk = chunk_seconds * SAMPLE_RATE
    for start in range(0, samples.numel(), per_chunk):
        results = recognizer.accept_waveform(samples[start:start + per_chunk])
        if start + per_chunk >= samples.numel():
            results += recognizer.finish(args.tail_padding_seconds)
        for result in results:
            begin = result.index * chunk_seconds
            print(f"chunk {result.index:4d} [{begin:7.2f}s +{result.frames / 100:5.2f}s] "
                  f"{1000 * result.seconds:8.1f} ms  {result.text}", flush=True)
    print(f"final: {recognizer.text}", flush=True)
    return recognizer.text


if __name__ == "__main__":
    main(sys.argv[1:])
