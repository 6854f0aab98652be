"""Where the readout positions of a trained LLM-CTC model attend (Sec. 4.2, Fig. 1): a
picture and a table, for the diagnosis of the query readout (egs/mini RESULTS.md, "Why the
query readout learns slowly").

    python -m local.query_attention --exp-dir exp/full_llm_ctc_query \\
        --cuts data/full/fbank/librispeech_cuts_test-clean.jsonl.gz --output-dir exp/full_llm_ctc_query/attention

The model of ``--exp-dir`` (the weights ``asr.decode`` would choose) runs on the first
``--num-utterances`` cuts with eager attention, and every layer's attention probabilities
are read at the readout positions: the T_n queries [P + T_n, P + 2 T_n) of the query
readout, or the T_n speech positions [P, P + T_n) of the speech readout. For readout
frame t (0-based) the key that holds frame t's speech is P + t in both.

Writes ``attention.png`` (rows: utterances; columns: layers; each panel the attention of
frame t's readout position (y) over every key position (x), averaged over the heads, with
the prompt / speech / query boundaries drawn) and ``attention.tsv`` (per layer and head,
averaged over frames and utterances: the mass on the prompt, on all speech, on frame t's
own speech position +-1 (and what uniform attention over the visible keys would put
there: chance) and +-3, and on the queries; and the mean distance from the most attended
speech key to t). A readout that has learned to find its speech puts most of
some head's mass within +-1 of t.

And ``contributions.tsv``: at the same readout positions, the mean norm of the input
(the projected speech, or q), of what each layer's attention and MLP add to the residual
stream, and of the residual after each layer. Naming the token heard at frame t needs
frame t's speech to outweigh what the layers bring from elsewhere (egs/mini RESULTS.md,
"What a stalled run looks like inside").
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from asr.atomic_io import write_text_atomically

COLUMNS = ("layer", "head", "prompt", "speech", "own_pm1", "own_pm1_uniform", "own_pm3", "queries",
           "argmax_distance")


def readout_attention(model, features: torch.Tensor, feature_lens: torch.Tensor):
    """Per layer (N, H, T max, L) attention of the readout positions, the (N,) T_n, the
    readout starts (N,), P, and L."""
    from llm_ctc.language_model import kv_cache_name  # noqa: F401 (the backbone's transformers)
    from llm_ctc.sequence import build_sequences

    speech, lens = model.speech_embeddings(features, feature_lens)
    prompt = model.embed_tokens(torch.tensor(model.prompt_ids, dtype=torch.long, device=model.device))
    query = None if model.query is None else model.query.to(speech.dtype)
    batch = build_sequences(prompt, speech, lens, query=query)
    out = model.llm(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, output_attentions=True)
    starts = batch.tail_start if query is not None else torch.full_like(lens, batch.speech_start)
    rows = torch.arange(int(lens.max()))[None, :] + starts[:, None]
    rows = rows.clamp(max=batch.inputs_embeds.shape[1] - 1)
    layers = []
    for weights in out.attentions:  # (N, H, L, L)
        index = rows[:, None, :, None].expand(-1, weights.shape[1], -1, weights.shape[3])
        layers.append(torch.gather(weights, 2, index))
    return layers, lens, starts, batch.speech_start, batch.inputs_embeds.shape[1]


def decoder_layers(backbone: torch.nn.Module) -> torch.nn.ModuleList:
    """The backbone's decoder layers, through any LoRA or causal-LM wrapper."""
    for module in backbone.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return layers
    raise ValueError(f"no decoder layers found in {type(backbone).__name__}")


