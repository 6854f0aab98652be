"""One file to text (asr/transcribe.py, asr/audio.py): any audio soundfile reads, a
trained run's weights, from any working directory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import soundfile
import torch
from lhotse import Fbank, FbankConfig

from asr.audio import SAMPLE_RATE, read_audio
from asr.checkpoint import epoch_checkpoint_path, save_checkpoint
from asr.config import load_run_config
from asr.search import ctc_greedy_search
from asr.tokenizer import load_tokenizer
from asr.transcribe import main as transcribe
from zipformer.model import CTCModel

SPEECH = {"utt-1": (1.6, "HELLO WORLD")}


@pytest.fixture(scope="module")
def run(tmp_path_factory, make_cut_corpus):
    """A run as egs/<corpus> leaves it: <root>/exp/m/epoch-1.pt saved with the relative
    train.exp_dir exp/m and train.lang_dir data/lang, plus a 16 kHz wav."""
    root = tmp_path_factory.mktemp("transcribe_run")
    (root / "corpus").mkdir()
    corpus = make_cut_corpus(root / "corpus", train=SPEECH, valid=SPEECH)
    (root / "data").mkdir()
    (root / "data" / "lang").mkdir()
    (root / "data" / "lang" / "tokens.txt").write_text((corpus["lang"] / "tokens.txt").read_text())
    config = load_run_config(None, ["model.preset=tiny", "train.exp_dir=exp/m", "train.lang_dir=data/lang",
                                    "decode.iter=last"])
    torch.manual_seed(3)
    config.model = dataclasses.replace(config.model, vocab_size=29)  # the lexicon's size, as asr.train saves it
    model = CTCModel(config.model)
    exp_dir = root / "exp" / "m"
    exp_dir.mkdir(parents=True)
    save_checkpoint(epoch_checkpoint_path(exp_dir, 1), model=model, config=config.to_dict(), batch_idx_train=1,
                    epoch=1)
    return {"exp_dir": exp_dir, "model": model, "wav": root / "corpus" / "train_wav" / "utt-1.wav",
            "tokenizer": load_tokenizer(root / "data" / "lang")}


def reference_text(run, samples: np.ndarray) -> str:
    """Fbank of the samples -> the saved model's log-probs -> greedy search, by hand."""
    features = torch.from_numpy(Fbank(FbankConfig(num_mel_bins=80)).extract(samples, SAMPLE_RATE))[None]
    with torch.no_grad():
        log_probs, lengths = run["model"].eval().log_probs(features, torch.tensor([features.shape[1]]))
    return run["tokenizer"].decode(ctc_greedy_search(log_probs, lengths, blank_id=0)[0])


def test_a_wav_and_its_flac_give_the_model_s_greedy_text_from_another_directory(run, tmp_path, monkeypatch):
    samples, _ = soundfile.read(run["wav"], dtype="float32")
    flac = tmp_path / "speech.flac"
    soundfile.write(flac, samples, SAMPLE_RATE, subtype="PCM_16")
    monkeypatch.chdir(tmp_path)  # the run's lang dir (data/lang) is relative to its root
    texts = transcribe(["--exp-dir", str(run["exp_dir"]), "--epoch", "1", "--avg", "1",
                        "--use-averaged-model", "false", str(run["wav"]), str(flac)])
    expected = reference_text(run, read_audio(run["wav"]))
    assert texts == {str(run["wav"]): expected, str(flac): reference_text(run, read_audio(flac))}
    assert texts[str(flac)] == expected  # 16-bit PCM either way: the same samples


def test_stereo_float_audio_is_mixed_down(run, tmp_path):
    samples = read_audio(run["wav"])
    stereo = tmp_path / "stereo.wav"
    soundfile.write(stereo, np.stack([samples, samples], axis=1), SAMPLE_RATE, subtype="FLOAT")
    np.testing.assert_array_equal(read_audio(stereo), samples)


def test_other_sample_rates_are_resampled_to_16_khz(tmp_path):
    rate, seconds, frequency = 48000, 0.5, 440.0
    time = np.arange(int(rate * seconds)) / rate
    path = tmp_path / "tone.wav"
    soundfile.write(path, 0.5 * np.sin(2 * np.pi * frequency * time), rate, subtype="PCM_24")
    samples = read_audio(path)
    assert samples.shape == (int(SAMPLE_RATE * seconds),) and samples.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(samples))
    assert np.fft.rfftfreq(samples.size, 1 / SAMPLE_RATE)[spectrum.argmax()] == pytest.approx(frequency, abs=2)


@pytest.mark.parametrize("content, message", [(b"", "cannot read it as audio"), (b"not audio at all", "cannot read it as audio")])
def test_unreadable_files_are_named(tmp_path, content, message):
    path = tmp_path / "broken.wav"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"audio {path}: {message}"):
        read_audio(path, "audio")


def test_a_file_without_samples_is_named(tmp_path):
    path = tmp_path / "empty.wav"
    soundfile.write(path, np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    with pytest.raises(ValueError, match="holds no samples"):
        read_audio(path)


def test_command_errors_are_one_line(run, tmp_path):
    epoch = ["--epoch", "1", "--avg", "1", "--use-averaged-model", "false"]
    with pytest.raises(SystemExit, match="ERROR: audio file: no such file: .*missing.wav"):
        transcribe(["--exp-dir", str(run["exp_dir"]), *epoch, str(tmp_path / "missing.wav")])
    with pytest.raises(SystemExit, match="ERROR: train.exp_dir: experiment folder not found"):
        transcribe(["--exp-dir", str(tmp_path / "nope"), *epoch, str(run["wav"])])
    with pytest.raises(SystemExit, match="llm-greedy-search needs a model decoded by generation"):
        transcribe(["--exp-dir", str(run["exp_dir"]), *epoch, "--method", "llm-greedy-search", str(run["wav"])])
    with pytest.raises(SystemExit, match="'last' asks for the newest checkpoint-\\*.pt"):
        transcribe(["--exp-dir", str(run["exp_dir"]), str(run["wav"])])  # the saved decode.iter=last
