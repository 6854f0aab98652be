"""Where streaming's extra errors are: each reference word of the test sentences placed in
time by a CTC forced alignment (``asr.alignment``) through an offline Zipformer on whole
utterances, and every decode's errors counted by the word's distance from the nearest
2 s chunk boundary (paper Sec. 4.3: streaming encodes chunk b without the audio after
it, so a word that a boundary cuts is encoded in two windows, the first without its
end). egs/mini's stage 11 runs it on its three models::

    python -m local.chunk_boundary_errors exp/full_pruned_ctc/decoding.pt \
        --cuts data/full/fbank/librispeech_cuts_dev-clean.jsonl.gz \
               data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \
        --lang-dir data/full/lang_bpe_500 --sets dev-clean test-clean \
        --decode "streaming, h = 2 s=exp/full_llm_ctc_streaming_lookahead0.32_sentences:2" \
        --decode "offline query readout=exp/full_llm_ctc_query_offline_lookahead0.32"

``--decode NAME=FOLDER`` reads the recogs files of ``asr.decode``'s best offline setting
of ``--search`` (prefix beam by default) in the newest results of each of ``--sets``, as
``llm_ctc.streaming.table`` picks its rows; ``NAME=FOLDER:H`` the best setting at history
H s. ``--recogs NAME=FILE`` names one recogs file instead; a name given more than once
pools its files (seeds, sets).

A word's span runs from the first to the last frame of its tokens in the alignment (40 ms
frames); a boundary inside the span puts the word in the first row (a word the boundary
cuts). Substitutions and deletions belong to their reference word, an insertion to the
reference word before it (the first word when it comes first). Sentences no longer than
one chunk have no boundary: their own row. ``--sides`` splits the rows near a boundary by
its side: the word ends before it (the chunk it closes reads the word) or starts after it.
The 30-60 s recordings of ``local.join_utterances`` (cuts with audio only) are aligned
whole; their cut ids repeat between sets, so give one set of recordings per run::

    python -m local.chunk_boundary_errors exp/full_pruned_ctc/decoding.pt --sides \
        --cuts data/full/test_long/cuts.jsonl.gz --lang-dir data/full/lang_bpe_500 \
        --recogs "recordings=exp/full_llm_ctc_streaming_lookahead0.32/recogs-test-clean-long-<setting>.txt"
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import kaldialign
import torch
from lhotse import CutSet

from asr.alignment import ctc_forced_alignment, token_frames
from asr.atomic_io import write_text_atomically
from asr.data import load_cuts_lazy
from asr.scoring import ERROR_SYMBOL, read_recogs
from asr.tokenizer import load_tokenizer
from llm_ctc.streaming.table import SEARCHES, best_setting, newest_suffix
from local.chunked_encoder_wer import whole_log_probs
from zipformer.model import load_ctc_checkpoint
from zipformer.windows import FRAMES_PER_OUTPUT

SECONDS_PER_FRAME = FRAMES_PER_OUTPUT / 100
ONE_CHUNK = "sentence within one chunk"
CUT = "a boundary inside the word"


def word_spans(log_probs: torch.Tensor, word_tokens: Sequence[Sequence[int]], blank_id: int,
               seconds_per_frame: float = SECONDS_PER_FRAME) -> List[Tuple[float, float]]:
    """(start, end) in seconds of each word, from the forced alignment of its tokens: the
    first frame of its first token to the end of the last frame of its last token."""
    tokens = [token for word in word_tokens for token in word]
    spans = token_frames(ctc_forced_alignment(log_probs, tokens, blank_id), blank_id)
    if len(spans) != len(tokens):
        raise RuntimeError(f"the alignment has {len(spans)} tokens, the words {len(tokens)}")
    out, index = [], 0
    for word in word_tokens:
        if not word:
            raise ValueError("a word has no tokens")
        first, last = spans[index][0], spans[index + len(word) - 1][1]
        out.append((first * seconds_per_frame, (last + 1) * seconds_per_frame))
        index += len(word)
    return out


def boundary_distance(span: Tuple[float, float], duration: float, chunk_seconds: float) -> Optional[float]:
    """Seconds from the span to the nearest chunk boundary inside the utterance (0 when one
    falls within it); None for an utterance no longer than one chunk."""
    signed = signed_boundary_distance(span, duration, chunk_seconds)
    return None if signed is None else abs(signed)


def signed_boundary_distance(span: Tuple[float, float], duration: float, chunk_seconds: float) -> Optional[float]:
    """``boundary_distance`` with a sign: negative where the span ends before its nearest
    boundary (the word lies in the chunk the boundary closes), positive where it starts
    after it (the chunk the boundary opens); 0 for a cut word, None for one chunk."""
    boundaries = [chunk_seconds * b for b in range(1, int(duration // chunk_seconds) + 1)
                  if chunk_seconds * b < duration]
    if not boundaries:
        return None
    start, end = span
    if any(start <= b <= end for b in boundaries):
        return 0.0
    return min((start - b if start > b else end - b for b in boundaries), key=abs)


def distance_bin(distance: Optional[float], edges: Sequence[float], sides: bool = False) -> str:
    """The row of a distance: the cut-word row (0), '< e1 s', 'e1-e2 s', ..., '>= en s', or
    the one-chunk row (None). With ``sides`` the distance is signed
    (``signed_boundary_distance``) and the rows below en are split into 'before, ...' (the
    word ends before the boundary) and 'after, ...' (it starts after it)."""
    if distance is None:
        return ONE_CHUNK
    if distance == 0:
        return CUT
    side = ("before, " if distance < 0 else "after, ") if sides else ""
    distance = abs(distance)
    for low, high in zip([0.0] + list(edges), edges):
        if distance < high:
            return side + (f"< {high:g} s" if low == 0 else f"{low:g}-{high:g} s")
    return f">= {edges[-1]:g} s"


def bin_order(edges: Sequence[float], sides: bool = False) -> List[str]:
    near = [edges[0] / 2] + list(edges[:-1])
    rows = [distance_bin(d, edges) for d in near]
    if sides:
        rows = [f"before, {row}" for row in rows] + [f"after, {row}" for row in rows]
    return [CUT] + rows + [distance_bin(edges[-1], edges), ONE_CHUNK]


def count_by_bin(results: Dict[str, Tuple[List[str], List[str]]], bins: Dict[str, List[str]]) -> Counter:
    """Counter of (row, 'words') and (row, 'errors') over the cuts of ``results`` (cut id ->
    (reference, hypothesis)); ``bins`` gives each cut's row per reference word."""
    counts: Counter = Counter()
    for cut_id, (reference, hypothesis) in results.items():
        if cut_id not in bins:
            raise KeyError(f"cut {cut_id} of the recogs is not in --cuts")
        rows = bins[cut_id]
        if len(rows) != len(reference):
            raise ValueError(f"cut {cut_id}: the recogs' reference has {len(reference)} words, the cut's "
                             f"transcript {len(rows)}")
        word = 0
        for ref, hyp in kaldialign.align(list(reference), list(hypothesis), ERROR_SYMBOL):
            if ref == ERROR_SYMBOL:  # an insertion: the word before it (or the first)
                counts[rows[max(word - 1, 0)], "errors"] += 1
                continue
            counts[rows[word], "words"] += 1
            counts[rows[word], "errors"] += ref != hyp
            word += 1
    return counts


