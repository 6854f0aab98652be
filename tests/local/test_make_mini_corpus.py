"""local.make_mini_corpus: miniature corpora in the real layouts, a function of the seed."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pytest
import soundfile as sf

from local.make_mini_corpus import make_aishell, make_gigaspeech, make_librispeech, make_mini, make_musan


def _digest(folder) -> str:
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_librispeech_layout_and_same_seed_same_bytes(tmp_path):
    parts = {"dev-clean": 3, "test-clean": 2}
    first = make_librispeech(tmp_path / "a", parts, seed=11)
    second = make_librispeech(tmp_path / "b", parts, seed=11)
    other = make_librispeech(tmp_path / "c", parts, seed=12)
    assert _digest(first) == _digest(second) != _digest(other)
    flacs = sorted(first.rglob("*.flac"))
    assert len(flacs) == 5
    for flac in flacs:
        speaker, chapter, _ = flac.stem.split("-")
        assert flac.parent == first / flac.parts[-4] / speaker / chapter
        info = sf.info(str(flac))
        assert info.samplerate == 16000 and info.channels == 1 and 1.0 < info.duration < 8.0
        lines = (flac.parent / f"{speaker}-{chapter}.trans.txt").read_text().splitlines()
        text = dict(line.split(" ", 1) for line in lines)[flac.stem]
        assert text == text.upper() and len(text.split()) >= 5


def test_mini_corpus_keeps_test_sentences_out_of_training_and_is_fast(tmp_path):
    began = time.time()
    corpus = make_mini(tmp_path, num_train=300, num_dev=20, num_test=30, utterances_per_speaker_dir=100, seed=0)
    elapsed = time.time() - began

    def texts(part):
        return [line.split(" ", 1)[1] for t in (corpus / part).rglob("*.trans.txt") for line in t.read_text().splitlines()]

    train, dev, test = texts("train-clean-100"), texts("dev-clean"), texts("test-clean")
    assert (len(train), len(dev), len(test)) == (300, 20, 30)
    assert not set(test) & set(train) and not set(dev) & set(train)
    assert len(list((corpus / "train-clean-100").iterdir())) == 3  # speaker folders of 100
    # About 5 ms of synthesis per utterance; flac writing and noise cost a little more.
    assert elapsed / 350 < 0.05, elapsed


def test_aishell_layout_has_transcript_line_per_wav(tmp_path):
    root = make_aishell(tmp_path, {"train": 4, "dev": 2, "test": 2}, speakers_per_split=2, seed=0)
    lines = (root / "data_aishell/transcript/aishell_transcript_v0.8.txt").read_text(encoding="utf-8").splitlines()
    transcript = dict(line.split(" ", 1) for line in lines)
    wavs = sorted((root / "data_aishell/wav").rglob("*.wav"))
    assert sorted(w.stem for w in wavs) == sorted(transcript)
    for wav in wavs:
        assert wav.stem.startswith(f"BAC009{wav.parent.name}W")
        assert sf.info(str(wav)).samplerate == 16000
        assert all("\u4e00" <= c <= "\u9fff" for c in transcript[wav.stem].replace(" ", ""))


def test_gigaspeech_json_matches_its_opus_audio(tmp_path):
    root = make_gigaspeech(tmp_path, {"XL": 2, "DEV": 1}, segments_per_recording=3, seed=4)
    metadata = json.loads((root / "GigaSpeech.json").read_text())
    assert [a["subsets"] for a in metadata["audios"]] == [["{XL}"], ["{XL}"], ["{DEV}"]]
    for audio in metadata["audios"]:
        samples, rate = sf.read(str(root / audio["path"]), dtype="float32")
        assert rate == 16000 and audio["sample_rate"] == 16000
        assert len(samples) / rate == pytest.approx(audio["duration"], abs=0.05)
        assert len(audio["segments"]) == 4
        for segment in audio["segments"]:
            assert 0.0 <= segment["begin_time"] < segment["end_time"] <= audio["duration"]
            piece = samples[int(segment["begin_time"] * rate) : int(segment["end_time"] * rate)]
            loudness = float(np.sqrt(np.mean(piece**2)))
            if segment["text_tn"] == "<SIL>":
                assert loudness < 0.01
            else:
                assert loudness > 0.01, segment
            words = segment["text_tn"].split()
            if len(words) > 1:
                assert words[-1] in {"<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>"}
                assert all(w.isupper() for w in words if not w.startswith("<"))


def test_musan_layout_and_lengths(tmp_path):
    corpus = make_musan(tmp_path, files_per_part=3, seconds=12.0, seed=0)
    for part, source in (("music", "fma"), ("noise", "free-sound"), ("speech", "librivox")):
        wavs = sorted((corpus / part / source).glob("*.wav"))
        assert [w.name for w in wavs] == [f"{part}-{source}-{i:04d}.wav" for i in range(3)]
        assert [round(sf.info(str(w)).duration, 1) for w in wavs] == [12.0, 16.0, 20.0]
    annotations = (corpus / "music/fma/ANNOTATIONS").read_text().splitlines()
    assert [line.split()[0] for line in annotations] == [f"music-fma-{i:04d}" for i in range(3)]


def test_command_line_takes_counts_per_part_and_names_bad_counts(tmp_path, capsys):
    from local.make_mini_corpus import main

    main(["librispeech", "--out-dir", str(tmp_path), "--utterances", "train-clean-100=2,dev-other=1"])
    assert sorted(p.name for p in (tmp_path / "LibriSpeech").iterdir()) == ["dev-other", "train-clean-100"]
    assert len(list((tmp_path / "LibriSpeech").rglob("*.flac"))) == 3
    with pytest.raises(SystemExit):
        main(["aishell", "--out-dir", str(tmp_path), "--utterances", "train=x"])
    assert "--utterances: expected NAME=COUNT items, found 'train=x'" in capsys.readouterr().err


def test_mini_corpus_has_the_same_bytes_for_any_number_of_jobs(tmp_path, monkeypatch):
    import local.make_mini_corpus as corpus_module

    monkeypatch.setattr(corpus_module, "UTTERANCES_PER_SHARD", 7)  # several shards per part
    one = make_mini(tmp_path / "one", num_train=20, num_dev=3, num_test=4, seed=5, num_jobs=1)
    two = make_mini(tmp_path / "two", num_train=20, num_dev=3, num_test=4, seed=5, num_jobs=2)
    assert len(list(one.rglob("*.flac"))) == 27
    assert _digest(one) == _digest(two)
