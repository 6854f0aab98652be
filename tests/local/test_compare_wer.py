"""local.compare_wer: per-utterance errors against a Levenshtein distance written out here,
and the paired bootstrap against the exact distribution of every equally likely draw on
a three-utterance test set."""

import itertools

import numpy as np
import pytest

from asr.scoring import format_recogs
from local.compare_wer import compare, format_comparisons, main, paired_bootstrap, utterance_errors


def levenshtein(reference, hypothesis):
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != hyp))
    return row[-1]


def test_utterance_errors_are_the_levenshtein_distance():
    pairs = {"a": (["x", "y", "z"], ["x", "z", "w", "v"]), "b": (["p"], []), "c": (["q", "r"], ["q", "r"])}
    assert utterance_errors(pairs, ["a", "b", "c"]).tolist() == [levenshtein(*pairs[k]) for k in "abc"] == [3, 1, 0]


def exact_ratio(first_errors, other_errors):
    if first_errors:
        return other_errors / first_errors
    return np.inf if other_errors else 1.0


def exact_quantiles_and_worse(first, other):
    """The 2.5% and 97.5% quantiles of the ratio (the first atom whose CDF reaches each) and
    P(other makes more errors; ties half) over every equally likely draw."""
    draws = [list(d) for d in itertools.product(range(len(first)), repeat=len(first))]
    ratios = sorted(exact_ratio(first[d].sum(), other[d].sum()) for d in draws)
    cdf = np.arange(1, len(draws) + 1) / len(draws)
    worse = np.mean([(other[d].sum() > first[d].sum()) + 0.5 * (other[d].sum() == first[d].sum()) for d in draws])
    return ratios[int(np.argmax(cdf >= 0.025))], ratios[int(np.argmax(cdf >= 0.975))], worse, ratios


# The second set: a draw of only its error-free second utterance has an infinite ratio.
@pytest.mark.parametrize("first, other, interior", [([1, 2, 1, 3], [2, 1, 0, 4], True), ([1, 0, 2], [0, 3, 2], False)])
def test_the_bootstrap_matches_the_exact_distribution_of_every_draw(first, other, interior):
    first, other = np.array(first), np.array(other)
    exact_low, exact_high, exact_worse, ratios = exact_quantiles_and_worse(first, other)
    low, high, worse = paired_bootstrap(np.full(len(first), 5), first, other, samples=40000, seed=1)
    assert worse == pytest.approx(exact_worse, abs=0.01)
    assert (low, high) == (exact_low, exact_high)
    assert (ratios[0] < low < high < ratios[-1]) == interior


def test_a_decoding_that_doubles_every_utterances_errors_is_twice_as_bad_on_every_resample():
    words, first = np.array([4, 6, 9, 2]), np.array([1, 2, 0, 1])
    low, high, worse = paired_bootstrap(words, first, 2 * first, samples=2000)
    # Worse unless the draw holds only the error-free utterance (a tie): (1/4)^4 of draws.
    assert (low, high) == (2.0, 2.0) and worse == pytest.approx(1 - 0.5 * 0.25 ** 4, abs=0.005)


def write(path, results):
    path.write_text(format_recogs(results))
    return path


def test_compare_reads_recogs_files_and_names_what_does_not_match(tmp_path):
    base = write(tmp_path / "a.txt", [("u1", ["a", "b"], ["a", "b"]), ("u2", ["c", "d", "e"], ["c"])])
    other = write(tmp_path / "b.txt", [("u1", ["a", "b"], ["a", "x"]), ("u2", ["c", "d", "e"], ["c", "d", "e"])])
    rows = compare([base, other], samples=500)
    assert [(r.name, r.words, r.errors) for r in rows] == [("a.txt", 5, 2), ("b.txt", 5, 1)]
    assert rows[1].wer == pytest.approx(20.0) and rows[1].ratio == pytest.approx(0.5)
    assert "| 0.50x |" in format_comparisons(rows)
    fewer = write(tmp_path / "c.txt", [("u1", ["a", "b"], ["a", "b"])])
    with pytest.raises(ValueError, match="hold different cuts .*u2"):
        compare([base, fewer])
    other_ref = write(tmp_path / "d.txt", [("u1", ["a", "q"], ["a"]), ("u2", ["c", "d", "e"], ["c"])])
    with pytest.raises(ValueError, match="other references for cut u1"):
        compare([base, other_ref])
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    same_name = [base.rename(tmp_path / "x" / "r.txt"), other.rename(tmp_path / "y" / "r.txt")]
    assert [r.name for r in compare(same_name, samples=10)] == ["x", "y"]
    with pytest.raises(SystemExit, match="does not exist"):
        main([str(same_name[0]), str(tmp_path / "missing.txt")])


