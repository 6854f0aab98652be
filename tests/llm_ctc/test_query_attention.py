"""local.query_attention: the attention it reads at the readout positions is the eager
attention of each utterance run alone (the definition, unpadded), its table's masses
are the sums the docstring names, checked on attention maps built by hand, and its
contributions are the norms of each utterance's own hidden states (transformers'
``output_hidden_states``, no hooks)."""

import dataclasses

import pytest
import torch

from local.query_attention import attention_table, decoder_layers, main, readout_attention, readout_contributions
from references.tiny_llm import random_features


@pytest.fixture(scope="module")
def eager_models(ctc_config, qwen3_tokenizer):
    from llm_ctc.model import LLMCTCModel

    models = {}
    for readout in ("query", "speech"):
        torch.manual_seed(7)
        config = dataclasses.replace(ctc_config, readout=readout, attn_implementation="eager")
        models[readout] = LLMCTCModel(config, tokenizer=qwen3_tokenizer).eval()
    return models


@pytest.mark.parametrize("readout", ["query", "speech"])
def test_readout_rows_are_the_attention_of_each_utterance_alone(readout, eager_models):
    model = eager_models[readout]
    features, lens = random_features([90, 41, 66], seed=1)
    with torch.no_grad():
        layers, speech_lens, starts, prompt_len, _ = readout_attention(model, features, lens)
        for n in range(3):
            alone, alone_lens, alone_starts, _, width = readout_attention(model, features[n:n + 1, :int(lens[n])],
                                                                          lens[n:n + 1])
            length = int(alone_lens[0])
            assert length == int(speech_lens[n]) and int(alone_starts[0]) == int(starts[n])
            for layer, weights in enumerate(layers):
                torch.testing.assert_close(weights[n, :, :length, :width], alone[layer][0, :, :length],
                                           rtol=1e-5, atol=1e-6)
                assert torch.all(weights[n, :, :length, width:] == 0)  # padding is never attended
                torch.testing.assert_close(weights[n, :, :length].sum(-1), torch.ones(weights.shape[1], length))
    expected_start = prompt_len + speech_lens if readout == "query" else torch.full_like(speech_lens, prompt_len)
    assert starts.tolist() == expected_start.tolist()


@pytest.mark.parametrize("readout", ["query", "speech"])
def test_contributions_are_the_norms_of_each_utterance_alone(readout, eager_models):
    from llm_ctc.sequence import build_sequences

    model = eager_models[readout]
    features, lens = random_features([90, 41, 66], seed=2)
    with torch.no_grad():
        table = readout_contributions(model, features, lens)
        depth = len(decoder_layers(model.llm))
        sums = {name: 0.0 for name, _, _ in table}
        frames = 0
        final_norm = model.llm.get_base_model().norm if hasattr(model.llm, "get_base_model") else model.llm.norm
        for n in range(3):
            speech, speech_lens = model.speech_embeddings(features[n:n + 1, :int(lens[n])], lens[n:n + 1])
            prompt = model.embed_tokens(torch.tensor(model.prompt_ids, dtype=torch.long))
            query = None if model.query is None else model.query
            batch = build_sequences(prompt, speech, speech_lens, query=query)
            length = int(speech_lens[0])
            start = batch.speech_start + (length if query is not None else 0)
            rows = slice(start, start + length)
            states = model.llm(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                               position_ids=batch.position_ids, output_hidden_states=True).hidden_states
            sums["input"] += float((speech[0] if query is None else query.expand(length, -1)).double().norm(dim=-1).sum())
            for k in range(depth - 1):  # the last hidden state is after the final norm
                sums[f"layer{k + 1}_residual"] += float(states[k + 1][0, rows].double().norm(dim=-1).sum())
            identity = torch.nn.Identity()
            holder = model.llm.get_base_model() if hasattr(model.llm, "get_base_model") else model.llm
            holder.norm = identity
            try:
                last = model.llm(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                                 position_ids=batch.position_ids).last_hidden_state
            finally:
                holder.norm = final_norm
            sums[f"layer{depth}_residual"] += float(last[0, rows].double().norm(dim=-1).sum())
            frames += length
    assert [name for name, _, _ in table] == ["input"] + [f"layer{k}_{part}" for k in range(1, depth + 1)
                                                         for part in ("attention", "mlp", "residual")]
    for name, total, count in table:
        assert count == frames
        if name == "input" or name.endswith("residual"):
            assert total == pytest.approx(sums[name], rel=1e-5), name
        else:
            assert total > 0, name


def test_table_masses_follow_their_definitions():
    prompt_len, length = 2, 5
    width = prompt_len + 2 * length
    own = torch.zeros(1, 3, length, width)  # head 0: frame t's own speech; 1: the prompt; 2: t+2 and queries
    for t in range(length):
        own[0, 0, t, prompt_len + t] = 1.0
        own[0, 1, t, 0] = 1.0
        own[0, 2, t, prompt_len + min(t + 2, length - 1)] = 0.5
        own[0, 2, t, prompt_len + length + t] = 0.5
    rows = attention_table([own], torch.tensor([length]), torch.tensor([prompt_len + length]), prompt_len)
    head0, head1, head2 = rows
    assert head0["own_pm1"] == pytest.approx(1.0) and head0["speech"] == pytest.approx(1.0)
    assert head0["argmax_distance"] == pytest.approx(0.0)
    # Chance: frame t's query at prompt_len + length + t sees that many + 1 keys, 2 or 3 of them near t.
    near = [sum(1 for k in range(prompt_len, prompt_len + length) if abs(k - prompt_len - t) <= 1)
            for t in range(length)]
    uniform = sum(c / (prompt_len + length + t + 1) for t, c in enumerate(near)) / length
    assert head0["own_pm1_uniform"] == pytest.approx(uniform) and head1["own_pm1_uniform"] == pytest.approx(uniform)
    assert head1["prompt"] == pytest.approx(1.0) and head1["speech"] == pytest.approx(0.0)
    distances = [abs(min(t + 2, length - 1) - t) for t in range(length)]
    assert head2["own_pm1"] == pytest.approx(0.5 * sum(d <= 1 for d in distances) / length)
    assert head2["own_pm3"] == pytest.approx(0.5)
    assert head2["queries"] == pytest.approx(0.5)
    assert head2["argmax_distance"] == pytest.approx(sum(distances) / length)


def test_refuses_a_zipformer_run(tmp_path):
    import torch as _torch

    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    from asr.config import RunConfig

    _torch.save({"config": RunConfig().to_dict(), "model": {}, "batch_idx_train": 1}, exp_dir / "epoch-1.pt")
    with pytest.raises(SystemExit, match="not an LLM-CTC one"):
        main(["--exp-dir", str(exp_dir), "--cuts", str(tmp_path / "none.jsonl.gz"), "--output-dir", str(tmp_path)])
