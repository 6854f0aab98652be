"""Streaming LLM-CTC (model.streaming) as the toolkit's model: the training loss, the
history of each step, output lengths, and the cache bound."""

import dataclasses

import pytest
import torch

from asr.chunk_windows import feature_chunk_frames, history_for_step
from llm_ctc.streaming.llm import parallel_query_states
from llm_ctc.streaming.encoder import streaming_speech_embeddings
from llm_ctc.streaming.layout import FrameRateGrid, Qwen3ASRGrid, cache_bound, utterance_layout
from references.ctc_reference import dense_reference
from references.tiny_llm import assert_encoder_gradient_is_central_difference, perturb_lora, random_features


@pytest.fixture(scope="module")
def streaming_model(ctc_config, qwen3_tokenizer):
    from llm_ctc.family import build_model, build_tokenizer

    config = dataclasses.replace(ctc_config, streaming=True, alignment_beam=None, streaming_seed=3)
    tokenizer = build_tokenizer(config)
    torch.manual_seed(11)
    model = build_model(config, tokenizer.vocab_size, tokenizer.blank_id)
    perturb_lora(model)
    return model


def masked_forward_losses(model, features, lens, targets, history):
    llm = model
    with torch.no_grad():
        speech, layouts = streaming_speech_embeddings(llm, features, lens, history)
        states, state_lens = parallel_query_states(llm, speech, layouts, history)
    losses, *_ = dense_reference(states, llm.head_weight, llm.head_bias(), targets, state_lens,
                                 blank_id=llm.blank_id)
    return losses


def test_training_step_loss_is_dense_ctc_of_the_masked_forward_at_the_steps_history(streaming_model):
    model = streaming_model.train()
    features, lens = random_features([1030, 610], seed=21)  # 5.3 s and 3.1 s: 3 and 2 chunks
    targets = model.encode_texts(["the cat sat on the mat", "hello world"])
    step = next(s for s in range(1, 100) if history_for_step(3, s) == 1)
    model.start_update(step, 0.0)
    with torch.no_grad():
        loss, stats = model(features, lens, targets, return_stats=True)
    assert model.last_history == 1
    expected = masked_forward_losses(model, features, lens, targets, 1)
    torch.testing.assert_close(loss.double(), expected.sum(), rtol=1e-6, atol=1e-4)
    # The history matters for these lengths: h = 8 gives another loss.
    longer = masked_forward_losses(model, features, lens, targets, 8)
    assert (longer.sum() - expected.sum()).abs() > 1e-3
    assert stats.num_excluded == 0


def test_validation_uses_the_longest_history(streaming_model):
    model = streaming_model.eval()
    features, lens = random_features([1030], seed=22)
    targets = model.encode_texts(["a quick test"])
    with torch.no_grad():
        loss = model(features, lens, targets)
    assert model.last_history == 8
    torch.testing.assert_close(loss.double(), masked_forward_losses(model, features, lens, targets, 8).sum(),
                               rtol=1e-6, atol=1e-4)
    model.train()


def test_histories_of_steps_follow_app_d4_and_the_seed():
    draws = [history_for_step(5, step) for step in range(1, 14001)]
    assert draws.count(8) / len(draws) == pytest.approx(0.5, abs=0.02)
    assert all(draws.count(h) / len(draws) == pytest.approx(1 / 14, abs=0.01) for h in range(1, 8))
    assert draws == [history_for_step(5, step) for step in range(1, 14001)]
    assert draws != [history_for_step(6, step) for step in range(1, 14001)]


def test_output_lengths_are_the_layouts_query_counts(streaming_model):
    lengths = [1, 7, 8, 9, 199, 200, 201, 417, 1000, 1601]
    grid = streaming_model.grid
    expected = [utterance_layout(0, feature_chunk_frames(f), grid).num_frames for f in lengths]
    assert [streaming_model.output_lengths(f) for f in lengths] == expected
    assert streaming_model.output_lengths(torch.tensor(lengths)).tolist() == expected


@pytest.mark.parametrize("grid, history, chunk_seconds, expected", [
    (Qwen3ASRGrid(), 8, 2, 260),  # App. E: P + 260 during a chunk with 2 s chunks and h = 8 s
    (Qwen3ASRGrid(), 1, 2, 52 + 26),
    (FrameRateGrid(8), 1, 2, 50 + 24),  # embeddings at 1.04 .. 1.92 s of the chunk kept
    (FrameRateGrid(8), 3, 2, 50 + 2 * 37),
])
def test_cache_bound_is_the_largest_cache_of_a_long_utterance(grid, history, chunk_seconds, expected):
    """The closed form against the largest retained set found by evicting, by the rule's
    definition, over 30 full chunks and a short last one."""
    assert cache_bound(5, grid, history, chunk_seconds) == 5 + expected
    full = 100 * chunk_seconds
    cache, largest = [], 0
    for b, frames in enumerate([full] * 30 + [37]):
        cache += [b * full + offset for offset in grid.offsets(grid.count(frames))] * 2
        largest = max(largest, len(cache))
        cache = [tau for tau in cache if tau >= b * full + frames - 100 * history]
    assert 5 + largest == cache_bound(5, grid, history, chunk_seconds)


def test_streaming_needs_the_query_readout(ctc_config):
    with pytest.raises(ValueError, match="model.streaming needs model.objective 'ctc' and model.readout 'query'"):
        dataclasses.replace(ctc_config, streaming=True, readout="speech")
    with pytest.raises(ValueError, match="model.streaming_max_history must be >= 1"):
        dataclasses.replace(ctc_config, streaming=True, streaming_max_history=0)


