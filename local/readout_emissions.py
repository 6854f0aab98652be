"""Where the query readout emits the tokens the speech readout emits (Sec. 4.2), for the
diagnosis of the query readout's deletions (egs/mini RESULTS.md, "Where the query
readout's lost tokens are").

    python -m local.readout_emissions --speech-exp-dir exp/full_llm_ctc_speech_top3 \\
        --query-exp-dir exp/full_llm_ctc_query_top3 \\
        --cuts data/full/fbank/librispeech_cuts_test-clean.jsonl.gz data/full/fbank/librispeech_cuts_dev-clean.jsonl.gz

Both runs (the weights ``asr.decode`` would choose; the same encoder frame rate, so the
same T_n) read the same cuts. A token the speech readout emits is the first frame of a
run of one non-blank class in its frame argmax (what CTC's collapse keeps). For each, in
the query readout's frame argmax: the nearest frame emitting the same class, as a signed
offset from the speech readout's frame (none if the query readout never emits it in that
utterance); the largest attention probability that any query position's head in the
last LLM layer puts on the token's speech position P + t (exactly, and on P + t +- 1);
the query readout's largest log-probability of the token over the utterance, and its
largest margin over blank at one frame.

Prints the offsets by fifth of the utterance, then the tokens the query readout never
emits beside those it does: whether a query reads their speech position (the attention)
and how near the token came to being emitted (the log-probabilities).
"""

from __future__ import annotations

import argparse
import collections
import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def ctc_emissions(frame_ids: Sequence[int], blank: int) -> List[Tuple[int, int]]:
    """(frame, class) of the first frame of every run of one non-blank class."""
    emitted, previous = [], blank
    for frame, label in enumerate(int(i) for i in frame_ids):
        if label != blank and label != previous:
            emitted.append((frame, label))
        previous = label
    return emitted


def nearest_offset(frame_ids: torch.Tensor, frame: int, label: int) -> Optional[int]:
    """Signed offset from ``frame`` to the nearest frame whose argmax is ``label`` (the
    earlier one on a tie), None if there is none."""
    hits = (frame_ids == label).nonzero().flatten() - frame
    if hits.numel() == 0:
        return None
    distance = hits.abs() * 2 + (hits > 0).long()  # on equal distance the earlier frame first
    return int(hits[distance.argmin()])


def token_rows(speech_ids: torch.Tensor, query_log_probs: torch.Tensor, last_layer: torch.Tensor, length: int,
               prompt_len: int, blank: int) -> List[Dict[str, float]]:
    """One row per token the speech readout emits in one utterance: ``speech_ids`` (T,)
    its frame argmax, ``query_log_probs`` (T, V) the query readout's, ``last_layer``
    (H, T, L) the last layer's attention of the T query positions over the keys."""
    query_log_probs = query_log_probs[:length]
    query_ids = query_log_probs.argmax(dim=-1)
    attention = last_layer[:, :length].double()
    rows = []
    for frame, label in ctc_emissions(speech_ids[:length].tolist(), blank):
        key = prompt_len + frame
        near = slice(prompt_len + max(0, frame - 1), prompt_len + min(length, frame + 2))
        rows.append({
            "position": frame / length,
            "offset": nearest_offset(query_ids, frame, label),
            "attention_exact": float(attention[:, :, key].max()),
            "attention_pm1": float(attention[:, :, near].sum(dim=-1).max()),
            "log_prob": float(query_log_probs[:, label].max()),
            "margin_over_blank": float((query_log_probs[:, label] - query_log_probs[:, blank]).max()),
            "label": label,
        })
    return rows


def quantiles(values: Sequence[float]) -> str:
    ordered = sorted(values)
    return " / ".join(f"{ordered[round(q * (len(ordered) - 1))]:.2f}" for q in QUANTILES) if ordered else "-"


