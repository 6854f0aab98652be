"""Synthesizes miniature corpora in the real directory layouts of LibriSpeech,
AISHELL-1, GigaSpeech and MUSAN, and the English ``mini`` corpus of ``egs/mini``.

Speech comes from espeak-ng (see ``local.espeak_tts``); every corpus is a function of
its seed. The layouts are what Lhotse's recipe functions read, so a recipe's data
stages run on a miniature corpus exactly as on the real one.

    python -m local.make_mini_corpus librispeech --out-dir download --utterances 8
    python -m local.make_mini_corpus mini --out-dir download --train 10000 --test 200
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import random
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence

import numpy as np
import soundfile as sf
from tqdm import tqdm

from local.espeak_tts import TARGET_SAMPLE_RATE, EspeakSynthesizer, Voice
from asr.scoring import GIGASPEECH_GARBAGE_UTTERANCE_TAGS as GIGASPEECH_GARBAGE_TAGS
from local.sentence_grammar import english_sentences, mandarin_sentences
from local.synthetic_audio import (
    ENGLISH_ACCENTS,
    MANDARIN_ACCENTS,
    Rendering,
    Speaker,
    join_with_pauses,
    music_like,
    noise_like,
    random_voice,
    render,
    silence,
)

LIBRISPEECH_DEFAULT_PARTS = ("train-clean-100", "dev-clean", "test-clean")
AISHELL_SPLITS = ("train", "dev", "test")
GIGASPEECH_DEFAULT_SUBSETS = ("XL", "DEV", "TEST")


# Utterances rendered by one fresh synthesizer: espeak-ng's output depends a little on the
# utterances before it, so fixed shards (not the number of jobs) decide a corpus's bytes.
UTTERANCES_PER_SHARD = 500


def _write_librispeech_part(
    part_dir: Path,
    sentences: Sequence[str],
    speaker_ids: Sequence[int],
    speaker: Speaker,
    rng: random.Random,
    same_voice_per_speaker: bool,
    num_jobs: int = 1,
) -> None:
    """Writes ``<spk>/<chapter>/<spk>-<chapter>-<utt>.flac`` and ``<spk>-<chapter>.trans.txt``.

    The random choices are drawn here in a fixed order; the audio is rendered in shards of
    :data:`UTTERANCES_PER_SHARD`, by ``num_jobs`` processes, each shard by a new
    synthesizer: the same bytes for any ``num_jobs``."""
    voices = {spk: random_voice(rng, ENGLISH_ACCENTS) for spk in speaker_ids}
    per_speaker: Dict[int, List[str]] = {spk: [] for spk in speaker_ids}
    for index, sentence in enumerate(sentences):
        per_speaker[speaker_ids[index % len(speaker_ids)]].append(sentence)
    jobs: List[_Utterance] = []
    for spk, spk_sentences in per_speaker.items():
        if not spk_sentences:
            continue
        chapter = 1000 + spk
        chapter_dir = part_dir / str(spk) / str(chapter)
        chapter_dir.mkdir(parents=True, exist_ok=True)
        lines = []
        for utt, sentence in enumerate(spk_sentences):
            utt_id = f"{spk}-{chapter}-{utt:04d}"
            voice = voices[spk] if same_voice_per_speaker else random_voice(rng, ENGLISH_ACCENTS)
            jobs.append(_Utterance(chapter_dir / f"{utt_id}.flac", sentence, voice, speaker.draw()))
            lines.append(f"{utt_id} {sentence.upper()}\n")
        (chapter_dir / f"{spk}-{chapter}.trans.txt").write_text("".join(lines))
    shards = [jobs[start:start + UTTERANCES_PER_SHARD] for start in range(0, len(jobs), UTTERANCES_PER_SHARD)]
    progress = tqdm(total=len(jobs), desc=f"synthesizing {part_dir.name}", unit="utt")
    if num_jobs > 1 and len(shards) > 1:
        context = multiprocessing.get_context("spawn")
        with context.Pool(min(num_jobs, len(shards))) as pool:
            for done in pool.imap_unordered(_render_shard, shards):
                progress.update(done)
    else:
        for shard in shards:
            progress.update(_render_shard(shard))
    progress.close()


class _Utterance(NamedTuple):
    path: Path
    text: str
    voice: Voice
    rendering: Rendering


def _render_shard(utterances: Sequence[_Utterance]) -> int:
    synthesizer = EspeakSynthesizer()
    for utterance in utterances:
        wave = render(synthesizer, utterance.text, utterance.voice, utterance.rendering)
        sf.write(utterance.path, wave, TARGET_SAMPLE_RATE)
    return len(utterances)


def make_librispeech(
    out_dir: Path,
    utterances_per_part: Dict[str, int],
    speakers_per_part: int = 2,
    seed: int = 0,
) -> Path:
    """Writes ``out_dir/LibriSpeech/<part>/...``; returns the ``LibriSpeech`` folder."""
    rng = random.Random(seed)
    speaker = Speaker(EspeakSynthesizer(), rng)
    corpus_dir = Path(out_dir) / "LibriSpeech"
    used: set = set()
    for part_index, (part, count) in enumerate(utterances_per_part.items()):
        sentences = english_sentences(count, rng, exclude=used)
        used.update(sentences)
        speaker_ids = [100 * (part_index + 1) + k for k in range(speakers_per_part)]
        _write_librispeech_part(corpus_dir / part, sentences, speaker_ids, speaker, rng, True)
    return corpus_dir


def make_mini(
    out_dir: Path,
    num_train: int = 10000,
    num_dev: int = 200,
    num_test: int = 200,
    utterances_per_speaker_dir: int = 100,
    seed: int = 0,
    num_jobs: int = 1,
) -> Path:
    """The English corpus of ``egs/mini`` in LibriSpeech layout (train-clean-100,
    dev-clean, test-clean). Test and dev sentences never occur in training (exact
    match), and every utterance gets its own random voice. ``num_jobs`` processes
    synthesize it (the same bytes for any number)."""
    rng = random.Random(seed)
    speaker = Speaker(EspeakSynthesizer(), rng)
    corpus_dir = Path(out_dir) / "LibriSpeech"
    test = english_sentences(num_test, rng)
    dev = english_sentences(num_dev, rng, exclude=test)
    train = english_sentences(num_train, rng, exclude=set(test) | set(dev))
    for part_index, (part, sentences) in enumerate(
        (("test-clean", test), ("dev-clean", dev), ("train-clean-100", train))
    ):
        num_dirs = max(1, -(-len(sentences) // utterances_per_speaker_dir))
        speaker_ids = [1000 * (part_index + 1) + k for k in range(num_dirs)]
        _write_librispeech_part(corpus_dir / part, sentences, speaker_ids, speaker, rng, False, num_jobs)
    return corpus_dir


def make_aishell(
    out_dir: Path,
    utterances_per_split: Dict[str, int],
    speakers_per_split: int = 2,
    seed: int = 0,
) -> Path:
    """Writes ``out_dir/data_aishell/wav/<split>/<spk>/<utt>.wav`` and
    ``data_aishell/transcript/aishell_transcript_v0.8.txt``; returns ``out_dir``
    (the folder that ``prepare_aishell`` takes)."""
    rng = random.Random(seed)
    speaker = Speaker(EspeakSynthesizer(), rng)
    root = Path(out_dir) / "data_aishell"
    transcript_lines = []
    speaker_number = 2
    for split, count in utterances_per_split.items():
        speakers = [f"S{speaker_number + k:04d}" for k in range(speakers_per_split)]
        speaker_number += speakers_per_split
        voices = {spk: random_voice(rng, MANDARIN_ACCENTS) for spk in speakers}
        for index, sentence in enumerate(
            tqdm(mandarin_sentences(count, rng), desc=f"synthesizing aishell {split}", unit="utt")
        ):
            spk = speakers[index % len(speakers)]
            utt_id = f"BAC009{spk}W{index:04d}"
            wav_dir = root / "wav" / split / spk
            wav_dir.mkdir(parents=True, exist_ok=True)
            wave = speaker.say(sentence.replace(" ", ""), voices[spk])
            sf.write(wav_dir / f"{utt_id}.wav", wave, TARGET_SAMPLE_RATE, subtype="PCM_16")
            transcript_lines.append(f"{utt_id} {sentence}\n")
    transcript_dir = root / "transcript"
    transcript_dir.mkdir(parents=True, exist_ok=True)
    (transcript_dir / "aishell_transcript_v0.8.txt").write_text(
        "".join(sorted(transcript_lines)), encoding="utf-8"
    )
    return Path(out_dir)


def _gigaspeech_text(sentence: str, rng: random.Random) -> str:
    """Upper-case words with punctuation tags, as in GigaSpeech's ``text_tn``."""
    words = sentence.upper().split()
    if len(words) > 4 and rng.random() < 0.5:
        words.insert(rng.randint(2, len(words) - 2), "<COMMA>")
    words.append(rng.choice(("<PERIOD>", "<PERIOD>", "<QUESTIONMARK>", "<EXCLAMATIONPOINT>")))
    return " ".join(words)


