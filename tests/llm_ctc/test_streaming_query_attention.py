"""local.streaming_query_attention: the attention it reads is the eager attention of the
parallel masked pass (rows summing to one over the keys the mask of the definition shows,
nothing on the others, the same hidden states as the pass itself), and its counts follow
their definitions on attention maps built by hand."""

import dataclasses

import pytest
import torch

from llm_ctc.streaming.layout import FrameRateGrid, utterance_layout
from llm_ctc.streaming.mask import layout_tensors, visibility
from local.streaming_query_attention import (chunk_kind, count_queries, main, place_in_chunk, streaming_attention,
                                             table_rows)
from references.tiny_llm import random_features


def test_kinds_and_places_by_their_definitions():
    assert [chunk_kind(b, frames, 25) for b, frames in [(0, 25), (1, 25), (4, 25), (0, 7), (3, 24)]] == \
        ["first", "later", "later", "partial", "partial"]
    assert [place_in_chunk(j, 25, 6) for j in (0, 5, 6, 18, 19, 24)] == \
        ["first", "first", "middle", "middle", "last", "last"]
    assert [place_in_chunk(j, 7, 6) for j in range(7)] == ["first"] * 6 + ["last"]


def test_counts_of_attention_maps_built_by_hand():
    # 8 feature frames per embedding: chunks of 25, 25 and ceil(50 / 8) = 7 query frames.
    layout = utterance_layout(2, [200, 200, 50], FrameRateGrid(8))
    length, frames = layout.length, layout.num_frames
    speech_key = {row: k for k, row in enumerate(layout.speech_index) if row >= 0}
    weights = torch.zeros(1, 3, length, length)  # head 0: own speech; 1: own speech + 2; 2: the prompt
    for i, k in enumerate(layout.query_positions):
        weights[0, 0, k, speech_key[i]] = 0.9
        weights[0, 1, k, speech_key[min(i + 2, frames - 1)]] = 0.6
        weights[0, 2, k, 1] = 0.7
    counts = count_queries([weights], [layout], full_frames=25, edge=6)
    expected_queries = {("first", "first"): 6, ("first", "middle"): 13, ("first", "last"): 6,
                        ("later", "first"): 6, ("later", "middle"): 13, ("later", "last"): 6,
                        ("partial", "first"): 6, ("partial", "last"): 1}
    for (kind, place), queries in expected_queries.items():
        assert counts[kind, place, 0, 0] == [queries, queries, queries, 0]
        assert counts[kind, place, 0, 2] == [queries, 0, 0, 0]
    # Head 1: two rows later, except where the utterance's last rows clamp it (offset 1 at
    # frame 55, 0 at frame 56: the partial chunk's frames 5 and 6).
    assert counts["first", "last", 0, 1] == [6, 6, 0, 12]
    assert counts["partial", "first", 0, 1] == [6, 6, 1, 11]
    assert counts["partial", "last", 0, 1] == [1, 1, 1, 0]
    assert sum(entry[0] for key, entry in counts.items() if key[3] == 0) == frames
    rows = table_rows("x", counts)
    assert rows[0] == "x\tfirst\tfirst\t0\t0\t6\t1.000\t1.000\t+0.00"
    assert "x\tpartial\tfirst\t0\t1\t6\t1.000\t0.167\t+1.83" in rows
    assert "x\tfirst\tmiddle\t0\t2\t13\t0.000\t0.000\t+nan" in rows


@pytest.fixture(scope="module")
def eager_model(ctc_config, qwen3_tokenizer):
    from llm_ctc.model import LLMCTCModel

    torch.manual_seed(5)
    config = dataclasses.replace(ctc_config, readout="query", attn_implementation="eager")
    return LLMCTCModel(config, tokenizer=qwen3_tokenizer).eval()


def test_attention_of_the_parallel_masked_pass(eager_model):
    from llm_ctc.streaming.encoder import streaming_speech_embeddings
    from llm_ctc.streaming.llm import parallel_inputs, parallel_query_states

    features, lens = random_features([430, 150], seed=4)
    history = 2
    with torch.no_grad():
        attentions, layouts = streaming_attention(eager_model, features, lens, history)
        speech, same_layouts = streaming_speech_embeddings(eager_model, features, lens, history, 2)
        states, frame_lens = parallel_query_states(eager_model, speech, same_layouts, history)
        inputs, mask, positions = parallel_inputs(eager_model, speech, same_layouts, history)
        hidden = eager_model.llm(inputs_embeds=inputs, attention_mask=mask, position_ids=positions).last_hidden_state
    assert [layout.chunk_lens for layout in layouts] == [layout.chunk_lens for layout in same_layouts]
    for n, layout in enumerate(layouts):
        read = hidden[n, layout.query_positions]
        torch.testing.assert_close(read, states[n, :int(frame_lens[n])])
        visible = visibility(*layout_tensors(layout), history)
        for weights in attentions:
            w = weights[n, :, :layout.length, :layout.length]
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
            assert torch.all(w[:, ~visible] == 0)


def test_refuses_an_offline_run_and_bad_arguments(tmp_path):
    from asr.config import RunConfig

    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    torch.save({"config": RunConfig().to_dict(), "model": {}, "batch_idx_train": 1}, exp_dir / "epoch-1.pt")
    with pytest.raises(SystemExit, match="no streaming LLM-CTC run"):
        main([str(exp_dir), "--cuts", f"test={tmp_path / 'x.gz'}"])
    with pytest.raises(SystemExit, match="--cuts takes NAME=MANIFEST"):
        main([str(exp_dir), "--cuts", str(tmp_path / "x.gz")])
    with pytest.raises(SystemExit, match="--edge and --batch >= 1"):
        main([str(exp_dir), "--cuts", f"test={tmp_path / 'x.gz'}", "--edge", "0"])
