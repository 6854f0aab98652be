"""Words a streaming LLM-CTC model writes twice, placed in its chunks (paper Sec. 4.3;
egs/mini RESULTS.md, "Words written twice at a chunk boundary").

    python -m local.boundary_repeats exp/full_llm_ctc_streaming_lookahead0.32_sentences \\
        --cuts data/full/fbank/librispeech_cuts_dev-clean.jsonl.gz \\
               data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
        --history 2 --zipformer exp/full_pruned_ctc/decoding.pt --lang-dir data/full/lang_bpe_500

The run's weights are those ``asr.decode`` chooses. Each cut's features are computed per
chunk from its audio, as the streaming model is trained and decoded; the model's greedy
output is the frame argmax of its parallel masked pass at history ``--history`` (the
query outputs a chunk-by-chunk decoder with that history computes, in one pass), and each
emitted token (the first frame of a run of one non-blank class: what CTC's collapse
keeps) has the chunk of its query frame, the frame's place in the chunk and its time tau
(layout of App. E). A token starts a word where it adds a word to the text decoded so
far. A word is written twice where two words next to each other in the output are the
same; such a pair is *across a boundary* when its copies come from different chunks.

The report also scores the greedy output against the references (the run's own
normalization, as ``asr.decode`` scores it), as it is and with every *seam repeat*
written once: a word written twice across a boundary whose first copy starts in the last
``--seam-frames`` query frames of its chunk and whose second starts in the first
``--seam-frames`` of the next (the frames whose encoder windows share audio when the
lookahead is that long: 4 frames of 0.08 s for 0.32 s), the second copy dropped. That is
what a decoder that merges the seams of overlapping chunks, as buffered streaming
decoders merge overlapping buffers, would output here; the decoders do not do it.

With ``--zipformer`` (an offline Zipformer checkpoint and its ``--lang-dir``) every
reference word gets the span a forced alignment of the whole utterance gives it
(``local.chunk_boundary_errors.word_spans``; on its stored features, or on its whole
audio's fbank for cuts without them, such as ``local.join_utterances``' recordings), and
the report adds, for the words near a chunk boundary (a span from 0.5 s before the
boundary to the end of the later chunk's first ``--near`` seconds), which side of the
boundary wrote them: an output word of the same text whose first token's tau lies within
0.7 s of the span, from the chunk before the boundary or the chunk after it. The rows:
the word ends before the boundary, the boundary cuts it, it starts after the boundary (a
model with a lookahead of L seconds sees such a word in the earlier chunk only through
the lookahead when it starts within L).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from local.readout_emissions import ctc_emissions

MATCH_SECONDS = 0.7
BEFORE_SECONDS = 0.5
SIDES = ("before", "cut", "after")
SIDE_WORDS = {"before": "ends at the boundary or before", "cut": "is cut by the boundary",
              "after": "starts after the boundary"}


@dataclass(frozen=True)
class Word:
    """One output word: its text, and the chunk, place in the chunk (0-based frame) and tau
    (ticks of 10 ms) of its first token's query frame; ``chunk_frames`` is T_b of that chunk."""

    text: str
    chunk: int
    frame_in_chunk: int
    chunk_frames: int
    tau: int


def output_words(frame_ids: Sequence[int], layout, blank: int, decode: Callable[[List[int]], str]) -> List[Word]:
    """The words of one utterance's greedy output (its frame argmax over the T_n query
    frames of ``layout``), each placed by its first token."""
    chunk_first, first = [], 0
    for count in layout.chunk_lens:
        chunk_first.append(first)
        first += count
    if len(frame_ids) != layout.num_frames:
        raise ValueError(f"{len(frame_ids)} frame ids for a layout of {layout.num_frames} query frames")
    words: List[Word] = []
    emitted: List[int] = []
    for frame, label in ctc_emissions(frame_ids, blank):
        before = len(decode(emitted).split()) if emitted else 0
        emitted.append(label)
        text = decode(emitted).split()
        if len(text) > before or not words:
            position = layout.query_positions[frame]
            chunk = layout.chunk[position]
            words.append(Word(text[-1] if text else "", chunk, frame - chunk_first[chunk], layout.chunk_lens[chunk],
                              layout.tau[position]))
        elif text:
            words[-1] = dataclasses.replace(words[-1], text=text[-1])
    return words


