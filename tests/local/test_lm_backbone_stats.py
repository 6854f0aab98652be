"""local.lm_backbone_stats against references computed another way: the model's own
logits and hidden states (transformers' forward, no hooks), the final norm removed for the
last residual, and layers whose outputs are zeroed."""

import argparse

import pytest
import torch

pytest.importorskip("transformers")

from local.lm_backbone_stats import backbone_stats, main  # noqa: E402
from local.pretrain_tiny_lm import tiny_qwen3  # noqa: E402

VOCAB = 60
EOS = 0


def tiny_lm(layers=3):
    torch.manual_seed(0)
    return tiny_qwen3(argparse.Namespace(hidden=16, layers=layers, heads=2), vocab_size=VOCAB).eval()


def texts():
    generator = torch.Generator().manual_seed(1)
    drawn = [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in (5, 1, 9, 4)]
    return drawn + [[7, 7, 7, 7, 3, 3]]  # repeats: positions where the current token is also the next


def test_current_and_next_are_the_shares_the_models_own_logits_give():
    model = tiny_lm()
    stats = backbone_stats(model, texts(), EOS)
    current = following = positions = following_positions = 0
    with torch.no_grad():
        for ids in texts():
            named = model(input_ids=torch.tensor([[EOS] + ids])).logits[0, 1:].argmax(-1).tolist()
            current += sum(a == b for a, b in zip(named, ids))
            following += sum(a == b for a, b in zip(named[:-1], ids[1:]))
            positions += len(ids)
            following_positions += len(ids) - 1
    assert stats["current"] == current / positions
    assert stats["next"] == following / following_positions


def test_residual_norms_are_those_of_the_hidden_states():
    model = tiny_lm()
    stats = backbone_stats(model, texts(), EOS)
    per_layer = [[] for _ in range(3)]
    embeddings = []
    with torch.no_grad():
        for ids in texts():
            out = model.model(input_ids=torch.tensor([[EOS] + ids]), output_hidden_states=True)
            embeddings.append(out.hidden_states[0][0, 1:])
            for k in range(2):  # the last entry of hidden_states is after the final norm
                per_layer[k].append(out.hidden_states[k + 1][0, 1:])
        model.model.norm = torch.nn.Identity()  # the last layer's residual, before the final norm
        for ids in texts():
            per_layer[2].append(model.model(input_ids=torch.tensor([[EOS] + ids])).last_hidden_state[0, 1:])
    assert stats["embedding"] == pytest.approx(float(torch.cat(embeddings).norm(dim=-1).mean()), rel=1e-6)
    for k in range(3):
        reference = float(torch.cat(per_layer[k]).norm(dim=-1).mean())
        assert stats[f"layer{k}_residual"] == pytest.approx(reference, rel=1e-5), k


def test_layers_that_add_nothing_leave_the_embedding_and_name_the_current_token_as_the_bare_embedding_does():
    model = tiny_lm(layers=2)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    stats = backbone_stats(model, texts(), EOS)
    for k in range(2):
        assert stats[f"layer{k}_attention"] == 0 and stats[f"layer{k}_mlp"] == 0
        assert stats[f"layer{k}_residual"] == pytest.approx(stats["embedding"], rel=1e-6)
    # Reference for the bare embedding: each token alone through the final norm and the head.
    tokens = sorted({t for ids in texts() for t in ids})
    with torch.no_grad():
        head = model.lm_head.weight
        names_itself = {t: int((model.model.norm(model.model.embed_tokens.weight[t]) @ head.t()).argmax()) == t
                        for t in tokens}
    assert stats["bare_embedding_names_itself"] == pytest.approx(sum(names_itself.values()) / len(tokens))
    positions = [t for ids in texts() for t in ids]
    assert stats["current"] == pytest.approx(sum(names_itself[t] for t in positions) / len(positions))


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(SystemExit, match="--num-texts must be at least 1"):
        main([str(tmp_path), str(tmp_path / "s.jsonl.gz"), "--num-texts", "0"])
    with pytest.raises(SystemExit, match="no config.json"):
        main([str(tmp_path), str(tmp_path / "s.jsonl.gz")])
    with pytest.raises(ValueError, match="every text is empty"):
        backbone_stats(tiny_lm(layers=1), [[], []], EOS)
