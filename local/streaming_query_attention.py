"""Whether a streaming LLM-CTC model's queries find their own speech, by the kind of chunk
and the place in it (Sec. 4.3, eq. 11; egs/mini RESULTS.md, "Do the queries of a chunk
that starts inside speech find their speech").

    python -m local.streaming_query_attention exp/full_llm_ctc_streaming_lookahead0.32 \\
        --cuts test=data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
               recordings=data/full/test_long/cuts.jsonl.gz --history 2

The run's weights are those ``asr.decode`` chooses, run with eager attention on the parallel
masked pass at history ``--history`` (the query outputs a chunk-by-chunk decoder with that
history computes), each cut's features computed per chunk from its audio as the model is
trained and decoded. Query frame i of an utterance (over all its chunks, in order) reads
the speech embedding of row i: its *own* speech. For every layer and head, the key a query
attends to most is taken, and the table counts, per set, kind of chunk and place in the
chunk: the share of queries whose most-attended key is a speech position (``speech``), the
share whose most-attended key is their own speech or a neighbour (row i +- 1,
``own_pm1``), and the mean signed distance in rows from the own speech to that key over
the queries whose key is speech (``offset``; negative: earlier speech).

Kinds of chunk: ``first`` (a stream's first chunk, full), ``later`` (a full chunk after
it, which in a long input starts inside speech), ``partial`` (a last chunk with fewer
frames than a full one: its queries stand T_b < A positions after their speech, where a
full chunk's stand A). Places: the chunk's first ``--edge`` query frames, its last
``--edge`` frames, and the frames between (``middle``); a frame in both edges counts as
``first``. The offline readouts' attention is ``local.query_attention``'s.

A forward pass holds every layer's (heads, L, L) probabilities of its ``--batch``
utterances at once (L: the prompt and twice the speech frames of the longest): for a
large LLM or long recordings, ``--batch 1``.
"""

from __future__ import annotations

import argparse
import collections
import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from asr.atomic_io import write_text_atomically

COLUMNS = ("set", "kind", "place", "layer", "head", "queries", "speech", "own_pm1", "offset")
KINDS = ("first", "later", "partial")
PLACES = ("first", "middle", "last")


def chunk_kind(chunk: int, frames: int, full_frames: int) -> str:
    """``partial`` for a chunk of fewer query frames than a full one, else ``first`` for
    chunk 0 and ``later`` after it."""
    if frames < full_frames:
        return "partial"
    return "first" if chunk == 0 else "later"


def place_in_chunk(frame: int, frames: int, edge: int) -> str:
    """``first`` for the chunk's first ``edge`` frames, ``last`` for its last ``edge``
    (when not also among the first), ``middle`` between."""
    if frame < edge:
        return "first"
    return "last" if frame >= frames - edge else "middle"


def streaming_attention(model, features: torch.Tensor, feature_lens: torch.Tensor, history: int,
                        chunk_seconds: int = 2) -> Tuple[List[torch.Tensor], list]:
    """Per layer (N, H, L, L) attention probabilities of the parallel masked pass at
    ``history`` seconds (the model built with eager attention), and the layouts."""
    from llm_ctc.streaming.encoder import streaming_speech_embeddings
    from llm_ctc.streaming.llm import parallel_inputs

    speech, layouts = streaming_speech_embeddings(model, features, feature_lens, history, chunk_seconds)
    inputs, mask, positions = parallel_inputs(model, speech, layouts, history)
    out = model.llm(inputs_embeds=inputs, attention_mask=mask, position_ids=positions, output_attentions=True)
    if out.attentions is None or any(weights is None for weights in out.attentions):
        raise ValueError("the LLM returned no attention probabilities: build it with attn_implementation 'eager'")
    return list(out.attentions), layouts


