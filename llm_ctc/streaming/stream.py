"""Transcribe a wav file with streaming LLM-CTC, printing the hypothesis after each chunk
with that chunk's compute time (Sec. 4.3)::

    python -m llm_ctc.streaming.stream --checkpoint exp/llm_ctc/epoch-3.pt --wav a.wav \
        --history 8 --method ctc-prefix-beam-search --beam 4 --token-penalty 0.7

The wav must be 16 kHz mono PCM (8/16/32-bit). The checkpoint is one written by
:func:`llm_ctc.save_model_checkpoint` (LoRA is merged for inference). The audio is fed
one chunk at a time as it would arrive; each chunk's fbank is computed from its own
samples with the encoder's number of mel bins, as training computes it (App. D.4).
"""

from __future__ import annotations

import argparse
import sys
import wave
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from asr.decode_methods import CTC_SEARCHES
from llm_ctc.streaming.layout import SAMPLE_RATE


def read_wav(path: Path) -> torch.Tensor:
    """16 kHz mono PCM samples as float32 in [-1, 1)."""
    if not path.is_file():
        raise FileNotFoundError(f"--wav: no such file: {path}")
    with wave.open(str(path), "rb") as reader:
        rate, channels, width = reader.getframerate(), reader.getnchannels(), reader.getsampwidth()
        data = reader.readframes(reader.getnframes())
    if rate != SAMPLE_RATE or channels != 1:
        raise ValueError(f"--wav {path}: expected 16000 Hz mono, got {rate} Hz with {channels} channels")
    if width == 1:
        samples = (np.frombuffer(data, np.uint8).astype(np.float32) - 128) / 128
    elif width in (2, 4):
        dtype = np.int16 if width == 2 else np.int32
        samples = np.frombuffer(data, dtype).astype(np.float32) / float(2 ** (8 * width - 1))
    else:
        raise ValueError(f"--wav {path}: {8 * width}-bit samples are not supported (8, 16 or 32-bit PCM)")
    return torch.from_numpy(samples)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="LLM-CTC checkpoint")
    parser.add_argument("--wav", type=Path, required=True, help="16 kHz mono PCM wav file")
    parser.add_argument("--history", type=int, default=8, help="left history h in seconds (App. D.4: 8)")
    parser.add_argument("--chunk-seconds", type=int, default=2)
    parser.add_argument("--method", choices=CTC_SEARCHES, default="ctc-greedy-search")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--token-penalty", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> str:
    args = parse_args(argv)
    if args.history < 1 or args.chunk_seconds < 1:
        raise SystemExit(f"--history and --chunk-seconds must be >= 1, got {args.history} and {args.chunk_seconds}")
    torch.set_num_threads(args.threads)
    from llm_ctc.checkpoint import load_model_checkpoint
    from llm_ctc.streaming.recognizer import StreamingRecognizer

    samples = read_wav(args.wav)
    model = load_model_checkpoint(args.checkpoint)
    model.prepare_for_decoding()
    model.eval()
    recognizer = StreamingRecognizer(model, args.history, args.chunk_seconds, args.method, args.beam,
                                     args.token_penalty)
    per_chunk = args.chunk_seconds * SAMPLE_RATE
    for start in range(0, samples.numel(), per_chunk):
        results = recognizer.accept_waveform(samples[start:start + per_chunk])
        if start + per_chunk >= samples.numel():
            results += recognizer.finish()
        for result in results:
            begin = result.index * args.chunk_seconds
            print(f"chunk {result.index:4d} [{begin:7.2f}s +{result.frames / 100:5.2f}s] "
                  f"{1000 * result.seconds:8.1f} ms  {result.text}", flush=True)
    print(f"final: {recognizer.text}", flush=True)
    return recognizer.text


if __name__ == "__main__":
    main(sys.argv[1:])