@pytest.mark.parametrize("method, search", [("ctc-greedy-search", "greedy"),
                                            ("ctc-prefix-beam-search", "beam")])
def test_streaming_decoding_with_a_covering_history_equals_the_parallel_query_readout(streaming_model, method,
                                                                                     search):
    """At the model's longest history (h = 8 s) chunk by chunk with the KV cache and
    eviction gives the hypotheses of one masked pass over all chunks at the same h
    (log_probs) searched offline; for utterances within 8 s + one chunk that is the query
    readout under the same chunking with nothing out of view."""
    from asr.search import ctc_greedy_search, ctc_prefix_beam_search

    model = streaming_model.eval()
    features, lens = random_features([610, 1030, 230], seed=23)
    ids, largest = model.streaming_ids(features, lens, 8, method, beam=3, token_penalty=0.5)
    with torch.no_grad():
        log_probs, out_lens = model.log_probs(features, lens)
    blank = model.blank_id
    expected = ctc_greedy_search(log_probs, out_lens, blank_id=blank) if search == "greedy" else \
        ctc_prefix_beam_search(log_probs, out_lens, beam=3, blank_id=blank, token_penalty=0.5)
    assert ids == expected and all(expected)
    prompt = len(model.prompt_ids)
    # 25 embeddings per full chunk. 6.1 s: nothing is evicted, all 77 speech and query pairs
    # stay; 10.3 s: the largest cache is during the fifth chunk (the first one is evicted
    # after it: tau < 8 + 2 - 8 s); 2.3 s: 25 + 4.
    assert largest == [prompt + 2 * 77, prompt + 2 * 5 * 25, prompt + 2 * 29]
    model.train()


@pytest.mark.parametrize("method", ["ctc-greedy-search", "ctc-prefix-beam-search"])
def test_streaming_decoding_with_a_blank_penalty_equals_the_penalized_parallel_search(streaming_model, method):
    """decode.blank_penalty chunk by chunk (greedy then reads log-probs, not the logits'
    argmax) gives the offline search of the same penalty over the parallel pass."""
    from asr.decode_methods import ctc_search

    model = streaming_model.eval()
    features, lens = random_features([610, 1030], seed=25)
    with torch.no_grad():
        log_probs, out_lens = model.log_probs(features, lens)
    for penalty in (2.0, -30.0):
        ids, _ = model.streaming_ids(features, lens, 8, method, beam=3, token_penalty=0.5, blank_penalty=penalty)
        assert ids == ctc_search(method, log_probs, out_lens, model.blank_id, 3, 0.5, penalty)
    assert model.streaming_ids(features, lens, 8, method, beam=3, blank_penalty=2.0)[0] != \
        model.streaming_ids(features, lens, 8, method, beam=3, blank_penalty=-30.0)[0]
    model.train()


def test_streaming_decoding_refuses_a_cache_beyond_the_bound(streaming_model, monkeypatch):
    from llm_ctc.streaming.model import CacheBoundExceeded

    model = streaming_model.eval()
    features, lens = random_features([610], seed=24)
    monkeypatch.setattr(type(model), "cache_bound", lambda self, history: 10)
    with pytest.raises(CacheBoundExceeded, match="more than the bound P \\+ 2A \\+ J = 10"):
        model.streaming_ids(features, lens, 1, "ctc-greedy-search")
    model.train()


def test_decode_settings_name_each_history_and_refuse_bad_ones():
    from asr.config import DecodeOptions
    from asr.decode import decoding_settings

    options = DecodeOptions(methods=("ctc-greedy-search", "ctc-streaming-prefix-beam-search"),
                            history_seconds=(2, 4, 2), token_penalty=0.7)
    assert [setting.key for setting in decoding_settings(options)] == [
        "ctc-greedy-search"] + [f"ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.7_history-{h}s"
                                for h in (2, 4)]
    assert DecodeOptions(history_seconds=8).history_seconds == (8,)
    with pytest.raises(ValueError, match="decode.history_seconds must be whole seconds >= 1, got \\[0\\]"):
        DecodeOptions(history_seconds=(0,))


def test_a_trained_encoder_gets_the_true_gradient_through_the_chunk_windows(ctc_config, qwen3_tokenizer):
    """model.encoder_lr_scale > 0 with model.streaming (egs/mini stage 10): the loss reaches
    the encoder's weights through every chunk window (the history's frames too), and its
    gradient equals a central difference of the streaming loss in float64, to the precision
    of the Zipformer's stored activation derivatives."""
    from llm_ctc.family import build_model, build_tokenizer

    config = dataclasses.replace(ctc_config, streaming=True, alignment_beam=None, streaming_seed=3,
                                 encoder_lr_scale=0.1)
    tokenizer = build_tokenizer(config)
    torch.manual_seed(12)
    model = build_model(config, tokenizer.vocab_size, tokenizer.blank_id).double()
    perturb_lora(model)
    model.train()
    assert not model.encoder.training and all(p.requires_grad for p in model.encoder.parameters())
    features, lens = random_features([1030, 610], seed=23)  # 3 and 2 chunks
    features = features.double()
    targets = model.encode_texts(["the cat sat on the mat", "hello world"])
    step = next(s for s in range(1, 100) if history_for_step(3, s) == 2)
    model.start_update(step, 0.0)
    assert_encoder_gradient_is_central_difference(model, lambda m: m(features, lens, targets), seed=24)
    assert model.last_history == 2
