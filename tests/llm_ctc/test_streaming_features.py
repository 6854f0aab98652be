"""Streaming LLM-CTC trains on the features streaming inference computes (App. D.4): a
streaming run's data section chunks features as the model chunks its input, and a
training batch's chunk features are the StreamingRecognizer's for the same audio."""

from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from lhotse import CutSet

from asr.chunk_features import ChunkFbank
from asr.config import load_run_config
from asr.data import AsrDataset, load_cuts_lazy
from llm_ctc.streaming.recognizer import StreamingRecognizer

SAMPLE_RATE = 16000


def test_a_streaming_run_chunks_its_features_as_its_model() -> None:
    streaming = ["family=llm_ctc", "model.streaming=true", "model.streaming_chunk_seconds=3"]
    assert load_run_config(None, streaming).data.feature_chunk_seconds == 3
    assert load_run_config(None, ["family=llm_ctc"]).data.feature_chunk_seconds == 0
    assert load_run_config(None).data.feature_chunk_seconds == 0  # the Zipformer family
    # 0 keeps the cut's own features (sliced at chunk boundaries), e.g. without audio.
    assert load_run_config(None, streaming + ["data.feature_chunk_seconds=0"]).data.feature_chunk_seconds == 0


@pytest.mark.parametrize("overrides, message", [
    (["family=llm_ctc", "model.streaming=true", "data.feature_chunk_seconds=1"],
     "data.feature_chunk_seconds=1 needs model.streaming_chunk_seconds=2"),
    (["data.feature_chunk_seconds=2"], r"data.feature_chunk_seconds=2 needs a streaming model \(model.streaming\)"),
    (["data.feature_chunk_seconds=-1"], "data.feature_chunk_seconds must be >= 0"),
])
def test_feature_chunks_that_are_not_the_models_are_refused(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_run_config(None, overrides)


@pytest.fixture(scope="module")
def long_cut(tmp_path_factory, make_cut_corpus):
    """One 5.3-second cut: two full 2-second chunks and a 1.3-second one."""
    corpus = make_cut_corpus(tmp_path_factory.mktemp("long_cut"), train={"utt-long": (5.3, "A LONG ONE")},
                             valid={"utt-long": (5.3, "A LONG ONE")})
    return CutSet.from_cuts(load_cuts_lazy(corpus["train"]))


def recognizer_chunk_features(recognizer: StreamingRecognizer, samples: torch.Tensor, piece: int):
    """The features of each chunk the recognizer recognizes, fed ``piece`` samples at a time."""
    seen = []
    recognize = recognizer._recognize_chunk
    recognizer._recognize_chunk = lambda chunk, lookahead: (seen.append(chunk), recognize(chunk, lookahead))[1]
    for start in range(0, samples.numel(), piece):
        recognizer.accept_waveform(samples[start:start + piece])
    recognizer.finish()
    return seen


def test_training_chunk_features_are_the_recognizers_for_the_same_audio(ctc_model, long_cut) -> None:
    batch = AsrDataset(chunk_seconds=2)[long_cut]
    samples, rate = soundfile.read(long_cut[0].recording.sources[0].source, dtype="float32")
    assert rate == SAMPLE_RATE
    chunks = recognizer_chunk_features(StreamingRecognizer(ctc_model, history_seconds=2),
                                       torch.from_numpy(samples), piece=7000)
    assert [chunk.shape[0] for chunk in chunks] == [200, 200, 130]
    assert int(batch["feature_lens"][0]) == 530
    assert torch.equal(batch["features"][0], torch.cat(chunks))


def test_a_qwen3_asr_recognizer_takes_audio_as_128_bin_chunk_fbank(tiny_qwen3_asr_dir, tokenizer_dir,
                                                                     qwen3_tokenizer) -> None:
    from llm_ctc.config import LLMASRConfig
    from llm_ctc.model import LLMCTCModel

    config = LLMASRConfig(llm=str(tiny_qwen3_asr_dir), tokenizer=str(tokenizer_dir), encoder_type="qwen3_asr",
                          encoder_path=str(tiny_qwen3_asr_dir), projector_type="mlp", projector_hidden=32,
                          lora_rank=0, streaming=True)
    model = LLMCTCModel(config, tokenizer=qwen3_tokenizer).eval()
    noise = torch.from_numpy(np.random.default_rng(3).normal(scale=0.1, size=33000).astype(np.float32))
    recognizer = StreamingRecognizer(model, history_seconds=1)
    chunks = recognizer_chunk_features(recognizer, noise, piece=33000)
    # 1000 samples after the first chunk: (1000 + 80) // 160 frames of their own.
    assert [tuple(chunk.shape) for chunk in chunks] == [(200, 128), (6, 128)]
    assert torch.equal(chunks[1], ChunkFbank(128)(noise[32000:].numpy()))
    assert recognizer.llm.chunk_index == 2