def doubled(words: Sequence[Word]) -> List[Tuple[Word, Word]]:
    """The pairs of neighbouring output words that are the same word (case aside)."""
    return [(a, b) for a, b in zip(words, words[1:]) if a.text.lower() == b.text.lower()]


def is_seam_repeat(first: Word, second: Word, window: int) -> bool:
    """Whether a doubled pair is a seam repeat: the first copy in the last ``window``
    frames of its chunk, the second in the first ``window`` frames of the next chunk."""
    return (second.chunk == first.chunk + 1 and first.chunk_frames - first.frame_in_chunk <= window
            and second.frame_in_chunk < window)


def seam_merged(words: Sequence[Word], window: int) -> List[Word]:
    """``words`` with the second copy of every seam repeat dropped."""
    kept: List[Word] = []
    for k, word in enumerate(words):
        previous = words[k - 1] if k else None
        if previous is not None and previous.text.lower() == word.text.lower() and \
                is_seam_repeat(previous, word, window):
            continue
        kept.append(word)
    return kept


def boundary_side(span: Tuple[float, float], boundary: float) -> str:
    """Where a word's (start, end) span lies against a boundary (seconds): 'before' (it
    ends at or before it), 'cut' (it starts before and ends after), 'after'."""
    start, end = span
    if end <= boundary:
        return "before"
    return "cut" if start < boundary else "after"