def test_long_recordings_are_paired_with_their_sentences_one_by_one(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet, load_manifest

    from local.compare_wer import read_joined
    from local.join_utterances import main as join

    texts = ["a b", "c d e", "f", "g h", "i j k"]
    recordings, supervisions = [], []
    for n, text in enumerate(texts):
        path = tmp_path / f"u{n}.flac"
        soundfile.write(path, np.zeros(16000, dtype=np.float32), 16000, subtype="PCM_16")
        recordings.append(Recording.from_file(path, recording_id=f"u{n}"))
        supervisions.append(SupervisionSegment(id=f"u{n}", recording_id=f"u{n}", start=0.0, duration=1.0,
                                               channel=0, text=text))
    CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings),
                          supervisions=SupervisionSet.from_segments(supervisions)).to_file(tmp_path / "cuts.jsonl.gz")
    join([str(tmp_path / "cuts.jsonl.gz"), str(tmp_path / "long"), "--min-seconds", "2", "--max-seconds", "3"])
    groups = read_joined(tmp_path / "long")
    sentence_ids = {cut.id: cut.supervisions[0].text.split() for cut in load_manifest(tmp_path / "cuts.jsonl.gz")}
    assert sorted(m for members in groups.values() for m in members) == sorted(sentence_ids)
    hypotheses = {cut_id: words[1:] for cut_id, words in sentence_ids.items()}  # each sentence loses its first word
    one_by_one = write(tmp_path / "sentences.txt", [(c, sentence_ids[c], hypotheses[c]) for c in sentence_ids])
    long_results = []
    for long_id, members in groups.items():
        reference = [w for m in members for w in sentence_ids[m]]
        long_results.append((long_id, reference, reference[1:]))  # only the recording's first word lost
    long_recogs = write(tmp_path / "long.txt", long_results)
    rows = compare([one_by_one, long_recogs], samples=200, joined=groups)
    assert [(r.words, r.errors) for r in rows] == [(11, 5), (11, len(groups))]  # 11 words in 5 sentences
    assert rows[1].ratio == pytest.approx(len(groups) / 5) and rows[1].worse == 0.0
    wrong = write(tmp_path / "wrong.txt", [(long_id, ["x"], []) for long_id in groups])
    with pytest.raises(ValueError, match="other references"):
        compare([one_by_one, wrong], joined=groups)


def test_runs_of_one_decoding_pool_as_one_test_set_with_each_runs_cuts_apart(tmp_path, capsys):
    """Two seeds' files per decoding: the same numbers, resamples included, as one file per
    decoding that holds both runs under prefixed cut ids, written out by hand here."""
    runs = {
        "base": [[("u1", ["a", "b"], ["a", "b"]), ("u2", ["c", "d", "e"], ["c"])],
                 [("u1", ["a", "b"], ["x", "b"]), ("u2", ["c", "d", "e"], ["c", "d", "e"])]],
        "other": [[("u1", ["a", "b"], ["a"]), ("u2", ["c", "d", "e"], ["c", "d"])],
                  [("u1", ["a", "b"], []), ("u2", ["c", "d", "e"], ["c", "y", "e", "z"])]],
    }
    files, by_hand = {}, {}
    for name, seeds in runs.items():
        files[name] = [write(tmp_path / f"{name}{n}.txt", rows) for n, rows in enumerate(seeds)]
        by_hand[name] = write(tmp_path / f"{name}_pooled.txt",
                              [(f"{n}/{cut}", ref, hyp) for n, rows in enumerate(seeds) for cut, ref, hyp in rows])
    pooled = compare([files["base"], files["other"]], samples=300)
    reference = compare([by_hand["base"], by_hand["other"]], samples=300)
    assert [(r.words, r.errors, r.low, r.high, r.worse) for r in pooled] == \
        [(r.words, r.errors, r.low, r.high, r.worse) for r in reference]
    assert [(r.words, r.errors) for r in pooled] == [(10, 3), (10, 6)]  # 0 + 2 + 1 + 0 against 1 + 1 + 2 + 2
    assert pooled[1].name == "other0.txt (+1 runs)"
    with pytest.raises(ValueError, match="same number of pooled runs: 2 in the first, 1 in"):
        compare([files["base"], files["other"][:1]])
    main([",".join(map(str, files["base"])), ",".join(map(str, files["other"])), "--samples", "50"])
    assert "| other0.txt (+1 runs) | 10 | 6 | 60.00% | 2.00x |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="missing.txt does not exist"):
        main([f"{files['base'][0]},{tmp_path / 'missing.txt'}", str(files["other"][0])])


def test_pooled_runs_of_joined_recordings_pair_each_run_with_its_own_sentences(tmp_path):
    groups = {"long1": ["s1", "s2"], "long2": ["s3"]}
    sentences = {"s1": ["a", "b"], "s2": ["c"], "s3": ["d", "e"]}
    one_by_one = [write(tmp_path / f"sent{n}.txt", [(s, ref, ref[:len(ref) - n]) for s, ref in sentences.items()])
                  for n in (0, 1)]  # run 0 makes no errors, run 1 loses each sentence's last word
    long_refs = {long_id: [w for m in members for w in sentences[m]] for long_id, members in groups.items()}
    recordings = [write(tmp_path / f"long{n}.txt", [(c, ref, ref[n:]) for c, ref in long_refs.items()])
                  for n in (0, 1)]  # run 1 loses each recording's first word
    rows = compare([one_by_one, recordings], samples=200, joined=groups)
    assert [(r.words, r.errors) for r in rows] == [(10, 3), (10, 2)]
    assert rows[1].ratio == pytest.approx(2 / 3)
