"""local.join_utterances: groups by the rule it states (checked against every split of a
short list), and each long recording is its members' audio back to back with their texts."""

import itertools
import random

import numpy as np
import pytest

from local.join_utterances import group_durations, main, phase_gap


def brute_force(durations, low, high, gap=0.0, gaps=None):
    """Greedy groups from the definition: close a group when the next item would pass
    ``high`` (``gap`` between two items counted, or ``gaps[i]`` after item i); a short last group joins the previous one if they fit; keep groups
    within [low, high]."""
    def length(group):
        silences = [gap] * (len(group) - 1) if gaps is None else [gaps[j] for j in group[:-1]]
        return sum(durations[j] for j in group) + sum(silences)

    groups, current = [], []
    for i, d in enumerate(durations):
        if current and length(current + [i]) > high:
            groups.append(current)
            current = []
        current.append(i)
    groups.append(current)
    if len(groups) > 1 and length(groups[-1]) < low and length(groups[-2] + groups[-1]) <= high:
        groups[-2] = groups[-2] + groups[-1]
        groups.pop()
    return [g for g in groups if low <= length(g) <= high]


@pytest.mark.parametrize("gap", [0.0, 0.3])
def test_groups_follow_the_rule_on_random_lists(gap):
    rng = random.Random(0)
    for _ in range(300):
        # Unrounded: no sum lands on a bound, where float sums in another order could differ.
        durations = [rng.uniform(0.5, 4.0) for _ in range(rng.randint(1, 12))]
        got = group_durations(durations, 5.0, 9.0, gap)
        assert got == brute_force(durations, 5.0, 9.0, gap)
        assert all(5.0 <= sum(durations[i] for i in g) + gap * (len(g) - 1) <= 9.0 for g in got)
        flat = list(itertools.chain(*got))
        assert flat == sorted(flat) and len(set(flat)) == len(flat)


def test_groups_with_a_silence_of_their_own_after_each_item():
    rng = random.Random(1)
    for _ in range(300):
        durations = [rng.uniform(0.5, 4.0) for _ in range(rng.randint(1, 12))]
        gaps = [rng.uniform(0.0, 2.0) for _ in durations]
        got = group_durations(durations, 5.0, 9.0, gaps=gaps)
        assert got == brute_force(durations, 5.0, 9.0, gaps=gaps)


def test_the_silence_after_a_sentence_keeps_the_next_one_at_its_place_in_the_chunk():
    chunk = 32000
    for samples in [1, 17_999, 32_000, 40_001, 95_999]:
        for gap in [0, 4_800, 31_999, 40_000]:
            silence = phase_gap(samples, gap, chunk)
            # By definition: the least silence >= gap with sentence + silence a whole number of chunks.
            assert silence == next(s for s in range(gap, gap + chunk) if (samples + s) % chunk == 0)


