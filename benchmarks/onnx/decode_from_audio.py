"""Our PyTorch model decoding from audio, timed the way zipformer.sherpa_decode times sherpa-onnx.

    python -m benchmarks.onnx.decode_from_audio --exp-dir egs/mini/exp/full_pruned_ctc --iter 1350 --avg 1 \\
        --use-averaged-model true --test-cuts egs/mini/data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
        --result-dir DIR

(from the repository root; benchmarks/onnx/run_mini.sh runs it beside sherpa-onnx). For
one file's text use ``python -m asr.transcribe``.

One utterance at a time: lhotse fbank of the audio (uncompressed, where asr.decode
reads the lilcom-compressed stored features) -> log-probs -> greedy search -> text. The
real-time factor counts features, network and search, as sherpa-onnx's does, so the two
compare the runtimes alone; the WER separates feature storage from runtime differences.
Writes icefall's result files under the setting ``torch-greedy-from-audio``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from lhotse import Fbank, FbankConfig

from asr.config import DecodeOptions, build_section
from asr.cut_filters import cut_text
from asr.data import load_cuts_lazy
from asr.scoring import save_results
from asr.search import ctc_greedy_search
from asr.weights import load_trained_model


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.onnx.decode_from_audio",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--exp-dir", required=True)
    # The checkpoint choice of asr.decode (its decode section's defaults when not given).
    parser.add_argument("--epoch")
    parser.add_argument("--iter")
    parser.add_argument("--avg")
    parser.add_argument("--use-averaged-model")
    parser.add_argument("--test-cuts", required=True)
    parser.add_argument("--result-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    choice = {"epoch": args.epoch, "iter": args.iter, "avg": args.avg, "use_averaged_model": args.use_averaged_model}
    options = build_section(DecodeOptions, {}, [f"{k}={v}" for k, v in choice.items() if v is not None], "decode")
    trained = load_trained_model(args.exp_dir, options)
    model, tokenizer, suffix = trained.model, trained.tokenizer, trained.weights.suffix
    extractor = Fbank(FbankConfig(num_mel_bins=80))
    results, audio_seconds, busy = [], 0.0, 0.0
    for cut in load_cuts_lazy(args.test_cuts, "--test-cuts"):
        wave = cut.load_audio()[0]
        started = time.perf_counter()
        with torch.inference_mode():
            features = torch.from_numpy(extractor.extract(wave, cut.sampling_rate))[None]
            log_probs, lengths = model.log_probs(features, torch.tensor([features.shape[1]]))
            text = tokenizer.decode(ctc_greedy_search(log_probs, lengths, blank_id=tokenizer.blank_id)[0])
        busy += time.perf_counter() - started
        audio_seconds += cut.duration
        results.append((cut.id, cut_text(cut).split(), text.split()))
    rates = save_results(Path(args.result_dir), Path(args.test_cuts).name.split("_cuts_")[-1].split(".")[0],
                         {"torch-greedy-from-audio": results}, suffix=suffix)
    print(f"WER {rates}, real-time factor {busy / audio_seconds:.4f} ({busy:.1f} s for "
          f"{audio_seconds:.1f} s of audio, {len(results)} cuts, one thread)")


if __name__ == "__main__":
    main()
