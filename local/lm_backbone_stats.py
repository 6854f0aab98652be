"""What a causal LM does to its input, read as an LLM-CTC backbone (Sec. 4.2): how large
its layers' contributions to the residual stream are against an input embedding, and
whether its frozen head names the *current* or the *next* token of a text fed as tokens
(egs/mini RESULTS.md, "The projector's learning rate").

    python -m local.lm_backbone_stats data/full/tiny_qwen3 \\
        data/full/manifests/librispeech_supervisions_test-clean.jsonl.gz --num-texts 100

Each of the first ``--num-texts`` transcripts (lower-cased, as stage 7 trains on them)
runs as ``EOS t`` through the LM; position 0 (the EOS every sequence starts with) is left
out of every mean. Printed, as a tab-separated table:

- the mean norm of the input embeddings, and per layer k of its attention output, its MLP
  output and the residual stream after it (each output is what the layer adds: residual
  after k = residual before k + attention + MLP);
- over the full head (every row, as LLM-CTC's frozen head reads it): the share of
  positions whose largest logit names the token at that position (``current``) and the
  token after it (``next``, over the positions that have one);
- the share of the texts' tokens whose bare embedding, through the final norm and the
  head, names itself (``bare_embedding_names_itself``): what a speech embedding placed
  where the token's embedding lies would be read as, before any layer adds to it.

A backbone whose layers add many times an embedding's norm and whose head names the next
token is one where the speech embeddings must outweigh the layers' guess (or LoRA must
turn it) before LLM-CTC can name what was said.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, List, Sequence

import torch


def backbone_stats(model, token_ids: List[List[int]], eos: int) -> Dict[str, float]:
    """The statistics of the module docstring for texts given as token ids (no EOS)."""
    layers = model.model.layers
    outputs: Dict[str, List[torch.Tensor]] = {}

    def keep(name):
        def hook(module, inputs, output):
            value = output[0] if isinstance(output, tuple) else output
            outputs.setdefault(name, []).append(value[0, 1:].detach())  # batch of one, position 0 left out
        return hook

    handles = []
    for k, layer in enumerate(layers):
        handles.append(layer.self_attn.register_forward_hook(keep(f"layer{k}_attention")))
        handles.append(layer.mlp.register_forward_hook(keep(f"layer{k}_mlp")))
        handles.append(layer.register_forward_hook(keep(f"layer{k}_residual")))
    head = model.get_output_embeddings().weight.detach()
    current = following = positions = following_positions = 0
    embeddings = []
    try:
        with torch.no_grad():
            for ids in token_ids:
                if not ids:
                    continue
                inputs = torch.tensor([[eos] + list(ids)])
                embeddings.append(model.get_input_embeddings()(inputs)[0, 1:])
                hidden = model.model(input_ids=inputs).last_hidden_state[0, 1:]
                named = (hidden @ head.t()).argmax(-1)
                target = inputs[0, 1:]
                current += int((named == target).sum())
                following += int((named[:-1] == target[1:]).sum())
                positions += len(ids)
                following_positions += len(ids) - 1
    finally:
        for handle in handles:
            handle.remove()
    if positions == 0:
        raise ValueError("no tokens to read: every text is empty")
    stats = {"embedding": float(torch.cat(embeddings).norm(dim=-1).mean())}
    for name, values in outputs.items():
        stats[name] = float(torch.cat(values).norm(dim=-1).mean())
    stats["current"] = current / positions
    stats["next"] = following / max(following_positions, 1)
    with torch.no_grad():
        tokens = torch.tensor(sorted({t for ids in token_ids for t in ids}))
        bare = model.model.norm(model.get_input_embeddings()(tokens)) @ head.t()
    stats["bare_embedding_names_itself"] = float((bare.argmax(-1) == tokens).double().mean())
    return stats


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lm_dir", type=Path, help="a causal LM folder (save_pretrained) with its tokenizer")
    parser.add_argument("manifests", type=Path, nargs="+", help="Lhotse supervision manifests (.jsonl.gz)")
    parser.add_argument("--num-texts", type=int, default=100, help="the first N transcripts (default 100)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    if args.num_texts < 1:
        raise SystemExit(f"ERROR: --num-texts must be at least 1, got {args.num_texts}")
    if not (args.lm_dir / "config.json").is_file():
        raise SystemExit(f"ERROR: lm_dir {args.lm_dir}: no config.json (a save_pretrained folder expected)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from local.pretrain_tiny_lm import read_transcripts

    torch.set_num_threads(max(1, args.threads))
    tokenizer = AutoTokenizer.from_pretrained(args.lm_dir)
    model = AutoModelForCausalLM.from_pretrained(args.lm_dir).eval()
    texts = read_transcripts(args.manifests)[:args.num_texts]
    token_ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    stats = backbone_stats(model, token_ids, tokenizer.eos_token_id)
    print(f"# {args.lm_dir}: {len(texts)} texts, {sum(map(len, token_ids))} tokens")
    print("statistic\tvalue")
    for name, value in stats.items():
        print(f"{name}\t{value:.4f}")


if __name__ == "__main__":
    main()