@pytest.mark.parametrize("gap", [0.0, 0.25])
def test_long_recordings_are_their_members_back_to_back(tmp_path, gap):
    soundfile = pytest.importorskip("soundfile")
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet, load_manifest

    rng = np.random.default_rng(0)
    recordings, supervisions, audio = [], [], {}
    for n, seconds in enumerate([1.0, 1.5, 0.5, 2.0, 0.75]):
        samples = (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32)
        path = tmp_path / f"u{n}.flac"
        soundfile.write(path, samples, 16000, subtype="PCM_16")
        audio[f"u{n}"] = soundfile.read(path, dtype="float32")[0]
        recordings.append(Recording.from_file(path, recording_id=f"u{n}"))
        supervisions.append(SupervisionSegment(id=f"u{n}", recording_id=f"u{n}", start=0.0, duration=seconds,
                                               channel=0, text=f"word{n} more"))
    cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                                 supervisions=SupervisionSet.from_segments(supervisions))
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    main([str(tmp_path / "cuts.jsonl.gz"), str(tmp_path / "long"), "--min-seconds", "2", "--max-seconds", "3.4",
          "--gap-seconds", str(gap)])
    joined = list(load_manifest(tmp_path / "long" / "cuts.jsonl.gz"))
    ids = [cut.id for cut in cuts]
    groups = [[ids[i] for i in g] for g in group_durations([1.0, 1.5, 0.5, 2.0, 0.75], 2, 3.4, gap)]
    recording_of = {cut.id: cut.recording.id for cut in cuts}
    # Back to back, three sentences fit 3.4 s; with 0.25 s between them the third would pass it
    # (and the last, alone under 2 s, fits with no group: it is left out).
    assert [[recording_of[c] for c in g] for g in groups] == (
        [["u0", "u1", "u2"], ["u3", "u4"]] if gap == 0 else [["u0", "u1"], ["u2", "u3"]])
    assert len(joined) == 2
    silence = np.zeros(int(16000 * gap), dtype=np.float32)
    for cut, members in zip(joined, groups):
        members = [recording_of[c] for c in members]
        expected = np.concatenate([piece for m in members for piece in (silence, audio[m])][1:])
        np.testing.assert_allclose(cut.load_audio()[0], expected, atol=1 / 32768)
        assert cut.supervisions[0].text == " ".join(f"word{m[1:]} more" for m in members)
    rows = (tmp_path / "long" / "members.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[2].split(",") for row in rows] == groups
    durations = {f"u{n}": seconds for n, seconds in enumerate([1.0, 1.5, 0.5, 2.0, 0.75])}
    for row, members in zip(rows, groups):
        starts = [float(s) for s in row.split("\t")[3].split(",")]
        expected = [sum(durations[recording_of[c]] + gap for c in members[:k]) for k in range(len(members))]
        assert starts == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("phase", [0.0, 0.5, 1.25])
def test_every_sentence_starts_at_the_phase_of_its_chunk(tmp_path, phase):
    """With --phase-seconds each member starts that far after a chunk boundary, after at
    least --gap-seconds of silence (the recording after that much silence), and the
    recording is silence and its members' audio in order."""
    soundfile = pytest.importorskip("soundfile")
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet, load_manifest

    rng = np.random.default_rng(1)
    recordings, supervisions, audio = [], [], {}
    for n, samples in enumerate([16_003, 24_000, 7_777, 32_000, 12_345, 20_001]):
        signal = (0.1 * rng.standard_normal(samples) + 0.2).astype(np.float32)  # never 0
        path = tmp_path / f"u{n}.flac"
        soundfile.write(path, signal, 16000, subtype="PCM_16")
        audio[f"u{n}"] = soundfile.read(path, dtype="float32")[0]
        recordings.append(Recording.from_file(path, recording_id=f"u{n}"))
        supervisions.append(SupervisionSegment(id=f"u{n}", recording_id=f"u{n}", start=0.0,
                                               duration=samples / 16000, channel=0, text=f"w{n}"))
    cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                                 supervisions=SupervisionSet.from_segments(supervisions))
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    audio = {cut.id: audio[cut.recording_id] for cut in cuts}
    main([str(tmp_path / "cuts.jsonl.gz"), str(tmp_path / "long"), "--min-seconds", "3", "--max-seconds", "8.5",
          "--gap-seconds", "0.3", "--phase-seconds", str(phase), "--chunk-seconds", "2"])
    rows = (tmp_path / "long" / "members.tsv").read_text().splitlines()[1:]
    # The same groups at every phase: made without the opening silence.
    assert [row.split("\t")[2] for row in rows] == ["u0-0,u1-1,u2-2,u3-3", "u4-4,u5-5"]
    joined = {cut.recording_id: cut for cut in load_manifest(tmp_path / "long" / "cuts.jsonl.gz")}
    assert sum(len(row.split("\t")[2].split(",")) for row in rows) >= 4
    for row in rows:
        name, _, ids, starts = row.split("\t")
        signal = joined[name].load_audio()[0]
        starts = [round(float(s) * 16000) for s in starts.split(",")]
        expected_end = 0
        for k, (member, start) in enumerate(zip(ids.split(","), starts)):
            assert (start - round(phase * 16000)) % 32000 == 0
            silence = start - expected_end
            assert (silence == round(phase * 16000)) if k == 0 else (4800 <= silence < 4800 + 32000)
            assert not signal[expected_end:start].any()
            np.testing.assert_allclose(signal[start:start + len(audio[member])], audio[member], atol=1 / 32768)
            expected_end = start + len(audio[member])
        assert len(signal) == expected_end


def test_a_phase_outside_the_chunk_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--phase-seconds must be >= 0 and below --chunk-seconds"):
        main([str(tmp_path / "none.jsonl.gz"), str(tmp_path / "long"), "--phase-seconds", "2"])


def test_too_short_for_any_group_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="cut manifest not found"):
        main([str(tmp_path / "none.jsonl.gz"), str(tmp_path / "long")])