def make_gigaspeech(
    out_dir: Path,
    recordings_per_subset: Dict[str, int],
    segments_per_recording: int = 4,
    garbage_segments_per_recording: int = 1,
    seed: int = 0,
) -> Path:
    """Writes ``out_dir/GigaSpeech.json`` and its opus files under ``audio/podcast``;
    returns ``out_dir``. Every recording holds speech segments (tags in ``text_tn``)
    and garbage segments (``<MUSIC>``, ``<NOISE>``, ``<SIL>``, ``<OTHER>``)."""
    rng = random.Random(seed)
    speaker = Speaker(EspeakSynthesizer(), rng)
    out_dir = Path(out_dir)
    audios = []
    number = 0
    for subset, count in recordings_per_subset.items():
        for _ in tqdm(range(count), desc=f"synthesizing GigaSpeech {subset}", unit="rec"):
            number += 1
            aid = f"POD{number:010d}"
            voice = random_voice(rng, ENGLISH_ACCENTS)
            kinds = ["speech"] * segments_per_recording + ["garbage"] * garbage_segments_per_recording
            rng.shuffle(kinds)
            pieces, segments, cursor = [silence(0.3)], [], 0.3
            for seg_index, kind in enumerate(kinds):
                if kind == "speech":
                    sentence = english_sentences(1, rng)[0]
                    wave, text = speaker.say(sentence, voice), _gigaspeech_text(sentence, rng)
                else:
                    text = rng.choice(GIGASPEECH_GARBAGE_TAGS)
                    seconds = rng.uniform(1.0, 2.0)
                    wave = music_like(seconds, rng) if text == "<MUSIC>" else (
                        silence(seconds) if text == "<SIL>" else noise_like(seconds, rng)
                    )
                duration = len(wave) / TARGET_SAMPLE_RATE
                segments.append({
                    "sid": f"{aid}_S{seg_index:07d}",
                    "speaker": "N/A",
                    "begin_time": round(cursor, 4),
                    "end_time": round(cursor + duration, 4),
                    "text_tn": text,
                    "subsets": ["{" + subset + "}"],
                })
                gap = silence(rng.uniform(0.2, 0.6))
                pieces += [wave, gap]
                cursor += duration + len(gap) / TARGET_SAMPLE_RATE
            audio = np.concatenate(pieces)
            relative_path = Path("audio") / "podcast" / f"P{number // 100:04d}" / f"{aid}.opus"
            (out_dir / relative_path).parent.mkdir(parents=True, exist_ok=True)
            sf.write(out_dir / relative_path, audio, TARGET_SAMPLE_RATE, format="OGG", subtype="OPUS")
            audios.append({
                "aid": aid,
                "title": f"synthesized podcast {number}",
                "url": "",
                "path": str(relative_path),
                "source": "podcast",
                "category": "Education",
                "sample_rate": TARGET_SAMPLE_RATE,
                "channels": 1,
                "format": "opus",
                "md5": "",
                "duration": round(len(audio) / TARGET_SAMPLE_RATE, 4),
                "subsets": ["{" + subset + "}"],
                "segments": segments,
            })
    metadata = {"dataset": "GigaSpeech (synthesized miniature)", "language": "EN", "audios": audios}
    (out_dir / "GigaSpeech.json").write_text(json.dumps(metadata, indent=1))
    return out_dir


