"""Streaming LLM-CTC through the shared trainer (asr.train with model.streaming=true):
the history of every step reaches the model, validation runs at the longest history, and
a resumed run is the uninterrupted one bit for bit, with features and SpecAugment per
chunk (App. D.4). 1-second chunks and histories of 1 or 2 s, so that the 1.2-2.2 s cuts
of the tiny corpus have two or three chunks."""

import shutil
from pathlib import Path
from typing import List

import pytest
import torch

from asr.train import main as train
from references.tiny_llm import tiny_llm_training_arguments
from asr.chunk_windows import history_for_step

STREAMING = ["model.streaming=true", "model.readout=query", "model.streaming_chunk_seconds=1",
             "model.streaming_max_history=2", "model.streaming_seed=4", "data.enable_spec_aug=true"]


def arguments(corpus, ctc_config, exp_dir: Path, *extra: str) -> List[str]:
    return tiny_llm_training_arguments(corpus, ctc_config, exp_dir, *STREAMING, *extra)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def uninterrupted(small_training_corpus, ctc_config, tmp_path_factory):
    """(exp_dir, [(step, h the model used)], the model after the run, the first batch)."""
    exp_dir = tmp_path_factory.mktemp("streaming_exp")
    seen, models, batches = [], [], []

    def after_step(run, batch, state) -> None:
        seen.append((state.batch_idx_train, run.model.last_history))
        models[:] = [run.model]
        batches.append(batch)

    train(arguments(small_training_corpus, ctc_config, exp_dir), after_step=after_step)
    return exp_dir, seen, models[0], batches[0]


def test_each_step_trains_at_its_drawn_history_and_validation_at_the_longest(uninterrupted):
    exp_dir, seen, model, _ = uninterrupted
    assert len(seen) > 4
    assert seen == [(step, history_for_step(4, step, 2)) for step, _ in seen]
    assert {h for _, h in seen} == {1, 2}
    assert model.last_history == 2  # the validation after the last epoch
    assert load(exp_dir / "epoch-2.pt")["config"]["model"]["streaming"] is True


def test_training_batches_hold_per_chunk_features_with_per_chunk_spec_augment(small_training_corpus,
                                                                              uninterrupted):
    """The trainer's first batch is AsrDataset's per-chunk features of its cuts, augmented
    per chunk with the run's seed and epoch (asr.chunk_features; its own tests check the
    chunks against the fbank of each chunk's samples)."""
    from lhotse import CutSet

    from asr.config import DataOptions
    from asr.data import AsrDataset, build_spec_augment, load_cuts_lazy

    exp_dir, _, _, update = uninterrupted
    assert update["num_microbatches"] == 1
    batch = update["microbatches"][0]
    assert load(exp_dir / "epoch-1.pt")["config"]["data"]["feature_chunk_seconds"] == 1
    by_id = {cut.id: cut for cut in load_cuts_lazy(small_training_corpus["train"])}
    cuts = CutSet.from_cuts(by_id[cut_id] for cut_id in batch["cut_ids"])
    dataset = AsrDataset(spec_augment=build_spec_augment(DataOptions()), chunk_seconds=1, seed=42)
    dataset.set_epoch(1)
    assert torch.equal(dataset[cuts]["features"], batch["features"])
    plain = AsrDataset(chunk_seconds=1)[cuts]
    assert torch.equal(plain["feature_lens"], batch["feature_lens"])
    assert not torch.equal(plain["features"], batch["features"])


def test_resumed_streaming_training_matches_uninterrupted_bit_for_bit(small_training_corpus, ctc_config,
                                                                      uninterrupted, tmp_path):
    exp_dir, _, _, _ = uninterrupted
    assert load(exp_dir / "epoch-1.pt")["batch_idx_train"] > 2  # checkpoint-2.pt is mid-epoch
    for name in ("checkpoint-2.pt", "epoch-1.pt"):
        shutil.copy(exp_dir / name, tmp_path / name)
    resumed = []
    train(arguments(small_training_corpus, ctc_config, tmp_path, "train.start_batch=2"),
          after_step=lambda run, batch, state: resumed.append((state.batch_idx_train, run.model.last_history)))
    assert resumed[0][0] == 3
    first, second = load(exp_dir / "epoch-2.pt"), load(tmp_path / "epoch-2.pt")
    for entry in ("model", "model_avg"):
        for name, tensor in first[entry].items():
            assert torch.equal(tensor, second[entry][name]), f"{entry}.{name} differs"