def near_boundary_rows(words: Sequence[Word], reference: Sequence[str], spans: Sequence[Tuple[float, float]],
                       duration: float, chunk_seconds: int, near: float, ticks_per_second: int = 100
                       ) -> List[Tuple[str, str]]:
    """(side, who) for each reference word near a boundary of one utterance: side from
    :func:`boundary_side`; who writes it: 'earlier chunk', 'later chunk', 'both' or
    'neither' (output words of the same text whose tau lies within ``MATCH_SECONDS`` of the
    span, in the chunk before or after the boundary)."""
    rows = []
    for b in range(1, int(duration // chunk_seconds) + 1):
        boundary = b * chunk_seconds
        if boundary >= duration:
            break
        for text, span in zip(reference, spans):
            if not (span[1] > boundary - BEFORE_SECONDS and span[0] < boundary + near):
                continue
            chunks = {w.chunk for w in words if w.text.lower() == text.lower() and w.chunk in (b - 1, b)
                      and span[0] - MATCH_SECONDS <= w.tau / ticks_per_second <= span[1] + MATCH_SECONDS}
            who = {frozenset(): "neither", frozenset({b - 1}): "earlier chunk", frozenset({b}): "later chunk"}.get(
                frozenset(chunks), "both")
            rows.append((boundary_side(span, boundary), who))
    return rows


def summary(pairs: Sequence[Tuple[Word, Word]], sides: Sequence[Optional[str]], rows: Sequence[Tuple[str, str]],
            num_words: int, tail: int = 4, errors: Optional[Tuple[int, int, int]] = None) -> List[str]:
    """The printed report: the doubled words, where their copies are, the greedy output's
    errors (``errors``: reference words, errors, errors with the seam repeats written
    once) and (with word spans) who writes the words near a boundary."""
    across = [(a, b) for a, b in pairs if a.chunk != b.chunk]
    lines = [f"output words {num_words}; written twice: {len(pairs)}; across a chunk boundary: {len(across)} "
             f"(first copy in the last {tail} frames of its chunk: "
             f"{sum(1 for a, _ in across if a.chunk_frames - a.frame_in_chunk <= tail)}; second copy in the first "
             f"{tail} frames of the next chunk: "
             f"{sum(1 for a, b in across if b.chunk == a.chunk + 1 and b.frame_in_chunk < tail)}; "
             f"seam repeats: {sum(1 for a, b in pairs if is_seam_repeat(a, b, tail))})"]
    if errors is not None:
        words, as_is, merged = errors
        lines.append(f"greedy output: {as_is} errors on {words} reference words ({100 * as_is / max(words, 1):.2f}%); "
                     f"with the seam repeats written once: {merged} ({100 * merged / max(words, 1):.2f}%)")
    counted = collections.Counter(side for (a, b), side in zip(pairs, sides) if a.chunk != b.chunk and side)
    if counted:
        lines.append("across a boundary, the word against it: " + ", ".join(
            f"{side} {counted[side]}" for side in SIDES))
    for (a, b), side in zip(pairs, sides):
        where = f"; the word {SIDE_WORDS[side]}" if side else ""
        lines.append(f"  {a.text}: chunk {a.chunk} frame {a.frame_in_chunk}/{a.chunk_frames} "
                     f"(tau {a.tau / 100:.2f} s), chunk {b.chunk} frame {b.frame_in_chunk}/{b.chunk_frames} "
                     f"(tau {b.tau / 100:.2f} s){where}")
    if rows:
        table = collections.Counter(rows)
        whos = ("earlier chunk", "later chunk", "both", "neither")
        lines += ["", "| reference words near a boundary | words | " + " | ".join(whos) + " |",
                  "|---|---|" + "---|" * len(whos)]
        for side in SIDES:
            total = sum(table[side, who] for who in whos)
            lines.append(f"| {side} | {total} | " + " | ".join(str(table[side, who]) for who in whos) + " |")
    return lines


def greedy_frames(model, features: torch.Tensor, lens: torch.Tensor, history: int,
                  chunk_seconds: int = 2) -> Tuple[List[List[int]], list]:
    """Per utterance the frame argmax of the parallel masked pass at ``history`` seconds
    (query readout, chunks of ``chunk_seconds``), and the layouts."""
    from llm_ctc.streaming.encoder import streaming_speech_embeddings
    from llm_ctc.streaming.llm import parallel_query_states

    speech, layouts = streaming_speech_embeddings(model, features, lens, history, chunk_seconds)
    states, frame_lens = parallel_query_states(model, speech, layouts, history)
    ids = model.log_probs_of_states(states).argmax(dim=-1)
    return [ids[n, :int(frame_lens[n])].tolist() for n in range(len(layouts))], layouts


def load_streaming_run(exp_dir: Path, attn_implementation: Optional[str] = None):
    """The run's model (the weights ``asr.decode`` chooses) and its lexicon; with
    ``attn_implementation`` (e.g. "eager", whose attention probabilities are returned) the
    LLM is built with that one."""
    from asr.weights import build_trained_model, choose_weights, load_lexicon, saved_run_config

    config = saved_run_config(exp_dir)
    if config.family != "llm_ctc" or not getattr(config.model, "streaming", False):
        raise ValueError(f"{exp_dir} holds no streaming LLM-CTC run (family {config.family})")
    weights = choose_weights(exp_dir, config.decode)
    if attn_implementation is not None:
        weights.saved.model.attn_implementation = attn_implementation
    lexicon = load_lexicon(weights.saved.train.lang_dir, weights.saved)
    return build_trained_model(weights, lexicon), lexicon


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", type=Path, help="a streaming LLM-CTC run (model.streaming true)")
    parser.add_argument("--cuts", type=Path, nargs="+", required=True, help="cut manifests with recordings")
    parser.add_argument("--history", type=int, default=2, help="history h in seconds (default 2)")
    parser.add_argument("--zipformer", type=Path, help="an offline Zipformer checkpoint: word spans")
    parser.add_argument("--lang-dir", type=Path, help="the Zipformer's lang dir (with --zipformer)")
    parser.add_argument("--near", type=float, default=0.32,
                        help="seconds after a boundary in which a starting word counts as near it (default 0.32)")
    parser.add_argument("--seam-frames", type=int, default=4,
                        help="query frames on each side of a boundary where a repeat is a seam repeat (default 4)")
    parser.add_argument("--batch", type=int, default=8, help="utterances per forward pass")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if args.history < 0:
        raise SystemExit(f"ERROR: --history must be >= 0 seconds, got {args.history}")
    if args.seam_frames < 1:
        raise SystemExit(f"ERROR: --seam-frames must be >= 1 query frames, got {args.seam_frames}")
    if (args.zipformer is None) != (args.lang_dir is None):
        raise SystemExit("ERROR: --zipformer and --lang-dir go together (the Zipformer's own lang dir)")
    from asr.chunk_features import PerChunkFeatures
    from asr.data import load_cuts_lazy

    try:
        model, lexicon = load_streaming_run(args.exp_dir)
        cuts = [cut for path in args.cuts for cut in load_cuts_lazy(path, "--cuts")]
        aligner = None
        if args.zipformer is not None:
            from asr.tokenizer import load_tokenizer
            from zipformer.model import load_ctc_checkpoint

            aligner = load_ctc_checkpoint(args.zipformer).eval(), load_tokenizer(args.lang_dir)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    per_chunk = PerChunkFeatures(model.chunk_seconds)
    pairs, sides, rows, num_words = [], [], [], 0
    errors = [0, 0, 0]  # reference words, errors, errors with the seam repeats written once
    for start in range(0, len(cuts), args.batch):
        group = cuts[start:start + args.batch]
        feats = [per_chunk.cut_features(cut) for cut in group]
        lens = torch.tensor([f.shape[0] for f in feats])
        with torch.inference_mode():
            frames, layouts = greedy_frames(model, torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lens,
                                            args.history, model.chunk_seconds)
            spans = aligned_spans(aligner, group) if aligner else [None] * len(group)
        for cut, ids, layout, cut_spans in zip(group, frames, layouts, spans):
            words = output_words(ids, layout, model.blank_id, model.decode_ids)
            num_words += len(words)
            found = doubled(words)
            pairs += found
            reference = " ".join(s.text for s in cut.supervisions).split()
            scored = lexicon.normalize_reference(" ".join(reference)).split()
            errors[0] += len(scored)
            for k, hypothesis in ((1, words), (2, seam_merged(words, args.seam_frames))):
                errors[k] += word_errors(scored, [w.text for w in hypothesis])
            for a, b in found:
                side = None
                if cut_spans is not None and a.chunk != b.chunk:
                    boundary = b.chunk * model.chunk_seconds
                    near = [span for text, span in zip(reference, cut_spans) if text.lower() == a.text.lower()]
                    if near:
                        side = boundary_side(min(near, key=lambda s: abs(s[0] - boundary)), boundary)
                sides.append(side)
            if cut_spans is not None:
                rows += near_boundary_rows(words, reference, cut_spans, cut.duration, model.chunk_seconds, args.near)
        logging.info("%d of %d cuts", min(start + args.batch, len(cuts)), len(cuts))
    print("\n".join(summary(pairs, sides, rows, num_words, args.seam_frames, tuple(errors))))


def word_errors(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Substitutions, deletions and insertions of the best alignment (kaldialign)."""
    import kaldialign

    return int(kaldialign.edit_distance(list(reference), list(hypothesis))["total"])


def aligned_spans(aligner, cuts) -> List[List[Tuple[float, float]]]:
    """Each cut's reference word spans (seconds) from the Zipformer's forced alignment of
    its stored features, or of its whole audio's fbank where it has none (the recordings of
    ``local.join_utterances``)."""
    from lhotse import CutSet

    from local.chunk_boundary_errors import alignment_features, word_spans
    from local.chunked_encoder_wer import whole_log_probs

    zipformer, tokenizer = aligner
    features, lens = alignment_features(CutSet.from_cuts(cuts))
    out = []
    for cut, log_probs in zip(cuts, whole_log_probs(zipformer, features, lens)):
        words = " ".join(s.text for s in cut.supervisions).split()
        out.append(word_spans(log_probs, tokenizer.encode(words), tokenizer.blank_id))
    return out


if __name__ == "__main__":
    main()