def make_musan(
    out_dir: Path, files_per_part: int = 2, seconds: float = 23.0, seed: int = 0
) -> Path:
    """Writes ``out_dir/musan/{music,noise,speech}/<source>/*.wav`` (with the music
    ``ANNOTATIONS`` file); returns the ``musan`` folder."""
    rng = random.Random(seed)
    speaker = Speaker(EspeakSynthesizer(), rng)
    corpus_dir = Path(out_dir) / "musan"
    folders = {"music": "fma", "noise": "free-sound", "speech": "librivox"}
    for part, source in folders.items():
        part_dir = corpus_dir / part / source
        part_dir.mkdir(parents=True, exist_ok=True)
        annotations = []
        for index in tqdm(range(files_per_part), desc=f"synthesizing musan {part}", unit="file"):
            name = f"{part}-{source}-{index:04d}"
            # Lengths 23, 27, 31 s... leave last windows of 3, 7, 1 s: some kept, some dropped.
            length = seconds + 4.0 * index
            if part == "music":
                wave = music_like(length, rng)
                annotations.append(f"{name} classical N synthesizer\n")
            elif part == "noise":
                wave = noise_like(length, rng)
            else:
                voice = random_voice(rng, ENGLISH_ACCENTS)
                wave = silence(0.0)
                while len(wave) < length * TARGET_SAMPLE_RATE:
                    sentences = english_sentences(3, rng)
                    wave = join_with_pauses([wave] + [speaker.say(s, voice) for s in sentences], rng)
                wave = wave[: int(length * TARGET_SAMPLE_RATE)]
            sf.write(part_dir / f"{name}.wav", wave, TARGET_SAMPLE_RATE, subtype="PCM_16")
        if annotations:
            (part_dir / "ANNOTATIONS").write_text("".join(annotations))
    return corpus_dir


