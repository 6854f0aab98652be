"""StreamingRecognizer and the llm_ctc.streaming.stream command against the parallel (masked)
computation of the same streaming model and the offline CTC search, with and without a
lookahead into the next chunk."""

import copy
import dataclasses
import wave

import numpy as np
import pytest
import torch

from asr.search import ctc_greedy_search, ctc_prefix_beam_search
from llm_ctc.checkpoint import save_model_checkpoint
from llm_ctc.streaming.llm import parallel_query_states
from llm_ctc.streaming.encoder import streaming_speech_embeddings
from llm_ctc.streaming.recognizer import StreamingRecognizer
from references.tiny_llm import random_features


def parallel_log_probs(model, features, h):
    lens = torch.tensor([features.shape[0]])
    with torch.no_grad():
        speech, layouts = streaming_speech_embeddings(model, features[None], lens, h)
        states, state_lens = parallel_query_states(model, speech, layouts, h)
        return model.log_probs_of_states(states), state_lens


def recognize_in_pieces(recognizer, features, pieces):
    """Results and what the search was fed: (T, V) log-probabilities (beam search) or, for
    greedy search, each frame's best label (T,)."""
    seen, results, start = [], [], 0
    advance, advance_labels = recognizer.search.advance, getattr(recognizer.search, "advance_labels", None)
    recognizer.search.advance = lambda log_probs: (seen.append(log_probs), advance(log_probs))
    if advance_labels is not None:
        recognizer.search.advance_labels = lambda labels: (seen.append(torch.tensor(labels)), advance_labels(labels))
    for size in pieces:
        results += recognizer.accept_features(features[start:start + size])
        start += size
    results += recognizer.finish()
    return results, torch.cat(seen)


@pytest.mark.parametrize("method", ["ctc-greedy-search", "ctc-prefix-beam-search"])
def test_recognizer_equals_parallel_streaming_computation(method, ctc_model):
    model = ctc_model
    features, _ = random_features([530], seed=8)
    recognizer = StreamingRecognizer(model, history_seconds=2, method=method, beam=3, token_penalty=0.5)
    results, streamed = recognize_in_pieces(recognizer, features[0], [150, 150, 230])
    assert [r.frames for r in results] == [200, 200, 130] and [r.index for r in results] == [0, 1, 2]
    reference, lens = parallel_log_probs(model, features[0], 2)
    if method == "ctc-greedy-search":  # fed the argmax of the chunk's logits
        assert torch.equal(streamed, reference[0].argmax(dim=-1))
    else:
        assert streamed.shape == reference[0].shape
        assert (streamed - reference[0]).abs().max() <= 1e-4
    if method == "ctc-greedy-search":
        expected = ctc_greedy_search(reference, lens, blank_id=model.blank_id)[0]
    else:
        expected = ctc_prefix_beam_search(reference, lens, beam=3, blank_id=model.blank_id, token_penalty=0.5)[0]
    assert recognizer.tokens == expected and results[-1].tokens == expected
    assert len(expected) > 0 and results[-1].text == recognizer.tokenizer.decode(expected)


def with_lookahead(model, seconds: float):
    """The same model (shared weights) with model.streaming_lookahead_seconds set."""
    other = copy.copy(model)
    other.config = dataclasses.replace(model.config, streaming_lookahead_seconds=seconds)
    return other


