"""Readouts (Sec. 4.2): the CTC states are the LLM states at exactly the query (or
speech) positions, whatever the padding of the batch."""

import dataclasses

import pytest
import torch

from references.tiny_llm import random_features, states_of_one_sequence
from llm_ctc.model import LLMCTCModel
from llm_ctc.sequence import build_sequences


def unpadded_states(model, speech_row):
    """The definition: run [prompt, E_n, (q 1_{T_n})] alone, read rows P+T_n.. or P.."""
    prompt = model.text_embeddings(model.config.prompt)
    blocks = [prompt, speech_row]
    if model.query is not None:
        blocks.append(model.query.to(speech_row.dtype).expand(speech_row.shape[0], -1))
    hidden = states_of_one_sequence(model.llm, torch.cat(blocks))
    start = prompt.shape[0] + (speech_row.shape[0] if model.query is not None else 0)
    return hidden[start:start + speech_row.shape[0]]


@pytest.fixture(scope="module")
def speech_readout_model(ctc_config, qwen3_tokenizer):
    torch.manual_seed(5)
    return LLMCTCModel(dataclasses.replace(ctc_config, readout="speech"), tokenizer=qwen3_tokenizer)


@pytest.mark.parametrize("readout", ["query", "speech"])
def test_readout_matches_unpadded_runs(readout, ctc_model, speech_readout_model):
    model = ctc_model if readout == "query" else speech_readout_model
    torch.manual_seed(0)
    lengths = torch.tensor([7, 3, 5])
    speech = torch.randn(3, 7, model.hidden_size)
    with torch.no_grad():
        states, lens = model.readout_states(speech, lengths)
        assert lens.tolist() == lengths.tolist()
        for n, length in enumerate(lengths.tolist()):
            expected = unpadded_states(model, speech[n, :length])
            torch.testing.assert_close(states[n, :length], expected, rtol=1e-5, atol=1e-5)
            assert torch.all(states[n, length:] == 0)


def test_query_and_speech_readouts_differ(ctc_model):
    # Guards the test above: reading the speech rows of a query-readout model is wrong.
    speech = torch.randn(1, 4, ctc_model.hidden_size)
    with torch.no_grad():
        states, _ = ctc_model.readout_states(speech, torch.tensor([4]))
        prompt_len = ctc_model.text_embeddings(ctc_model.config.prompt).shape[0]
        hidden = states_of_one_sequence(ctc_model.llm, torch.cat([
            ctc_model.text_embeddings(ctc_model.config.prompt), speech[0], ctc_model.query.expand(4, -1)]))
    assert not torch.allclose(states[0], hidden[prompt_len:prompt_len + 4], atol=1e-3)


def test_build_sequences_places_blocks_at_known_positions():
    prefix = torch.randn(2, 3)
    suffix = torch.randn(1, 3)
    speech = torch.randn(2, 4, 3)
    tail = torch.randn(2, 2, 3)
    batch = build_sequences(prefix, speech, torch.tensor([4, 2]), suffix=suffix, tail_tokens=tail,
                            tail_token_lens=torch.tensor([1, 2]))
    expected = [torch.cat([prefix, speech[0, :4], suffix, tail[0, :1]]),
                torch.cat([prefix, speech[1, :2], suffix, tail[1, :2]])]
    assert batch.lengths.tolist() == [8, 7]
    assert batch.tail_start.tolist() == [7, 5]
    for n, row in enumerate(expected):
        assert torch.equal(batch.inputs_embeds[n, :len(row)], row)
        assert torch.all(batch.inputs_embeds[n, len(row):] == 0)
        assert batch.attention_mask[n].tolist() == [1] * len(row) + [0] * (8 - len(row))
    assert batch.position_ids.tolist() == [list(range(8))] * 2


def test_whole_model_states_match_per_utterance_runs(ctc_model):
    features, lengths = random_features([90, 61, 75])
    with torch.no_grad():
        states, lens = ctc_model.ctc_states(features, lengths)
        for n in range(3):
            alone, alone_lens = ctc_model.ctc_states(features[n:n + 1, :lengths[n]], lengths[n:n + 1])
            assert alone_lens.item() == lens[n].item()
            torch.testing.assert_close(states[n, :lens[n]], alone[0], rtol=1e-4, atol=1e-4)


def test_default_prompt_is_the_papers_five_qwen3_tokens(ctc_model, qwen3_tokenizer):
    assert ctc_model.config.prompt == "Transcribe the speech."
    assert ctc_model.prompt_ids == qwen3_tokenizer("Transcribe the speech.", add_special_tokens=False)["input_ids"]
    assert len(ctc_model.prompt_ids) == 5