def format_table(counts: Dict[str, Counter], edges: Sequence[float], sides: bool = False) -> str:
    rows = [row for row in bin_order(edges, sides) if any(c[row, "words"] for c in counts.values())]
    lines = ["| reference words, by distance from a chunk boundary | words | "
             + " | ".join(f"{name}: errors (%)" for name in counts) + " |",
             "|---|---|" + "---|" * len(counts)]
    for row in rows:
        words = next(iter(counts.values()))[row, "words"]
        cells = [f"{c[row, 'errors']} ({100 * c[row, 'errors'] / max(c[row, 'words'], 1):.2f})"
                 for c in counts.values()]
        lines.append(f"| {row} | {words} | " + " | ".join(cells) + " |")
    totals = [f"{sum(c[r, 'errors'] for r in rows)}" for c in counts.values()]
    lines.append(f"| all | {sum(next(iter(counts.values()))[r, 'words'] for r in rows)} | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


def decode_recogs(folder: Path, sets: Sequence[str], history: Optional[int] = None,
                  search: str = "beam") -> List[Path]:
    """The recogs file of the best ``search`` setting (offline, or of history ``history``)
    in the newest results of each test set in ``folder``."""
    from asr.scoring import read_wer_summary

    paths = []
    for test_set in sets:
        suffix = newest_suffix(folder, test_set)
        setting = best_setting(read_wer_summary(folder, test_set, suffix), history, search)
        path = folder / f"recogs-{test_set}-{setting}-{suffix}.txt"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (its wer-summary names the setting)")
        paths.append(path)
    return paths


def whole_audio_features(cuts: CutSet) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B, T, bins) log-mel fbank of each cut's whole audio, padded as Lhotse pads stored
    features, and the lengths T."""
    from lhotse.utils import LOG_EPSILON

    from asr.chunk_features import ChunkFbank, DEFAULT_MEL_BINS

    frontend = ChunkFbank(DEFAULT_MEL_BINS)
    per_cut = []
    for cut in cuts:
        if not cut.has_recording:
            raise ValueError(f"cut {cut.id} has neither stored features nor a recording to compute them from")
        audio = cut.load_audio()
        per_cut.append(frontend(audio[0] if audio.ndim == 2 else audio))
    lengths = torch.tensor([f.shape[0] for f in per_cut])
    return torch.nn.utils.rnn.pad_sequence(per_cut, batch_first=True, padding_value=LOG_EPSILON), lengths


def alignment_features(cuts: CutSet) -> Tuple[torch.Tensor, torch.Tensor]:
    """The features a forced alignment reads: the cuts' stored features, or, where a cut
    has none (``local.join_utterances``' recordings), every cut's whole-audio fbank."""
    from lhotse.dataset.input_strategies import PrecomputedFeatures

    return PrecomputedFeatures()(cuts) if all(cut.has_features for cut in cuts) else whole_audio_features(cuts)


def cut_bins(model, cuts: CutSet, tokenizer, chunk_seconds: float, edges: Sequence[float],
             batch_size: int = 8, sides: bool = False) -> Dict[str, List[str]]:
    """cut id -> the row of each reference word (by ``tokenizer.normalize_reference``).
    Cuts without stored features (``local.join_utterances``' recordings) get the whole
    audio's fbank, computed as the stored features were."""
    cut_list, bins = list(cuts), {}
    with torch.inference_mode():
        for start in range(0, len(cut_list), batch_size):
            batch = CutSet.from_cuts(cut_list[start:start + batch_size])
            features = alignment_features(batch)
            for cut, log_probs in zip(batch, whole_log_probs(model, *features)):
                text = " ".join(s.text for s in cut.supervisions)
                words = text.split()
                if len(tokenizer.normalize_reference(text).split()) != len(words):
                    raise ValueError(f"cut {cut.id}: its scored reference does not have one word per word of {text!r}")
                spans = word_spans(log_probs, tokenizer.encode(words), tokenizer.blank_id)
                bins[cut.id] = [distance_bin(signed_boundary_distance(span, cut.duration, chunk_seconds), edges,
                                             sides) for span in spans]
            logging.info("aligned %d/%d cuts", min(start + batch_size, len(cut_list)), len(cut_list))
    return bins


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="an offline Zipformer checkpoint written by asr.train")
    parser.add_argument("--cuts", nargs="+", required=True, help="the test cuts (stored features)")
    parser.add_argument("--lang-dir", type=Path, required=True, help="the Zipformer's lexicon folder")
    parser.add_argument("--recogs", action="append", default=[], metavar="NAME=FILE",
                        help="a decode's recogs- file; a NAME given more than once pools its files")
    parser.add_argument("--decode", action="append", default=[], metavar="NAME=FOLDER[:H]",
                        help="an asr.decode folder: its best --search setting per --sets (at history H s)")
    parser.add_argument("--sets", nargs="+", default=[], help="the test sets of --decode, e.g. dev-clean test-clean")
    parser.add_argument("--search", choices=sorted(SEARCHES), default="beam", help="the search of --decode's settings")
    parser.add_argument("--chunk-seconds", type=float, default=2.0)
    parser.add_argument("--edges", type=float, nargs="+", default=[0.25, 0.5], help="row edges in seconds")
    parser.add_argument("--sides", action="store_true",
                        help="split the rows near a boundary by its side: the word ends before it or starts after it")
    parser.add_argument("--output", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args(argv)
    if args.chunk_seconds <= 0 or sorted(args.edges) != args.edges or args.edges[0] <= 0:
        parser.error(f"--chunk-seconds must be > 0 and --edges increasing and > 0, got {args.chunk_seconds} "
                     f"and {args.edges}")
    decodes: Dict[str, List[Path]] = {}
    for item in args.recogs:
        name, sep, path = item.rpartition("=")  # a name may hold "=", a path seldom
        if not sep or not name or not Path(path).is_file():
            parser.error(f"--recogs expects NAME=FILE with an existing file, got {item!r}")
        decodes.setdefault(name, []).append(Path(path))
    if args.decode and not args.sets:
        parser.error("--decode needs --sets")
    if not args.recogs and not args.decode:
        parser.error("give --recogs NAME=FILE or --decode NAME=FOLDER")
    for item in args.decode:
        name, sep, folder = item.rpartition("=")
        folder, colon, history = folder.rpartition(":") if folder.rpartition(":")[2].isdigit() else (folder, "", "")
        if not sep or not name or not Path(folder).is_dir():
            parser.error(f"--decode expects NAME=FOLDER or NAME=FOLDER:H with an existing folder, got {item!r}")
        try:
            found = decode_recogs(Path(folder), args.sets, int(history) if colon else None, args.search)
        except (FileNotFoundError, ValueError) as error:
            raise SystemExit(f"ERROR: --decode {item!r}: {error}") from None
        decodes.setdefault(name, []).extend(found)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    cut_list, seen = [], {}
    for path in args.cuts:
        for cut in load_cuts_lazy(path, "--cuts"):
            if cut.id in seen:
                raise SystemExit(f"ERROR: cut {cut.id} is in both {seen[cut.id]} and {path}: the recogs name cuts "
                                 "by id, so give cuts with one id each (one table per set of recordings)")
            seen[cut.id] = path
            cut_list.append(cut)
    bins = cut_bins(load_ctc_checkpoint(args.checkpoint).eval(), CutSet.from_cuts(cut_list),
                    load_tokenizer(args.lang_dir), args.chunk_seconds, args.edges, sides=args.sides)
    counts = {}
    for name, paths in decodes.items():
        counts[name] = Counter()
        for path in paths:
            counts[name].update(count_by_bin(read_recogs(path), bins))
    words = {name: {row: c[row, "words"] for row in bin_order(args.edges, args.sides)} for name, c in counts.items()}
    if len({tuple(w.values()) for w in words.values()}) > 1:
        raise SystemExit(f"ERROR: the decodes do not cover the same reference words: {words}")
    table = format_table(counts, args.edges, args.sides)
    print(table, end="")
    if args.output:
        write_text_atomically(args.output, table)


if __name__ == "__main__":
    main()
