"""local.join_utterances: groups by the rule it states (checked against every split of a
short list), and each long recording is its members' audio back to back with their texts."""

import itertools
import random

import numpy as np
import pytest

from local.join_utterances import group_durations, main


def brute_force(durations, low, high, gap=0.0):
    """Greedy groups from the definition: close a group when the next item would pass
    ``high`` (``gap`` between two items counted); a short last group joins the previous one
    if they fit; keep groups within [low, high]."""
    def length(group):
        return sum(durations[j] for j in group) + gap * (len(group) - 1)

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


def test_too_short_for_any_group_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="cut manifest not found"):
        main([str(tmp_path / "none.jsonl.gz"), str(tmp_path / "long")])