@pytest.mark.parametrize("method", ["ctc-greedy-search", "ctc-prefix-beam-search"])
def test_a_lookahead_recognizer_waits_for_the_next_chunks_frames_and_equals_the_parallel_pass(method, ctc_model):
    model = with_lookahead(ctc_model, 0.32)
    features, _ = random_features([530], seed=8)
    recognizer = StreamingRecognizer(model, history_seconds=2, method=method, beam=3, token_penalty=0.5)
    seen, results, start = [], [], 0
    for size in [150, 81, 1, 199, 99]:  # chunk 0 completes its lookahead at 232 frames, chunk 1 at 432
        seen.append([r.index for r in recognizer.accept_features(features[0, start:start + size])])
        start += size
    assert seen == [[], [], [0], [], [1]]
    results = recognizer.finish()
    assert [r.index for r in results] == [2] and results[0].frames == 130
    reference, lens = parallel_log_probs(model, features[0], 2)
    if method == "ctc-greedy-search":
        expected = ctc_greedy_search(reference, lens, blank_id=model.blank_id)[0]
    else:
        expected = ctc_prefix_beam_search(reference, lens, beam=3, blank_id=model.blank_id, token_penalty=0.5)[0]
    assert recognizer.tokens == expected and len(expected) > 0
    _, streamed = recognize_in_pieces(StreamingRecognizer(model, history_seconds=2, method=method, beam=3,
                                                          token_penalty=0.5), features[0], [530])
    if method == "ctc-prefix-beam-search":
        assert (streamed - reference[0]).abs().max() <= 1e-4
        # The lookahead changed what the first chunk's last frames read, and nothing it cannot see.
        plain, _ = parallel_log_probs(ctc_model, features[0], 2)
        assert (plain[0, :25] - reference[0, :25]).abs().max() > 1e-4


def test_from_audio_a_lookahead_is_computed_from_the_first_samples_of_the_next_chunk(ctc_model):
    model = with_lookahead(ctc_model, 0.32)
    samples = torch.from_numpy(np.random.default_rng(5).normal(scale=0.1, size=84800).astype(np.float32))
    recognizer = StreamingRecognizer(model, history_seconds=2)
    used, recognize = [], recognizer._recognize_chunk
    recognizer._recognize_chunk = lambda chunk, lookahead: (used.append((chunk, lookahead)),
                                                            recognize(chunk, lookahead))[1]
    indices = []
    for start in range(0, samples.numel(), 2000):
        indices.append([r.index for r in recognizer.accept_waveform(samples[start:start + 2000])])
    final = recognizer.finish()
    # Chunk 0 goes as soon as 32 frames of chunk 1 can be computed: 32000 + 32 * 160 + 120
    # = 37240 samples, in the 19th piece of 2000; chunk 1 at 69240, in the 35th.
    assert [n for n, done in enumerate(indices) if done] == [18, 34] and [r.index for r in final] == [2]
    fbank = recognizer.frontend
    chunks = [fbank(samples[start:start + 32000]) for start in range(0, samples.numel(), 32000)]
    assert [tuple(lookahead.shape) for _, lookahead in used] == [(32, 80), (32, 80), (0, 80)]
    for b, (chunk, lookahead) in enumerate(used):
        assert torch.equal(chunk, chunks[b])
        if b < 2:  # the next chunk's first frames, as its whole-chunk fbank gives them
            torch.testing.assert_close(lookahead, chunks[b + 1][:32], rtol=1e-5, atol=1e-5)
    from_features = StreamingRecognizer(model, history_seconds=2)
    from_features.accept_features(torch.cat(chunks))
    from_features.finish()
    assert recognizer.tokens == from_features.tokens


@pytest.mark.parametrize("lookahead", [0.0, 0.32])
def test_tail_padding_is_the_audio_followed_by_zero_samples(ctc_model, lookahead):
    """finish(tail_padding_seconds): the chunks recognized are the per-chunk fbank of the
    samples followed by that many zero samples, and the hypothesis is the offline search
    of the parallel computation on those features."""
    model = with_lookahead(ctc_model, lookahead) if lookahead else ctc_model
    samples = torch.from_numpy(np.random.default_rng(7).normal(scale=0.1, size=51000).astype(np.float32))
    recognizer = StreamingRecognizer(model, history_seconds=2)
    used, recognize = [], recognizer._recognize_chunk
    recognizer._recognize_chunk = lambda chunk, ahead: (used.append(chunk), recognize(chunk, ahead))[1]
    for start in range(0, samples.numel(), 7000):
        recognizer.accept_waveform(samples[start:start + 7000])
    recognizer.finish(tail_padding_seconds=0.9)
    padded = torch.cat([samples, torch.zeros(14400)])  # 65400 samples: chunks of 200, 200 and 9 frames
    fbank = recognizer.frontend
    chunks = [fbank(padded[start:start + 32000]) for start in range(0, padded.numel(), 32000)]
    assert [chunk.shape[0] for chunk in used] == [chunk.shape[0] for chunk in chunks] == [200, 200, 9]
    for seen, chunk in zip(used, chunks):
        assert torch.equal(seen, chunk)
    reference, lens = parallel_log_probs(model, torch.cat(chunks), 2)
    assert recognizer.tokens == ctc_greedy_search(reference, lens, blank_id=model.blank_id)[0]
    bare = StreamingRecognizer(model, history_seconds=2)
    bare.accept_waveform(samples)
    bare.finish()
    assert bare.chunk_index == 2  # without the tail: 51000 samples, chunks of 200 and 119 frames