def readout_contributions(model, features: torch.Tensor, feature_lens: torch.Tensor) -> List[Tuple[str, float, int]]:
    """(component, sum of norms, count) at the readout positions of every utterance: the
    input, then per layer k its attention output, MLP output and the residual after it."""
    from llm_ctc.sequence import build_sequences

    speech, lens = model.speech_embeddings(features, feature_lens)
    prompt = model.embed_tokens(torch.tensor(model.prompt_ids, dtype=torch.long, device=model.device))
    query = None if model.query is None else model.query.to(speech.dtype)
    batch = build_sequences(prompt, speech, lens, query=query)
    starts = batch.tail_start if query is not None else torch.full_like(lens, batch.speech_start)
    rows = torch.arange(int(lens.max()))[None, :] + starts[:, None]
    valid = torch.arange(int(lens.max()))[None, :] < lens[:, None]
    rows = rows.clamp(max=batch.inputs_embeds.shape[1] - 1)
    outputs = {}

    def keep(name):
        def hook(module, inputs, output):
            outputs[name] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    names, handles = [], []
    for k, layer in enumerate(decoder_layers(model.llm)):
        for part, module in (("attention", layer.self_attn), ("mlp", layer.mlp), ("residual", layer)):
            names.append(f"layer{k + 1}_{part}")
            handles.append(module.register_forward_hook(keep(names[-1])))
    try:
        model.llm(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids)
    finally:
        for handle in handles:
            handle.remove()
    table = []
    for name, values in [("input", batch.inputs_embeds)] + [(name, outputs[name]) for name in names]:
        picked = torch.gather(values, 1, rows[:, :, None].expand(-1, -1, values.shape[-1]))
        norms = picked.double().norm(dim=-1)[valid]
        table.append((name, float(norms.sum()), int(norms.numel())))
    return table


def attention_table(layers: List[torch.Tensor], lens: torch.Tensor, starts: torch.Tensor, prompt_len: int) -> List[dict]:
    """The rows of attention.tsv (see the module docstring)."""
    rows = []
    for layer, weights in enumerate(layers):
        for head in range(weights.shape[1]):
            sums = {name: 0.0 for name in COLUMNS[2:]}
            frames = 0
            for n in range(weights.shape[0]):
                length = int(lens[n])
                w = weights[n, head, :length].double()  # (T_n, L)
                t = torch.arange(length)
                keys = torch.arange(w.shape[1])
                speech_keys = (keys >= prompt_len) & (keys < prompt_len + length)
                distance = (keys[None, :] - prompt_len - t[:, None]).abs()
                sums["prompt"] += float(w[:, :prompt_len].sum())
                sums["speech"] += float(w[:, speech_keys].sum())
                sums["own_pm1"] += float((w * ((distance <= 1) & speech_keys[None, :])).sum())
                sums["own_pm3"] += float((w * ((distance <= 3) & speech_keys[None, :])).sum())
                # The same mass under uniform causal attention: chance level.
                visible = keys[None, :] <= (int(starts[n]) + t)[:, None]
                near = ((distance <= 1) & speech_keys[None, :] & visible).sum(1).double()
                sums["own_pm1_uniform"] += float((near / visible.sum(1)).sum())
                query_keys = keys >= int(starts[n]) if int(starts[n]) > prompt_len else torch.zeros_like(speech_keys)
                sums["queries"] += float(w[:, query_keys].sum())
                best = w[:, prompt_len:prompt_len + length].argmax(dim=1)
                sums["argmax_distance"] += float((best - t).abs().double().sum())
                frames += length
            rows.append({"layer": layer, "head": head, **{k: v / frames for k, v in sums.items()}})
    return rows