def count_queries(attentions: Sequence[torch.Tensor], layouts: Sequence, full_frames: int, edge: int,
                  counts: Optional[Dict[tuple, List[float]]] = None) -> Dict[tuple, List[float]]:
    """Add each query's most-attended key to ``counts``: (kind, place, layer, head) ->
    [queries, speech keys, own +- 1 keys, sum of signed offsets of the speech keys]."""
    counts = collections.defaultdict(lambda: [0, 0, 0, 0]) if counts is None else counts
    for n, layout in enumerate(layouts):
        speech_row = torch.tensor(layout.speech_index)  # -1 off speech
        query_positions = torch.tensor(layout.query_positions)
        labels = []
        for chunk, frames in enumerate(layout.chunk_lens):
            kind = chunk_kind(chunk, frames, full_frames)
            labels += [(kind, place_in_chunk(j, frames, edge)) for j in range(frames)]
        own = torch.arange(len(labels))
        for layer, weights in enumerate(attentions):
            best = weights[n][:, query_positions, :layout.length].argmax(dim=-1)  # (H, T_n)
            rows = speech_row[best]
            on_speech = rows >= 0
            near = on_speech & ((rows - own[None]).abs() <= 1)
            offset = torch.where(on_speech, rows - own[None], 0)
            for head in range(best.shape[0]):
                for i, (kind, place) in enumerate(labels):
                    entry = counts[kind, place, layer, head]
                    entry[0] += 1
                    entry[1] += int(on_speech[head, i])
                    entry[2] += int(near[head, i])
                    entry[3] += int(offset[head, i])
    return counts


def table_rows(name: str, counts: Dict[tuple, List[float]]) -> List[str]:
    """The TSV rows of one set, in kind, place, layer, head order."""
    lines = []
    order = sorted(counts, key=lambda k: (KINDS.index(k[0]), PLACES.index(k[1]), k[2], k[3]))
    for kind, place, layer, head in order:
        queries, speech, near, offsets = counts[kind, place, layer, head]
        mean = offsets / speech if speech else float("nan")
        lines.append(f"{name}\t{kind}\t{place}\t{layer}\t{head}\t{queries}\t{speech / queries:.3f}\t"
                     f"{near / queries:.3f}\t{mean:+.2f}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", type=Path, help="a streaming LLM-CTC run (model.streaming true)")
    parser.add_argument("--cuts", nargs="+", required=True, metavar="NAME=MANIFEST",
                        help="named cut manifests with recordings, e.g. test=cuts.jsonl.gz")
    parser.add_argument("--history", type=int, default=2, help="history h in seconds (default 2)")
    parser.add_argument("--edge", type=int, default=6, help="query frames at each end of a chunk (default 6)")
    parser.add_argument("--batch", type=int, default=4, help="utterances per forward pass")
    parser.add_argument("--output", type=Path, help="also write the table here (TSV)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if args.history < 0 or args.edge < 1 or args.batch < 1:
        raise SystemExit(f"ERROR: --history must be >= 0, --edge and --batch >= 1; got {args.history}, "
                         f"{args.edge} and {args.batch}")
    sets = []
    for spec in args.cuts:
        name, _, path = spec.partition("=")
        if not name or not path:
            raise SystemExit(f"ERROR: --cuts takes NAME=MANIFEST, got {spec!r}")
        sets.append((name, path))
    from asr.chunk_features import PerChunkFeatures
    from asr.data import load_cuts_lazy
    from llm_ctc.streaming.layout import TICKS_PER_SECOND
    from local.boundary_repeats import load_streaming_run

    try:
        model = load_streaming_run(args.exp_dir, attn_implementation="eager")[0].eval()
        cut_sets = [(name, list(load_cuts_lazy(path, "--cuts"))) for name, path in sets]
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    per_chunk = PerChunkFeatures(model.chunk_seconds)
    full_frames = model.grid.count(model.chunk_seconds * TICKS_PER_SECOND)
    lines = ["\t".join(COLUMNS)]
    for name, cuts in cut_sets:
        counts = None
        for start in range(0, len(cuts), args.batch):
            group = cuts[start:start + args.batch]
            feats = [per_chunk.cut_features(cut) for cut in group]
            lens = torch.tensor([f.shape[0] for f in feats])
            with torch.inference_mode():
                attentions, layouts = streaming_attention(model, torch.nn.utils.rnn.pad_sequence(feats, batch_first=True),
                                                          lens, args.history, model.chunk_seconds)
            counts = count_queries(attentions, layouts, full_frames, args.edge, counts)
            logging.info("%s: %d of %d cuts", name, min(start + args.batch, len(cuts)), len(cuts))
        lines += table_rows(name, counts)
    print("\n".join(lines))
    if args.output:
        write_text_atomically(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