def test_tail_padding_needs_audio(ctc_model):
    features, _ = random_features([260], seed=9)
    recognizer = StreamingRecognizer(ctc_model, history_seconds=1)
    recognizer.accept_features(features[0])
    with pytest.raises(ValueError, match="tail_padding_seconds needs an audio stream"):
        recognizer.finish(tail_padding_seconds=0.5)
    with pytest.raises(ValueError, match="tail_padding_seconds must be a finite number of seconds >= 0"):
        StreamingRecognizer(ctc_model, history_seconds=1).finish(tail_padding_seconds=-0.1)


def test_reset_gives_a_fresh_utterance(ctc_model):
    first, _ = random_features([260], seed=9)
    second, _ = random_features([420], seed=10)
    recognizer = StreamingRecognizer(ctc_model, history_seconds=1)
    recognizer.accept_features(first[0])
    recognizer.finish()
    recognizer.reset()
    recognizer.accept_features(second[0])
    recognizer.finish()
    fresh = StreamingRecognizer(ctc_model, history_seconds=1)
    fresh.accept_features(second[0])
    fresh.finish()
    assert recognizer.tokens == fresh.tokens
    assert recognizer.llm.cache_positions == fresh.llm.cache_positions


def test_bad_features_are_refused(ctc_model):
    with pytest.raises(ValueError, match=r"features must have shape \(T, 80\)"):
        StreamingRecognizer(ctc_model).accept_features(torch.zeros(10, 128))


def write_wav(path, samples):
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes((samples * 32767).astype(np.int16).tobytes())