def plot(layers: List[torch.Tensor], lens: torch.Tensor, starts: torch.Tensor, prompt_len: int, texts: Sequence[str],
         title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count, depth = layers[0].shape[0], len(layers)
    figure, axes = plt.subplots(count, depth, figsize=(4.2 * depth, 3.2 * count), squeeze=False)
    for n in range(count):
        length, start = int(lens[n]), int(starts[n])
        end = start + length if start > prompt_len else prompt_len + length
        for layer in range(depth):
            ax = axes[n][layer]
            image = layers[layer][n, :, :length, :end].mean(dim=0).float().numpy()
            ax.imshow(image, aspect="auto", cmap="viridis", vmin=0.0, vmax=max(float(image.max()), 1e-6),
                      interpolation="nearest")
            ax.plot([prompt_len + t for t in range(length)], list(range(length)), color="red", linewidth=0.6,
                    linestyle=":")  # frame t's own speech position
            for boundary in sorted({prompt_len, prompt_len + length, start}):
                ax.axvline(boundary - 0.5, color="white", linewidth=0.8)
            ax.set_title(f"utterance {n + 1}, layer {layer + 1}", fontsize=9)
            ax.set_xlabel("key position (prompt | speech | queries)", fontsize=8)
            ax.set_ylabel("readout frame t", fontsize=8)
        axes[n][0].text(0, -0.25 * length, texts[n][:70], fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    partial = path.with_name(path.name + ".partial.png")
    figure.savefig(partial, dpi=110)
    plt.close(figure)
    partial.replace(path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exp-dir", type=Path, required=True, help="an LLM-CTC run's experiment folder")
    parser.add_argument("--cuts", type=Path, required=True, help="a cut manifest with features (.jsonl.gz)")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--num-utterances", type=int, default=3, help="utterances in the picture")
    parser.add_argument("--table-utterances", type=int, default=50, help="utterances in the table")
    parser.add_argument("--iter", default=None, help="decode.iter (default: the run's decode section)")
    parser.add_argument("--avg", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    from asr.data import load_cuts_lazy
    from asr.weights import build_trained_model, choose_weights, load_lexicon, saved_run_config

    overrides = [f"decode.{key}={value}" for key, value in (("iter", args.iter), ("avg", args.avg)) if value is not None]
    try:
        config = saved_run_config(args.exp_dir, overrides)
        if config.family != "llm_ctc":
            raise ValueError(f"--exp-dir {args.exp_dir} holds a {config.family} run, not an LLM-CTC one")
        if config.model.objective != "ctc" or config.model.streaming:
            raise ValueError(f"--exp-dir {args.exp_dir}: an offline LLM-CTC run is needed "
                             f"(objective {config.model.objective!r}, streaming {config.model.streaming}; a streaming "
                             f"run's queries: python -m local.streaming_query_attention)")
        cuts = list(load_cuts_lazy(args.cuts, "--cuts").subset(first=max(args.num_utterances,
                                                                         args.table_utterances)))
        weights = choose_weights(args.exp_dir, config.decode)
        weights.saved.model.attn_implementation = "eager"  # attention probabilities are returned
        model = build_trained_model(weights, load_lexicon(weights.saved.train.lang_dir, weights.saved))
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    args.output_dir.mkdir(parents=True, exist_ok=True)
    table, pictures, contributions = [], None, None
    for start in range(0, len(cuts), 10):
        group = cuts[start:start + 10]
        feats = [torch.from_numpy(cut.load_features()) for cut in group]
        lens = torch.tensor([f.shape[0] for f in feats])
        features = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        with torch.no_grad():
            layers, speech_lens, starts, prompt_len, _ = readout_attention(model, features, lens)
            parts = readout_contributions(model, features, lens)
        contributions = parts if contributions is None else [
            (name, total + more, count + extra) for (name, total, count), (_, more, extra) in zip(contributions, parts)]
        table.append((attention_table(layers, speech_lens, starts, prompt_len), int(speech_lens.sum())))
        if pictures is None:
            pictures = ([w[:args.num_utterances] for w in layers], speech_lens[:args.num_utterances],
                        starts[:args.num_utterances], prompt_len, [c.supervisions[0].text for c in group])
    merged = []
    for index, row in enumerate(table[0][0]):
        total = sum(frames for _, frames in table)
        merged.append({**row, **{k: sum(rows[index][k] * frames for rows, frames in table) / total
                                 for k in COLUMNS[2:]}})
    lines = ["\t".join(COLUMNS)] + ["\t".join(str(r[c]) if c in ("layer", "head") else f"{r[c]:.3f}" for c in COLUMNS)
                                    for r in merged]
    write_text_atomically(args.output_dir / "attention.tsv", "\n".join(lines) + "\n")
    norms = ["component\tmean_norm"] + [f"{name}\t{total / count:.3f}" for name, total, count in contributions]
    write_text_atomically(args.output_dir / "contributions.tsv", "\n".join(norms) + "\n")
    readout = config.model.readout
    plot(*pictures, title=f"{readout} readout, {args.exp_dir.name}/{weights.paths[-1].name} (avg {weights.avg}):\n"
         "attention of frame t's readout position, mean over heads; red dots: frame t's own speech position",
         path=args.output_dir / "attention.png")
    print("\n".join(lines + [""] + norms))
    logging.info("wrote %s, %s and %s", args.output_dir / "attention.tsv", args.output_dir / "contributions.tsv",
                 args.output_dir / "attention.png")


if __name__ == "__main__":
    main()
