"""Decode test sets with an exported model in sherpa-onnx, scored like ``asr.decode``.

    python -m zipformer.sherpa_decode --model exp/m/onnx-epoch-30_avg-15/model.int8.onnx \\
        --test-cuts data/fbank/librispeech_cuts_test-clean.jsonl.gz

Reads each cut's audio (not the stored features: sherpa-onnx computes its own fbank with
kaldi-native-fbank, as a deployed model would), decodes with
``sherpa_onnx.OfflineRecognizer.from_zipformer_ctc`` (greedy search) and writes icefall's
``recogs-*``, ``errs-*`` and ``wer-summary-*`` files through ``asr.scoring``, under
the setting ``sherpa-onnx-greedy-search`` with the model file's stem as suffix (``model``,
``model.int8``), into ``--result-dir`` (default: the model's folder). The real-time factor
(decoding seconds, features included, per second of audio) is logged and printed.

With ``--config`` (a recipe's preset, plus ``section.field=value`` overrides) the scoring
follows its ``decode`` section as ``asr.decode`` does: ``decode.compute_cer`` (``auto``:
characters for a character lexicon) and ``decode.text_normalization``.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from asr.config import load_run_config
from asr.constants import SAMPLE_RATE
from asr.cut_filters import cut_text
from asr.data import load_cuts_lazy
from asr.test_sets import parse_test_sets
from asr.scoring import TEXT_NORMALIZERS, Result, save_results

SETTING = "sherpa-onnx-greedy-search"


def make_recognizer(model: Path, tokens: Path, num_threads: int = 1):
    """A sherpa-onnx offline recognizer for an exported Zipformer CTC model (greedy search)."""
    import sherpa_onnx

    for path, option in ((model, "--model"), (tokens, "--tokens")):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{option}: file not found: {path}")
    return sherpa_onnx.OfflineRecognizer.from_zipformer_ctc(
        model=str(model), tokens=str(tokens), num_threads=num_threads, sample_rate=SAMPLE_RATE,
        feature_dim=80, decoding_method="greedy_search", provider="cpu")


def recognize(recognizer, waves: Sequence[np.ndarray], sample_rate: int) -> List[Tuple[str, List[str]]]:
    """(text, token symbols) of each waveform (float32 samples in [-1, 1]), one batch."""
    streams = []
    for wave in waves:
        stream = recognizer.create_stream()
        stream.accept_waveform(sample_rate, np.ascontiguousarray(wave, dtype=np.float32))
        streams.append(stream)
    recognizer.decode_streams(streams)
    return [(stream.result.text, list(stream.result.tokens)) for stream in streams]


def decode_test_set(recognizer, manifest: Path, batch_size: int, name: str) -> Tuple[List[Result], float, float]:
    """(results, audio seconds, decoding seconds) over every cut of ``manifest``."""
    results: List[Result] = []
    audio_seconds = decode_seconds = 0.0
    last_report = time.monotonic()
    batch: List[Tuple[str, str, np.ndarray, int]] = []

    def flush() -> None:
        nonlocal decode_seconds
        by_rate: Dict[int, List[int]] = {}
        for index, (_, _, _, rate) in enumerate(batch):
            by_rate.setdefault(rate, []).append(index)
        for rate, indices in by_rate.items():
            started = time.perf_counter()
            outputs = recognize(recognizer, [batch[i][2] for i in indices], rate)
            decode_seconds += time.perf_counter() - started
            for i, (text, _) in zip(indices, outputs):
                results.append((batch[i][0], batch[i][1].split(), text.split()))
        batch.clear()

    for cut in load_cuts_lazy(manifest, "--test-cuts"):
        reference = cut_text(cut)
        wave = cut.load_audio()
        batch.append((cut.id, reference, wave[0] if wave.ndim == 2 else wave, cut.sampling_rate))
        audio_seconds += cut.duration
        if len(batch) == batch_size:
            flush()
        if time.monotonic() - last_report >= 10.0:
            last_report = time.monotonic()
            logging.info("%s: %d cuts, %.1f s of audio, real-time factor %.4f", name, len(results),
                         audio_seconds, decode_seconds / max(audio_seconds, 1e-9))
    if batch:
        flush()
    return results, audio_seconds, decode_seconds


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Returns test set -> {"wer": percent, "rtf": real-time factor}."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
    model = Path(args.model)
    tokens = Path(args.tokens) if args.tokens else model.parent / "tokens.txt"
    result_dir = Path(args.result_dir) if args.result_dir else model.parent
    suffix = args.suffix if args.suffix is not None else model.name.removesuffix(".onnx")
    try:
        recognizer = make_recognizer(model, tokens, args.num_threads)
    except FileNotFoundError as error:
        raise SystemExit(f"ERROR: {error}") from None
    summary: Dict[str, Dict[str, float]] = {}
    try:
        test_sets = parse_test_sets(args.test_cuts)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    for name, manifest in test_sets:
        results, audio_seconds, decode_seconds = decode_test_set(recognizer, manifest, args.batch_size, name)
        if not results:
            print(f"Test set {name} ({manifest}) has no cuts: nothing decoded.")
            continue
        rates = save_results(result_dir, name, {SETTING: results}, compute_cer=args.compute_cer,
                             text_normalizer=TEXT_NORMALIZERS[args.text_normalization], suffix=suffix)
        rtf = decode_seconds / audio_seconds
        summary[name] = {"wer": rates[SETTING], "rtf": rtf}
        print(f"{name}: {'CER' if args.compute_cer else 'WER'} {rates[SETTING]:.2f}% over {len(results)} cuts, "
              f"real-time factor {rtf:.4f} ({decode_seconds:.1f} s for {audio_seconds:.1f} s of audio, "
              f"{args.num_threads} thread(s), batches of {args.batch_size}); files in {result_dir}")
    return summary


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Decode test sets with sherpa-onnx (Zipformer CTC, greedy).")
    parser.add_argument("--model", required=True, help="model.onnx or model.int8.onnx of zipformer.export_onnx")
    parser.add_argument("--tokens", default=None, help="default: tokens.txt beside --model")
    parser.add_argument("--test-cuts", default=None,
                        help="comma-separated cut manifests with recordings (or NAME=PATH items); "
                             "default: decode.test_cuts of --config")
    parser.add_argument("--result-dir", default=None, help="default: the folder of --model")
    parser.add_argument("--suffix", default=None, help="file name suffix (default: the model file's stem)")
    parser.add_argument("--num-threads", type=int, default=1, help="onnxruntime threads")
    parser.add_argument("--batch-size", type=int, default=1, help="utterances per decode_streams call")
    parser.add_argument("--compute-cer", action="store_true", help="score characters (AISHELL)")
    parser.add_argument("--text-normalization", choices=tuple(TEXT_NORMALIZERS), default=None,
                        help="default: none, or the decode section of --config")
    parser.add_argument("--config", type=Path, default=None,
                        help="a recipe preset whose decode section sets the scoring (compute_cer, text_normalization)")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides of --config")
    args = parser.parse_args(argv)
    if args.overrides and args.config is None:
        parser.error("section.field=value overrides need --config")
    if args.config is not None:
        try:
            config = load_run_config(args.config, args.overrides)
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
        decode = config.decode
        if not args.compute_cer:
            from asr.tokenizer import CharTokenizer, load_tokenizer

            args.compute_cer = decode.compute_cer == "true" or (
                decode.compute_cer == "auto" and isinstance(load_tokenizer(config.train.lang_dir), CharTokenizer))
        if args.text_normalization is None:
            args.text_normalization = decode.text_normalization
        args.test_cuts = args.test_cuts or decode.test_cuts
    if not args.test_cuts:
        parser.error("give --test-cuts (or --config with decode.test_cuts)")
    if args.text_normalization is None:
        args.text_normalization = "none"
    if args.num_threads < 1:
        parser.error(f"--num-threads must be >= 1, got {args.num_threads}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    return args


if __name__ == "__main__":
    main()