def test_asr_decode_writes_streaming_results_per_history(small_training_corpus, uninterrupted):
    """Through asr.decode: one setting per history; with h = 2 s covering every cut (at
    most 2.2 s, the model's longest history) the chunk-by-chunk hypotheses are those of
    ctc-greedy-search, which searches the parallel masked forward at h = 2 s."""
    from asr.decode import main as decode

    exp_dir, _, _, _ = uninterrupted
    rates = decode([f"--exp-dir={exp_dir}", "--epoch=2", "--avg=1", "--use-averaged-model=false",
                    f"--test-cuts=train={small_training_corpus['train']}", "--num-workers=0",
                    "--history-seconds", "1", "2", "--token-penalty=0.3",
                    "--method", "ctc-greedy-search", "ctc-streaming-greedy-search",
                    "ctc-streaming-prefix-beam-search"])
    keys = {"ctc-greedy-search", "ctc-streaming-greedy-search_history-1s", "ctc-streaming-greedy-search_history-2s",
            "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3_history-1s",
            "ctc-streaming-prefix-beam-search_beam-4_token-penalty-0.3_history-2s"}
    assert set(rates["train"]) == keys

    def hypotheses(key):
        text = (exp_dir / f"recogs-train-{key}-epoch-2_avg-1.txt").read_text()
        return [line for line in text.splitlines() if "hyp=" in line]

    offline = hypotheses("ctc-greedy-search")
    assert len(offline) == 6 and any("hyp=[]" not in line for line in offline)
    assert hypotheses("ctc-streaming-greedy-search_history-2s") == offline
    assert rates["train"]["ctc-streaming-greedy-search_history-2s"] == rates["train"]["ctc-greedy-search"]


def test_latency_command_measures_every_chunk_within_the_cache_bound(small_training_corpus, ctc_config,
                                                                      uninterrupted, tmp_path):
    """8 s of the training cuts' audio in 1 s chunks at h = 1 s: from the second chunk
    on each chunk attends to the prompt, the 13 kept pairs of the previous chunk and its
    own 13 pairs (P + 2A + J with A = J / 2 = 13, embeddings at 0, 0.08, ..., 0.96 s)."""
    import csv

    from llm_ctc.streaming.latency import main as latency

    exp_dir, _, model, _ = uninterrupted
    rows = latency([*arguments(small_training_corpus, ctc_config, exp_dir),
                    "decode.epoch=2", "decode.avg=1", "decode.use_averaged_model=false",
                    "--cuts", str(small_training_corpus["train"]), "--seconds", "8", "--history", "1",
                    "--output-dir", str(tmp_path)])
    prompt = len(model.prompt_ids)
    assert [row["chunk"] for row in rows] == list(range(8))
    assert [row["attended_positions"] for row in rows] == [prompt + 26] + [prompt + 52] * 7
    assert [row["kept_positions"] for row in rows] == [prompt + 26] * 8
    assert model.cache_bound(1) == prompt + 52
    assert all(row["milliseconds"] > 0 for row in rows)
    with open(tmp_path / "chunks.csv") as table:
        assert [int(row["attended_positions"]) for row in csv.DictReader(table)] == \
            [row["attended_positions"] for row in rows]
    assert "cache bound P + 2A + J = %d positions" % (prompt + 52) in (tmp_path / "summary.md").read_text()
    # With a lookahead each chunk is recognized when the next one's audio comes (the last
    # at the end): the same rows, the same cache.
    import copy
    import dataclasses

    from llm_ctc.streaming.latency import long_input, measure, summary

    ahead_model = copy.copy(model.eval())
    ahead_model.config = dataclasses.replace(model.config, streaming_lookahead_seconds=0.32)
    samples = long_input(small_training_corpus["train"], 8)
    with torch.inference_mode():
        plain, ahead = measure(model, samples, 1), measure(ahead_model, samples, 1)
    assert [(r["chunk"], r["start_seconds"], r["attended_positions"], r["kept_positions"]) for r in ahead] == \
        [(r["chunk"], r["start_seconds"], r["attended_positions"], r["kept_positions"]) for r in plain] == \
        [(r["chunk"], r["start_seconds"], r["attended_positions"], r["kept_positions"]) for r in rows]
    assert "Lookahead 0.32 s: each chunk's hypothesis waits" in summary(ahead, prompt + 52, 1, 8, "x", 1, 0.32)


def test_stream_command_reads_the_run_s_checkpoints_and_flac(small_training_corpus, uninterrupted, tmp_path,
                                                             capsys):
    """The stream command takes what the recipe writes: the run's folder with a weight
    choice, or one of its checkpoint files, and a FLAC file; its text is the recognizer's
    on the same weights and samples."""
    import soundfile

    from asr.audio import read_audio
    from asr.config import DecodeOptions
    from asr.weights import load_trained_model
    from llm_ctc.streaming.recognizer import StreamingRecognizer
    from llm_ctc.streaming.stream import main as stream

    exp_dir, _, _, _ = uninterrupted
    wav = small_training_corpus["train"].parent / "train_wav" / "utt-f.wav"
    flac = tmp_path / "utt-f.flac"
    samples, rate = soundfile.read(wav, dtype="float32")
    soundfile.write(flac, samples, rate, subtype="PCM_16")
    by_folder = stream(["--exp-dir", str(exp_dir), "--epoch", "2", "--avg", "1", "--use-averaged-model", "false",
                        "--audio", str(flac), "--history", "2"])
    by_file = stream(["--checkpoint", str(exp_dir / "epoch-2.pt"), "--audio", str(flac), "--history", "2"])
    model = load_trained_model(exp_dir, DecodeOptions(epoch="2", avg=1, use_averaged_model=False)).model
    recognizer = StreamingRecognizer(model, 2, model.config.streaming_chunk_seconds)
    recognizer.accept_waveform(torch.from_numpy(read_audio(flac)))
    recognizer.finish()
    assert by_folder == by_file == recognizer.text
    assert capsys.readouterr().out.count("final: ") == 2
