"""Checks of a corpus folder before manifests are made from it.

Lhotse's recipe functions assert or silently skip on a broken corpus; these checks
say which file or folder is wrong and what was expected, before any manifest exists.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

import soundfile as sf
from tqdm import tqdm

from asr.constants import SAMPLE_RATE

PLACE_CORPUS_HINT = (
    "Download it with stage 0, or place or symlink an existing copy there, e.g.\n"
    "  ln -s /path/to/your/{name} {path}"
)


class CorpusError(RuntimeError):
    """The corpus on disk is not what the recipe expects."""


def require_folder(path: Path, name: str) -> None:
    if not Path(path).is_dir():
        raise CorpusError(
            f"corpus folder {path} does not exist.\n"
            + PLACE_CORPUS_HINT.format(name=name, path=path)
        )


def check_audio_files(paths: Iterable[Path], description: str) -> None:
    """Reads every file's header; names the first file that is not readable audio."""
    paths = list(paths)
    for path in tqdm(paths, desc=f"checking audio of {description}", unit="file", mininterval=5):
        try:
            info = sf.info(str(path))
        except Exception as error:  # soundfile raises several types for bad files
            raise CorpusError(f"audio file {path} is not readable audio: {error}") from None
        if info.frames == 0:
            raise CorpusError(f"audio file {path} holds no samples")
        if info.samplerate != SAMPLE_RATE or info.channels != 1:
            raise CorpusError(
                f"audio file {path} is {info.samplerate} Hz with {info.channels} channel(s); the recipes' features "
                f"and models expect {SAMPLE_RATE} Hz mono: convert the corpus first, e.g. "
                f"sox IN.flac -r {SAMPLE_RATE} -c 1 OUT.flac")


def _glob_nonempty(folder: Path, pattern: str, what: str) -> List[Path]:
    files = sorted(folder.rglob(pattern))
    if not files:
        raise CorpusError(f"{folder} holds no {what} ({pattern}): an empty split")
    return files


def check_librispeech(corpus_dir: Path, parts: Sequence[str]) -> None:
    """Each part folder exists and is not empty, every transcript line has its flac,
    every flac has a transcript line, and every flac is readable."""
    corpus_dir = Path(corpus_dir)
    require_folder(corpus_dir, "LibriSpeech")
    for part in parts:
        part_dir = corpus_dir / part
        if not part_dir.is_dir():
            raise CorpusError(
                f"LibriSpeech part folder {part_dir} does not exist; found "
                f"{sorted(p.name for p in corpus_dir.iterdir() if p.is_dir())}. "
                "Set the parts in conf/data.sh or add the missing part."
            )
        transcripts = _glob_nonempty(part_dir, "*.trans.txt", "transcripts")
        transcribed = set()
        for transcript in transcripts:
            for line_number, line in enumerate(transcript.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                utt_id = line.split()[0]
                audio = transcript.parent / f"{utt_id}.flac"
                if not audio.is_file():
                    raise CorpusError(
                        f"{transcript}:{line_number}: utterance {utt_id} has no audio file {audio}"
                    )
                transcribed.add(audio)
        audio_files = _glob_nonempty(part_dir, "*.flac", "audio files")
        untranscribed = [a for a in audio_files if a not in transcribed]
        if untranscribed:
            raise CorpusError(
                f"{len(untranscribed)} audio files of {part_dir} have no transcript line, "
                f"e.g. {untranscribed[0]}"
            )
        check_audio_files(audio_files, f"LibriSpeech {part}")


AISHELL_TRANSCRIPT = Path("data_aishell/transcript/aishell_transcript_v0.8.txt")


def check_aishell(corpus_dir: Path, splits: Sequence[str] = ("train", "dev", "test")) -> None:
    """The transcript exists, every split has transcribed wav files, and every wav is
    readable. Transcript lines without audio and audio without a transcript line are
    logged (the real corpus has a few of the latter; Lhotse skips them)."""
    corpus_dir = Path(corpus_dir)
    require_folder(corpus_dir, "aishell")
    transcript = corpus_dir / AISHELL_TRANSCRIPT
    if not transcript.is_file():
        raise CorpusError(f"AISHELL-1 transcript {transcript} does not exist")
    transcribed_ids = {
        line.split()[0] for line in transcript.read_text(encoding="utf-8").splitlines() if line.strip()
    }
    audio_ids = set()
    for split in splits:
        split_dir = corpus_dir / "data_aishell" / "wav" / split
        if not split_dir.is_dir():
            raise CorpusError(f"AISHELL-1 split folder {split_dir} does not exist")
        wavs = _glob_nonempty(split_dir, "*.wav", "wav files")
        usable = [w for w in wavs if w.stem in transcribed_ids]
        if not usable:
            raise CorpusError(
                f"none of the {len(wavs)} wav files under {split_dir} has a line in {transcript}: "
                "an empty split"
            )
        if len(usable) < len(wavs):
            logging.warning(
                f"{len(wavs) - len(usable)} wav files under {split_dir} have no line in "
                f"{transcript} and are skipped"
            )
        audio_ids.update(w.stem for w in wavs)
        check_audio_files(usable, f"AISHELL-1 {split}")
    without_audio = sorted(transcribed_ids - audio_ids)
    if without_audio:
        logging.warning(
            f"{len(without_audio)} lines of {transcript} have no wav file under "
            f"{corpus_dir / 'data_aishell' / 'wav'} (e.g. {without_audio[0]}); they are skipped"
        )


def check_gigaspeech(corpus_dir: Path, subsets: Sequence[str]) -> None:
    """GigaSpeech.json exists and parses, every subset has audios, and each audio of
    those subsets exists and is readable."""
    corpus_dir = Path(corpus_dir)
    require_folder(corpus_dir, "GigaSpeech")
    metadata_path = corpus_dir / "GigaSpeech.json"
    if not metadata_path.is_file():
        raise CorpusError(f"GigaSpeech metadata {metadata_path} does not exist")
    import ijson  # streaming: the real GigaSpeech.json is several GB

    by_subset: Dict[str, List[Path]] = {subset: [] for subset in subsets}
    try:
        with metadata_path.open("rb") as metadata:
            for audio in ijson.items(metadata, "audios.item"):
                for subset in subsets:
                    if "{" + subset + "}" in audio.get("subsets", []):
                        by_subset[subset].append(corpus_dir / audio["path"])
    except Exception as error:
        raise CorpusError(f"{metadata_path} is not valid GigaSpeech JSON: {error}") from None
    for subset, paths in by_subset.items():
        if not paths:
            raise CorpusError(f"{metadata_path} lists no audio of subset {subset}: an empty split")
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise CorpusError(
                f"{len(missing)} audio files of subset {subset} listed in {metadata_path} "
                f"do not exist, e.g. {missing[0]}"
            )
        check_audio_files(paths, f"GigaSpeech {subset}")


def check_musan(corpus_dir: Path) -> None:
    corpus_dir = Path(corpus_dir)
    require_folder(corpus_dir, "musan")
    for part in ("music", "noise", "speech"):
        part_dir = corpus_dir / part
        if not part_dir.is_dir():
            raise CorpusError(f"MUSAN part folder {part_dir} does not exist")
        check_audio_files(_glob_nonempty(part_dir, "*.wav", "wav files"), f"MUSAN {part}")