def _split_counts(text: str, names: Sequence[str], what: str) -> Dict[str, int]:
    """``"8"`` gives every name 8; ``"train=20,dev=4"`` gives the listed names."""
    if "=" not in text:
        if not text.isdigit():
            raise ValueError(f"--{what}: expected a count or NAME=COUNT items, found {text!r}")
        return {name: int(text) for name in names}
    counts = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise ValueError(f"--{what}: expected NAME=COUNT items, found {item!r}")
        counts[name.strip()] = int(value)
    return counts


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", choices=("librispeech", "aishell", "gigaspeech", "musan", "mini"))
    parser.add_argument("--out-dir", type=Path, required=True, help="folder that receives the corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--utterances", default="8",
        help="per part: one number for all parts, or NAME=N,... (parts of the real corpus; "
        "recordings for gigaspeech, files for musan)",
    )
    parser.add_argument("--train", type=int, default=10000, help="mini: training utterances")
    parser.add_argument("--dev", type=int, default=200, help="mini: dev utterances")
    parser.add_argument("--test", type=int, default=200, help="mini: test utterances")
    parser.add_argument("--num-jobs", type=int, default=1, help="mini: synthesizing processes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        made = _make(args)
    except ValueError as error:
        parser.error(str(error))
    logging.info(f"wrote {args.corpus} corpus to {made}")


def _make(args: argparse.Namespace) -> Path:
    def counts(names: Sequence[str]) -> Dict[str, int]:
        return _split_counts(args.utterances, names, "utterances")

    if args.corpus == "librispeech":
        return make_librispeech(args.out_dir, counts(LIBRISPEECH_DEFAULT_PARTS), seed=args.seed)
    if args.corpus == "aishell":
        return make_aishell(args.out_dir, counts(AISHELL_SPLITS), seed=args.seed)
    if args.corpus == "gigaspeech":
        return make_gigaspeech(args.out_dir, counts(GIGASPEECH_DEFAULT_SUBSETS), seed=args.seed)
    if args.corpus == "musan":
        return make_musan(args.out_dir, files_per_part=counts(["files"])["files"], seed=args.seed)
    if args.num_jobs < 1:
        raise ValueError(f"--num-jobs must be at least 1, found {args.num_jobs}")
    return make_mini(args.out_dir, args.train, args.dev, args.test, seed=args.seed, num_jobs=args.num_jobs)


if __name__ == "__main__":
    main()
