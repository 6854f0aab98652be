"""Streaming LLM-CTC on the LLM side: parallel (masked) against cached chunk-by-chunk
computation, eviction, the cache bound, the loss over concatenated query outputs, and
the history sampling of App. D.4."""

import dataclasses
from collections import Counter

import pytest
import torch

from asr.chunk_windows import sample_history
from llm_ctc.streaming.llm import CachedStreamingLLM, parallel_query_states, streaming_loss
from llm_ctc.streaming.layout import Qwen3ASRGrid, utterance_layout
from references.ctc_reference import dense_reference
from references.tiny_llm import WIDTH, states_of_one_sequence

GRID = Qwen3ASRGrid()


@pytest.fixture(scope="module")
def eager_model_without_lora(ctc_config, qwen3_tokenizer):
    from llm_ctc.model import LLMCTCModel

    torch.manual_seed(5)
    config = dataclasses.replace(ctc_config, lora_rank=0, attn_implementation="eager")
    return LLMCTCModel(config, tokenizer=qwen3_tokenizer)


def speech_for(layouts, seed=0):
    generator = torch.Generator().manual_seed(seed)
    frames = max(layout.num_frames for layout in layouts)
    return torch.randn(len(layouts), frames, WIDTH, generator=generator)


def layouts_of(model, chunkings):
    return [utterance_layout(len(model.prompt_ids), frames, GRID) for frames in chunkings]


def cached_states(model, layout, speech, h):
    state = CachedStreamingLLM(model, h, GRID)
    outputs, start = [], 0
    for frames, count in zip(layout.chunk_frames, layout.chunk_lens):
        outputs.append(state.step(speech[start:start + count], frames))
        start += count
    return torch.cat(outputs), state


@pytest.mark.parametrize("which", ["lora_sdpa", "no_lora_eager"])
@pytest.mark.parametrize("h", [1, 3])
def test_cached_equals_parallel_batched_with_padding(which, h, ctc_model, eager_model_without_lora):
    model = ctc_model if which == "lora_sdpa" else eager_model_without_lora
    layouts = layouts_of(model, [[200, 200, 200, 37], [200, 200, 3], [150]])
    speech = speech_for(layouts)
    with torch.no_grad():
        parallel, lens = parallel_query_states(model, speech, layouts, h)
    assert lens.tolist() == [layout.num_frames for layout in layouts]
    for n, layout in enumerate(layouts):
        cached, _ = cached_states(model, layout, speech[n], h)
        assert (cached - parallel[n, :layout.num_frames]).abs().max() <= 1e-5
    assert parallel[1, lens[1]:].abs().max() == 0


def test_long_history_is_the_plain_causal_llm(ctc_model):
    """h covering the utterance: every earlier chunk is visible, i.e. the causal mask."""
    model = ctc_model
    layout, = layouts_of(model, [[200, 200, 90]])
    speech = speech_for([layout])
    with torch.no_grad():
        streamed, _ = parallel_query_states(model, speech, [layout], 8)
        short, _ = parallel_query_states(model, speech, [layout], 1)
        sequence = torch.cat([model.embed_tokens(torch.tensor(model.prompt_ids))] +
                             [model.query[None] if layout.is_query[k] else speech[0, layout.speech_index[k]][None]
                              for k in range(layout.prompt_len, layout.length)])
        causal = states_of_one_sequence(model.llm, sequence)[layout.query_positions]
    assert (streamed[0] - causal).abs().max() <= 1e-5
    first = layout.chunk_lens[0]
    # A 1 s history: the first chunk is unaffected, the later ones lose context.
    assert (short[0, :first] - causal[:first]).abs().max() <= 1e-5
    assert (short[0, first:] - causal[first:]).abs().max() > 1e-2