def summary(rows: List[Dict[str, float]], decode=None) -> List[str]:
    """The printed report (see the module docstring)."""
    lines = [f"tokens the speech readout emits: {len(rows)}; the query readout emits within +-3 frames: "
             f"{sum(1 for r in rows if r['offset'] is not None and abs(r['offset']) <= 3)}, elsewhere: "
             f"{sum(1 for r in rows if r['offset'] is not None and abs(r['offset']) > 3)}, never: "
             f"{sum(1 for r in rows if r['offset'] is None)}",
             "offset of the query readout's emission (frames, query - speech) by fifth of the utterance:",
             "fifth\ttokens\tnever\tmedian\t<=-6\t-5..-2\t-1..1\t2..5\t>=6"]
    for fifth in range(5):
        part = [r for r in rows if fifth <= r["position"] * 5 < fifth + 1 or (fifth == 4 and r["position"] * 5 >= 5)]
        found = sorted(r["offset"] for r in part if r["offset"] is not None)
        bins = collections.Counter(-2 if o <= -6 else -1 if o <= -2 else 0 if o <= 1 else 1 if o <= 5 else 2
                                   for o in found)
        median = found[len(found) // 2] if found else "-"
        lines.append(f"{fifth + 1}\t{len(part)}\t{len(part) - len(found)}\t{median}\t"
                     + "\t".join(str(bins[b]) for b in (-2, -1, 0, 1, 2)))
    lines.append(f"quantiles {' / '.join(str(q) for q in QUANTILES)}:")
    lines.append("tokens\tcount\tattention on P+t\ton P+t+-1\tlog p(token)\tlog p(token) - log p(blank)")
    for name, part in (("never emitted", [r for r in rows if r["offset"] is None]),
                       ("emitted", [r for r in rows if r["offset"] is not None])):
        lines.append(f"{name}\t{len(part)}\t" + "\t".join(quantiles([r[key] for r in part]) for key in
                                                       ("attention_exact", "attention_pm1", "log_prob",
                                                        "margin_over_blank")))
    if decode is not None:
        lines.append("never emitted: " + " ".join(repr(decode([r["label"]])) for r in rows if r["offset"] is None))
    return lines


def load_run(exp_dir: Path, eager: bool):
    from asr.weights import build_trained_model, choose_weights, load_lexicon, saved_run_config

    config = saved_run_config(exp_dir)
    if config.family != "llm_ctc" or config.model.objective != "ctc" or config.model.streaming:
        raise ValueError(f"{exp_dir} holds no offline LLM-CTC run (family {config.family})")
    weights = choose_weights(exp_dir, config.decode)
    if eager:
        weights.saved.model.attn_implementation = "eager"  # attention probabilities are returned
    return config, build_trained_model(weights, load_lexicon(weights.saved.train.lang_dir, weights.saved))


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speech-exp-dir", type=Path, required=True, help="an LLM-CTC run with the speech readout")
    parser.add_argument("--query-exp-dir", type=Path, required=True, help="an LLM-CTC run with the query readout")
    parser.add_argument("--cuts", type=Path, nargs="+", required=True, help="cut manifests with features")
    parser.add_argument("--batch", type=int, default=10, help="utterances per forward pass")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    from asr.data import load_cuts_lazy
    from local.query_attention import readout_attention

    try:
        speech_config, speech_model = load_run(args.speech_exp_dir, eager=False)
        query_config, query_model = load_run(args.query_exp_dir, eager=True)
        for option, config, readout in (("--speech-exp-dir", speech_config, "speech"),
                                        ("--query-exp-dir", query_config, "query")):
            if config.model.readout != readout:
                raise ValueError(f"{option} {config.train.exp_dir}: readout {config.model.readout!r}, "
                                 f"expected {readout!r}")
        cuts = [cut for path in args.cuts for cut in load_cuts_lazy(path, "--cuts")]
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    rows = []
    for start in range(0, len(cuts), args.batch):
        group = cuts[start:start + args.batch]
        feats = [torch.from_numpy(cut.load_features()) for cut in group]
        lens = torch.tensor([f.shape[0] for f in feats])
        features = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        with torch.no_grad():
            speech_log_probs, speech_lens = speech_model.log_probs(features, lens)
            query_log_probs, query_lens = query_model.log_probs(features, lens)
            layers, _, _, prompt_len, _ = readout_attention(query_model, features, lens)
        if not torch.equal(speech_lens, query_lens):
            raise SystemExit("ERROR: the two runs give different frame counts for the same cuts "
                             f"({speech_lens.tolist()} vs {query_lens.tolist()}): their encoders differ in rate")
        for n in range(len(group)):
            rows += token_rows(speech_log_probs[n].argmax(dim=-1), query_log_probs[n], layers[-1][n],
                               int(speech_lens[n]), prompt_len, speech_model.blank_id)
        logging.info("%d of %d cuts", min(start + args.batch, len(cuts)), len(cuts))
    print("\n".join(summary(rows, decode=query_model.decode_ids)))


if __name__ == "__main__":
    main()