def test_stream_command_prints_each_chunk_and_the_final_hypothesis(ctc_model, tmp_path, capsys):
    from asr.audio import read_audio
    from llm_ctc.streaming.stream import main

    generator = np.random.default_rng(0)
    write_wav(tmp_path / "a.wav", 0.1 * generator.standard_normal(int(16000 * 4.3)))
    checkpoint = save_model_checkpoint(tmp_path / "model.pt", ctc_model)
    text = main(["--checkpoint", str(checkpoint), "--wav", str(tmp_path / "a.wav"), "--history", "2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ["0", "1", "2"]
    assert all(" ms " in line for line in lines[:-1])
    assert lines[-1] == f"final: {text}"
    # The same audio through the recognizer on the unmerged model.
    recognizer = StreamingRecognizer(ctc_model, history_seconds=2)
    recognizer.accept_waveform(torch.from_numpy(read_audio(tmp_path / "a.wav")))
    results = recognizer.finish()
    assert [r.frames for r in results] == [30]
    assert recognizer.text == text
    # With a tail of silence: the recognizer's finish with the same tail.
    padded = main(["--checkpoint", str(checkpoint), "--wav", str(tmp_path / "a.wav"), "--history", "2",
                   "--tail-padding-seconds", "0.8"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ["0", "1", "2"]
    recognizer.reset()
    recognizer.accept_waveform(torch.from_numpy(read_audio(tmp_path / "a.wav")))
    assert [r.frames for r in recognizer.finish(0.8)] == [110]
    assert recognizer.text == padded


def test_stream_command_errors_are_one_line(ctc_model, tmp_path):
    from llm_ctc.streaming.stream import main

    path = tmp_path / "b.wav"
    path.write_bytes(b"")
    checkpoint = save_model_checkpoint(tmp_path / "model.pt", ctc_model)
    with pytest.raises(SystemExit, match=f"ERROR: --audio {path}: cannot read it as audio"):
        main(["--checkpoint", str(checkpoint), "--audio", str(path)])
    write_wav(tmp_path / "a.wav", np.zeros(1600))
    with pytest.raises(SystemExit, match="ERROR: decode.seam_merge_seconds needs a model with a lookahead"):
        main(["--checkpoint", str(checkpoint), "--audio", str(tmp_path / "a.wav"), "--seam-merge-seconds", "0.32"])
    with pytest.raises(SystemExit, match="ERROR: --checkpoint: no such file"):
        main(["--checkpoint", str(tmp_path / "none.pt"), "--audio", str(tmp_path / "a.wav")])
    with pytest.raises(SystemExit, match="is a folder: give it as --exp-dir"):
        main(["--checkpoint", str(tmp_path), "--audio", str(tmp_path / "a.wav")])
    with pytest.raises(SystemExit, match="ERROR: train.exp_dir: experiment folder not found"):
        main(["--exp-dir", str(tmp_path / "none"), "--audio", str(tmp_path / "a.wav")])


def test_batch_streaming_decoding_equals_offline_search_on_parallel_states(ctc_model):
    from llm_ctc.streaming.recognizer import recognize_streaming

    model = ctc_model
    features, lens = random_features([610, 230], seed=12)
    ids, texts, largest = recognize_streaming(model, features, lens, history_seconds=1)
    for n in range(2):
        reference, ref_lens = parallel_log_probs(model, features[n, :int(lens[n])], 1)
        assert ids[n] == ctc_greedy_search(reference, ref_lens, blank_id=model.blank_id)[0]
        assert texts[n] == StreamingRecognizer(model).tokenizer.decode(ids[n])
    prompt = len(model.prompt_ids)
    # 25 embeddings per 2 s chunk, one per 0.08 s (stack 2 over 25 frames/s); a 1 s
    # history keeps those of the previous chunk at offsets 1.04 .. 1.92 s: J = 2 x 12.
    # The 230-frame utterance peaks in its first chunk (its second has 4 embeddings).
    assert largest == [prompt + 2 * 25 + 2 * 12, prompt + 2 * 25]


@pytest.mark.parametrize("method", ["ctc-greedy-search", "ctc-prefix-beam-search"])
def test_seam_merge_is_the_searchs_seam_rule_over_the_lookahead_frames(method, ctc_model):
    from asr.streaming_search import StreamingGreedySearch, StreamingPrefixBeamSearch
    from llm_ctc.streaming.recognizer import recognize_streaming, seam_frames

    model = with_lookahead(ctc_model, 0.32)
    # 0.32 s = 32 feature frames; 8 frames per query frame (Zipformer 4, stack 2): 4.
    assert seam_frames(model, 0.32) == 4 and seam_frames(model, 0.33) == 5 and seam_frames(model, 0.64) == 8
    with pytest.raises(ValueError, match="decode.seam_merge_seconds must be a multiple of 0.01 s"):
        seam_frames(model, 0.325)
    features, lens = random_features([530], seed=8)
    ids, _, _ = recognize_streaming(model, features, lens, history_seconds=2, method=method, beam=3,
                                    token_penalty=0.5, seam_merge_seconds=0.32)
    reference, _ = parallel_log_probs(model, features[0], 2)
    search = (StreamingGreedySearch(model.blank_id, seam_frames=4) if method == "ctc-greedy-search" else
              StreamingPrefixBeamSearch(3, model.blank_id, token_penalty=0.5, seam_frames=4))
    for chunk in torch.split(reference[0], [25, 25, 17]):
        search.advance(chunk)
    assert ids[0] == search.best()
    with pytest.raises(ValueError, match="decode.seam_merge_seconds needs a model with a lookahead"):
        recognize_streaming(ctc_model, features, lens, history_seconds=2, seam_merge_seconds=0.32)