def test_eviction_keeps_exactly_the_rule_positions(ctc_model):
    model = ctc_model
    layout, = layouts_of(model, [[200, 200, 200, 200, 60]])
    speech = speech_for([layout])[0]
    state = CachedStreamingLLM(model, 3, GRID)
    start = 0
    for b, (frames, count) in enumerate(zip(layout.chunk_frames, layout.chunk_lens)):
        state.step(speech[start:start + count], frames)
        start += count
        a_b = 2.0 * b
        end = layout.chunk_offset(b + 1)
        expected = [k for k in range(end) if k < layout.prompt_len or
                    layout.tau[k] / 100 >= a_b + 0.01 * frames - 3]
        assert state.cache_positions == expected
        assert all(layer.keys.shape[2] == len(expected) == layer.values.shape[2]
                   for layer in state.cache.layers)


def test_cache_bound_on_a_60_second_input(ctc_model):
    model = ctc_model
    h = 8
    layout, = layouts_of(model, [[200] * 30])
    speech = speech_for([layout])[0]
    prompt = layout.prompt_len
    state = CachedStreamingLLM(model, h, GRID)
    start, during, between = 0, [], []
    for frames, count in zip(layout.chunk_frames, layout.chunk_lens):
        before = state.largest_cache
        state.largest_cache = 0
        state.step(speech[start:start + count], frames)
        start += count
        during.append(state.largest_cache)
        between.append(state.cache_size)
        state.largest_cache = max(before, state.largest_cache)
    # A = 26 speech embeddings per 2 s chunk, J = 2 * 13 h retained (App. E).
    assert max(during) == prompt + 2 * 26 + 26 * h
    assert max(between) == prompt + 26 * h
    # Bounded per-chunk work: from chunk h/2 + 1 on, every chunk attends to the same count.
    assert len(set(during[h // 2:])) == 1


def test_streaming_loss_is_dense_ctc_over_the_concatenated_query_outputs(ctc_model):
    model = ctc_model
    saved = model.config.alignment_beam
    model.config.alignment_beam = float("inf")
    try:
        layouts = layouts_of(model, [[200, 120], [200, 200, 10]])
        speech = speech_for(layouts, seed=3)
        targets = model.encode_texts(["hello world", "the cat sat"])
        with torch.no_grad():
            loss, stats = streaming_loss(model, speech, layouts, 1, targets)
            states, lens = parallel_query_states(model, speech, layouts, 1)
    finally:
        model.config.alignment_beam = saved
    losses, *_ = dense_reference(states, model.head_weight, model.head_bias(), targets, lens,
                                 blank_id=model.blank_id)
    torch.testing.assert_close(loss.double(), losses.sum(), rtol=1e-6, atol=1e-4)
    assert stats["frames"] == sum(layout.num_frames for layout in layouts)


def test_streaming_loss_trains_the_query_and_lora(ctc_model):
    model = ctc_model
    layouts = layouts_of(model, [[200, 60]])
    model.zero_grad()
    loss, _ = streaming_loss(model, speech_for(layouts), layouts, 1, model.encode_texts(["hi there"]))
    loss.backward()
    assert model.query.grad.abs().max() > 0 and model.blank_offset.grad.abs() > 0
    assert any(p.grad is not None and p.grad.abs().max() > 0
               for name, p in model.named_parameters() if "lora_B" in name)
    model.zero_grad()


def test_history_sampling_distribution():
    generator = torch.Generator().manual_seed(0)
    draws = 28000
    counts = Counter(sample_history(generator) for _ in range(draws))
    assert set(counts) == set(range(1, 9))
    assert counts[8] / draws == pytest.approx(0.5, abs=0.015)
    for h in range(1, 8):
        assert counts[h] / draws == pytest.approx(1 / 14, abs=0.008)


def test_history_sampling_is_reproducible_from_the_seed():
    first, second = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert [sample_history(first) for _ in range(50)] == [sample_history(second) for _ in range(50)]


def test_training_loss_from_features_trains_the_projector(ctc_model):
    from llm_ctc.streaming.llm import streaming_training_loss
    from references.tiny_llm import random_features

    model = ctc_model
    features, lens = random_features([430, 250], seed=6)
    model.zero_grad()
    loss, stats = streaming_training_loss(model, features, lens, model.encode_texts(["hello", "the cat"]), 1)
    loss.backward()
    # 430 frames: chunks of 200, 200, 30 -> 25 + 25 + 4 embeddings (8 feature frames each).
    assert stats["frames"] == 54 + 32 and torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in model.projector.parameters())
    model.zero_grad()


@pytest.mark.parametrize("h", [1, 3])
def test_shifted_positions_are_those_of_a_stream_that_started_earlier(h, ctc_model):
    """parallel_query_states with a position offset of k * 2A on an utterance equals the
    chunk-by-chunk decoder whose positions run k chunks ahead (its next position moved on
    after the prompt, as after k chunks whose entries the history has evicted)."""
    from llm_ctc.streaming.llm import position_offsets_for_step

    model = ctc_model
    layouts = layouts_of(model, [[200, 200, 37], [200, 3]])
    speech = speech_for(layouts, seed=3)
    full = 2 * GRID.count(200)
    offsets = [3 * full, 7 * full]
    with torch.no_grad():
        shifted, _ = parallel_query_states(model, speech, layouts, h, position_offsets=offsets)
        plain, _ = parallel_query_states(model, speech, layouts, h)
    for n, layout in enumerate(layouts):
        state = CachedStreamingLLM(model, h, GRID)
        state.next_position += offsets[n]
        outputs, start = [], 0
        for frames, count in zip(layout.chunk_frames, layout.chunk_lens):
            outputs.append(state.step(speech[n, start:start + count], frames))
            start += count
        assert (torch.cat(outputs) - shifted[n, :layout.num_frames]).abs().max() <= 1e-5
        # The prompt's rotary distance moved, so the states did too.
        assert (shifted[n, :layout.num_frames] - plain[n, :layout.num_frames]).abs().max() > 1e-3
    draws = [position_offsets_for_step(0, step, 4, 5, full) for step in range(200)]
    assert draws[17] == position_offsets_for_step(0, 17, 4, 5, full)  # a function of (seed, step)
    assert {d for row in draws for d in row} == {k * full for k in range(6)}


def test_streaming_model_shifts_positions_only_in_training(ctc_config, qwen3_tokenizer):
    from llm_ctc.streaming.model import StreamingLLMCTCModel

    config = dataclasses.replace(ctc_config, streaming=True, streaming_position_offset_chunks=4)
    model = StreamingLLMCTCModel(config, tokenizer=qwen3_tokenizer)
    full = 2 * model.grid.count(200)
    model.train()
    model.start_update(9, 9.0)
    offsets = model.position_offsets(3)
    assert offsets == model.position_offsets(3) and all(o % full == 0 and 0 <= o <= 4 * full for o in offsets)
    model.eval()
    assert model.position_offsets(3) is None
    with pytest.raises(ValueError, match="streaming_position_offset_chunks must be >= 0"):
        dataclasses.replace(config, streaming_position_offset_chunks=-1).validate()


def test_a_lookahead_is_a_whole_number_of_frames_within_a_chunk_and_only_for_the_zipformer(ctc_config):
    config = dataclasses.replace(ctc_config, streaming=True, streaming_lookahead_seconds=0.32)
    assert config.streaming_lookahead_seconds == 0.32
    for bad in (0.005, 2.5, -0.02):
        with pytest.raises(ValueError, match="model.streaming_lookahead_seconds must be a multiple of 0.01 s"):
            dataclasses.replace(config, streaming_lookahead_seconds=bad)
    with pytest.raises(ValueError, match="model.streaming_lookahead_seconds is for the Zipformer encoder"):
        dataclasses.replace(config, encoder_type="qwen3_asr", projector_type="mlp")
