"""The frozen Zipformer's own CTC WER on what streaming LLM-CTC's encoder sees (paper
Sec. 4.3, App. D.4), beside the same model on whole utterances.

Streaming LLM-CTC (``llm_ctc/streaming/encoder.py``) runs the frozen encoder on one window
per 2 s chunk: the chunk's own features (computed per chunk) after h seconds of history,
with no later audio, and keeps only the chunk's output frames (``zipformer/windows.py``,
which a Zipformer trained with ``model.streaming`` also runs). This program decodes those
frames with the Zipformer's own CTC head (greedy search), so it says how much of the
speech the streaming model can still read there, against three references on the same
test cuts: whole utterances with the stored features (where the cuts have them), and
whole utterances with the per-chunk features::

    python -m local.chunked_encoder_wer exp/full_pruned_ctc/decoding.pt \\
        data/full/fbank/librispeech_cuts_test-clean.jsonl.gz --lang-dir data/full/lang_bpe_500 \\
        --history 2 4 8

It prints one line per setting (WER, errors), writes them as a TSV with --output, and each
setting's hypotheses as icefall recogs- files with --recogs-dir.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from lhotse import CutSet

from asr.atomic_io import write_text_atomically
from asr.chunk_features import PerChunkFeatures
from asr.data import load_cuts_lazy
from asr.lookahead import lookahead_frames_of
from asr.scoring import compute_error_stats, format_recogs
from asr.search import ctc_greedy_search
from asr.tokenizer import load_tokenizer
from zipformer.model import load_ctc_checkpoint
from zipformer.windows import windowed_encode


def chunked_log_probs(model, features: torch.Tensor, num_frames: int, history_seconds: int,
                      chunk_seconds: int, lookahead_frames: int = 0) -> torch.Tensor:
    """(T', V) log-probabilities of one utterance, each chunk's frames from its own window
    (with ``lookahead_frames`` of the next chunk)."""
    encoded, lens = windowed_encode(model.encoder, features[None, :num_frames], torch.tensor([num_frames]),
                                    history_seconds, chunk_seconds, lookahead_frames)
    return model.head(encoded[0, :int(lens[0])].float()).log_softmax(dim=-1)


def whole_log_probs(model, features: torch.Tensor, lens: torch.Tensor) -> List[torch.Tensor]:
    """Per utterance (T', V) log-probabilities of the encoder run on whole utterances (also
    for a model trained on chunk windows, whose own ``log_probs`` runs windows)."""
    encoded, out_lens = model.encoder(features, lens)
    log_probs = model.head(encoded.float()).log_softmax(dim=-1)
    return [log_probs[n, :int(out_lens[n])] for n in range(len(lens))]


def evaluate(model, cuts: CutSet, tokenizer, histories: Sequence[int], chunk_seconds: int = 2,
             batch_size: int = 8, results: Optional[Dict[str, list]] = None,
             lookahead_frames: int = 0) -> Dict[str, tuple]:
    """{setting: (WER %, errors, reference words)} for the whole-utterance references and
    each history; ``results``, when given, receives each setting's (cut id, reference,
    hypothesis) rows."""
    per_chunk = PerChunkFeatures(chunk_seconds)
    from lhotse.dataset.input_strategies import PrecomputedFeatures

    stored = PrecomputedFeatures()
    cut_list = list(cuts)
    # Joined recordings (local.join_utterances) have audio only: no stored-features row.
    with_stored = all(cut.has_features for cut in cut_list)
    settings = ["whole, stored features", "whole, per-chunk features"] + [f"chunked, h = {h} s" for h in histories]
    results = {} if results is None else results
    results.update({name: [] for name in settings[0 if with_stored else 1:]})
    with torch.inference_mode():
        for start in range(0, len(cut_list), batch_size):
            batch = CutSet.from_cuts(cut_list[start:start + batch_size])
            references = [tokenizer.normalize_reference(" ".join(s.text for s in c.supervisions)).split()
                          for c in batch]
            outputs = {settings[0]: whole_log_probs(model, *stored(batch))} if with_stored else {}
            chunked, chunked_lens = per_chunk(batch, None)
            outputs[settings[1]] = whole_log_probs(model, chunked, chunked_lens)
            for h, name in zip(histories, settings[2:]):
                outputs[name] = [chunked_log_probs(model, chunked[n], int(chunked_lens[n]), h, chunk_seconds,
                                                   lookahead_frames)
                                 for n in range(len(batch))]
            for name, per_utterance in outputs.items():
                for cut, reference, log_probs in zip(batch, references, per_utterance):
                    ids = ctc_greedy_search(log_probs[None], torch.tensor([log_probs.shape[0]]),
                                            tokenizer.blank_id)[0]
                    results[name].append((cut.id, reference, tokenizer.decode(ids).split()))
            logging.info("%d/%d cuts", min(start + batch_size, len(cut_list)), len(cut_list))
    table = {}
    for name, rows in results.items():
        stats = compute_error_stats(rows)
        errors = stats.insertions + stats.deletions + stats.substitutions
        table[name] = (100.0 * errors / stats.reference_length, errors, stats.reference_length)
    return table


def setting_file_name(setting: str) -> str:
    """'chunked, h = 2 s' -> 'chunked-h2s', 'whole, per-chunk features' -> 'whole-per-chunk-features'."""
    return "-".join(re.sub(r"h = (\d+) s", r"h\1s", setting).replace(",", "").split())


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a Zipformer checkpoint written by asr.train")
    parser.add_argument("cuts", help="test cuts with stored features and audio")
    parser.add_argument("--lang-dir", type=Path, required=True, help="the Zipformer's lexicon folder")
    parser.add_argument("--history", type=int, nargs="+", default=[2, 4, 8], help="h in seconds")
    parser.add_argument("--chunk-seconds", type=int, default=2)
    parser.add_argument("--lookahead-seconds", type=float, default=None,
                        help="each window also reads this much of the next chunk (asr.lookahead; "
                             "default: the model's model.streaming_lookahead_seconds, 0 for a whole-utterance model)")
    parser.add_argument("--output", type=Path, help="also write the table here (TSV)")
    parser.add_argument("--recogs-dir", type=Path,
                        help="also write each setting's hypotheses here, as icefall recogs- files "
                             "(recogs-<setting>.txt; local.long_input_errors reads them)")
    args = parser.parse_args(argv)
    if any(h < 0 for h in args.history) or args.chunk_seconds < 1:
        parser.error(f"--history must be >= 0 and --chunk-seconds >= 1, got {args.history} and {args.chunk_seconds}")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    rows: Dict[str, list] = {}
    model = load_ctc_checkpoint(args.checkpoint).eval()
    seconds = model.config.streaming_lookahead_seconds if args.lookahead_seconds is None else args.lookahead_seconds
    try:
        lookahead = lookahead_frames_of(seconds, args.chunk_seconds, "--lookahead-seconds")
    except ValueError as error:
        parser.error(str(error))
    table = evaluate(model, load_cuts_lazy(args.cuts, "cuts"), load_tokenizer(args.lang_dir), args.history,
                     args.chunk_seconds, results=rows, lookahead_frames=lookahead)
    if args.recogs_dir:
        args.recogs_dir.mkdir(parents=True, exist_ok=True)
        for name, results in rows.items():
            write_text_atomically(args.recogs_dir / f"recogs-{setting_file_name(name)}.txt", format_recogs(results))
    lines = ["setting\tWER (%)\terrors\twords"]
    lines += [f"{name}\t{wer:.2f}\t{errors}\t{words}" for name, (wer, errors, words) in table.items()]
    print("\n".join(lines))
    if args.output:
        write_text_atomically(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
