"""Join a test set's utterances into long recordings: the long-input test of streaming
LLM-CTC (Sec. 4.3, App. E; egs/mini run.sh stage 10).

    python -m local.join_utterances data/full/fbank/librispeech_cuts_test-clean.jsonl.gz \\
        data/full/long --min-seconds 30 --max-seconds 60

Cuts are taken in manifest order and joined back to back (their own audio, no gap; with
``--gap-seconds G``, G seconds of silence between two sentences, zeros as the synthesized
sentences' own silence) until the next one would pass ``--max-seconds``; a group shorter than ``--min-seconds`` is joined
to the one before it when the two fit, else left out. With ``--phase-seconds P`` every
sentence starts P seconds after a boundary of the streaming chunk grid (``--chunk-seconds``,
2 s as stage 10 decodes): the recording opens with P seconds of silence and each join holds
the shortest silence of at least ``--gap-seconds`` that puts the next sentence there
(the groups made without the opening silence), so that recordings built with different P
hold the same sentences and differ only in where they fall in their chunks (a stream's
sentences start anywhere in a chunk; RESULTS.md, "Where in its chunk a recording's
sentence starts"). Each group becomes one 16 kHz FLAC
file, one recording, one supervision whose text is the group's texts joined by spaces (the
reference of the long decode), and one cut; ``<out_dir>/cuts.jsonl.gz`` lists them and
``<out_dir>/members.tsv`` names the original cuts of each and the second each starts at
in the recording, so a WER of the long decode can be set beside the same sentences decoded
one by one. Everything is written under temporary names and renamed; a finished
``cuts.jsonl.gz`` is kept (the program says so).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from asr.atomic_io import write_text_atomically
from asr.constants import SAMPLE_RATE


def phase_gap(samples: int, gap: int, chunk: int) -> int:
    """The silence (in samples, as every argument) after a sentence of ``samples``: the
    shortest of at least ``gap`` after which the next sentence starts where this one did in
    its ``chunk`` (sentence and silence a whole number of chunks)."""
    return gap + (-(samples + gap)) % chunk


def group_durations(durations: Sequence[float], min_seconds: float, max_seconds: float,
                    gap: float = 0.0, gaps: Optional[Sequence[float]] = None) -> List[List[int]]:
    """Indices of consecutive items in groups of total duration <= ``max_seconds`` (``gap``
    seconds between two items counted, or ``gaps[i]`` after item i); a last group under
    ``min_seconds`` joins the one before when they fit, else it is dropped (as is any group
    under ``min_seconds`` of an item longer than ``max_seconds``)."""
    after = [gap] * len(durations) if gaps is None else list(gaps)
    groups: List[List[int]] = []
    current: List[int] = []
    total = 0.0
    for index, duration in enumerate(durations):
        if current and total + after[index - 1] + duration > max_seconds:
            groups.append(current)
            current = []
        total = (total + after[index - 1] if current else 0.0) + duration
        current.append(index)
    if current:
        groups.append(current)

    def length(group):
        return sum(durations[i] for i in group) + sum(after[i] for i in group[:-1])

    if (len(groups) > 1 and length(groups[-1]) < min_seconds
            and length(groups[-2] + groups[-1]) <= max_seconds):
        groups[-2] += groups.pop()
    return [g for g in groups if min_seconds <= length(g) <= max_seconds]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cuts", type=Path, help="cut manifest with recordings (.jsonl.gz)")
    parser.add_argument("out_dir", type=Path, help="folder for audio/, cuts.jsonl.gz and members.tsv")
    parser.add_argument("--min-seconds", type=float, default=30.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--gap-seconds", type=float, default=0.0,
                        help="seconds of silence between two sentences (default 0: back to back); with "
                             "--phase-seconds the least silence between them")
    parser.add_argument("--phase-seconds", type=float, default=None,
                        help="every sentence starts this many seconds after a boundary of the --chunk-seconds "
                             "grid (the recording opens with that much silence; default: no grid)")
    parser.add_argument("--chunk-seconds", type=float, default=2.0, help="the streaming chunk of --phase-seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if not 0 < args.min_seconds <= args.max_seconds:
        raise SystemExit(f"ERROR: need 0 < --min-seconds <= --max-seconds, got {args.min_seconds} and "
                         f"{args.max_seconds}")
    if not 0 <= args.gap_seconds < args.max_seconds:
        raise SystemExit(f"ERROR: --gap-seconds must be >= 0 and below --max-seconds, got {args.gap_seconds}")
    phase = args.phase_seconds
    if phase is not None and not 0 <= phase < args.chunk_seconds:
        raise SystemExit(f"ERROR: --phase-seconds must be >= 0 and below --chunk-seconds ({args.chunk_seconds}), "
                         f"got {phase}")
    output = args.out_dir / "cuts.jsonl.gz"
    if output.is_file():
        logging.info("long test set: %s exists, skipping", output)
        return
    import soundfile
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    from asr.data import load_cuts_lazy

    try:
        cuts = list(load_cuts_lazy(args.cuts, "cuts"))
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"ERROR: {error}") from None
    if not cuts or not all(cut.has_recording for cut in cuts):
        raise SystemExit(f"ERROR: cuts {args.cuts}: every cut needs its recording (audio) to be joined")
    durations = [cut.duration for cut in cuts]
    gaps, lead = None, 0.0
    if phase is not None:  # whole samples, so that every start lies exactly on its phase
        gap, chunk = round(args.gap_seconds * SAMPLE_RATE), round(args.chunk_seconds * SAMPLE_RATE)
        gaps = [phase_gap(cut.num_samples, gap, chunk) / SAMPLE_RATE for cut in cuts]
        lead = round(phase * SAMPLE_RATE) / SAMPLE_RATE
    # Grouped without the opening silence: the sets of every phase hold the same recordings
    # of the same sentences (each up to --phase-seconds longer than --max-seconds).
    groups = group_durations(durations, args.min_seconds, args.max_seconds, args.gap_seconds, gaps)
    if not groups:
        raise SystemExit(f"ERROR: cuts {args.cuts}: {sum(c.duration for c in cuts):.1f} s in all, no group of "
                         f"{args.min_seconds}-{args.max_seconds} s")
    audio_dir = args.out_dir / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    recordings, supervisions, members = [], [], ["long_id\tduration\tcut_ids\tstarts"]
    for number, group in enumerate(groups):
        pieces, starts, position = [], [], 0
        for index in group:
            silence = lead if not pieces else args.gap_seconds if gaps is None else gaps[index - 1]
            if silence > 0:
                pieces.append(np.zeros(round(silence * SAMPLE_RATE), dtype=np.float32))
                position += pieces[-1].shape[0]
            starts.append(position / SAMPLE_RATE)
            samples = cuts[index].load_audio()
            if cuts[index].sampling_rate != SAMPLE_RATE or samples.shape[0] != 1:
                raise SystemExit(f"ERROR: cut {cuts[index].id}: {samples.shape[0]} channel(s) at "
                                 f"{cuts[index].sampling_rate} Hz, expected one at {SAMPLE_RATE} Hz")
            pieces.append(samples[0])
            position += samples.shape[1]
        name = f"long-{number:03d}"
        path = audio_dir / f"{name}.flac"
        partial = audio_dir / f"{name}.partial.flac"
        soundfile.write(partial, np.concatenate(pieces), SAMPLE_RATE)
        partial.replace(path)
        recording = Recording.from_file(path, recording_id=name)
        text = " ".join(" ".join(s.text for s in cuts[i].supervisions) for i in group)
        recordings.append(recording)
        supervisions.append(SupervisionSegment(id=name, recording_id=name, start=0.0, duration=recording.duration,
                                               channel=0, text=text, language="English"))
        members.append(f"{name}\t{recording.duration:.2f}\t{','.join(cuts[i].id for i in group)}\t"
                       f"{','.join(f'{start:.4f}' for start in starts)}")
    long_cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                                      supervisions=SupervisionSet.from_segments(supervisions))
    write_text_atomically(args.out_dir / "members.tsv", "\n".join(members) + "\n")
    partial = args.out_dir / "cuts.partial.jsonl.gz"
    long_cuts.to_file(partial)
    partial.replace(output)
    used = sum(len(g) for g in groups)
    logging.info("long test set: %d recordings of %.1f-%.1f s from %d of %d cuts, in %s", len(groups),
                 min(r.duration for r in recordings), max(r.duration for r in recordings), used, len(cuts), output)


if __name__ == "__main__":
    main()
