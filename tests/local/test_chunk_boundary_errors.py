"""local.chunk_boundary_errors: word spans from a path built into the log-probabilities,
distances and rows worked out by hand, errors that add up to kaldialign's edit distance."""

import pytest
import torch

from local.chunk_boundary_errors import (CUT, ONE_CHUNK, bin_order, boundary_distance, count_by_bin, distance_bin,
                                         main, signed_boundary_distance, word_spans)


def test_word_spans_follow_the_best_path():
    path = [0, 1, 1, 0, 2, 0, 0, 3, 0, 0]
    log_probs = torch.full((10, 4), -10.0)
    log_probs[torch.arange(10), torch.tensor(path)] = 0.0
    spans = word_spans(log_probs.log_softmax(-1), [[1, 2], [3]], blank_id=0, seconds_per_frame=0.04)
    assert spans == [pytest.approx((0.04, 0.20)), pytest.approx((0.28, 0.32))]


def test_distances_to_the_nearest_boundary():
    assert boundary_distance((1.5, 1.7), duration=3.0, chunk_seconds=2.0) == pytest.approx(0.3)
    assert boundary_distance((1.9, 2.1), duration=3.0, chunk_seconds=2.0) == 0.0
    assert boundary_distance((3.2, 3.5), duration=5.0, chunk_seconds=2.0) == pytest.approx(0.5)  # from 4 s
    assert boundary_distance((0.1, 0.5), duration=2.0, chunk_seconds=2.0) is None  # one chunk: no boundary
    assert boundary_distance((0.1, 0.5), duration=1.2, chunk_seconds=2.0) is None


def test_signed_distances_name_the_side_of_the_nearest_boundary():
    assert signed_boundary_distance((1.5, 1.7), duration=3.0, chunk_seconds=2.0) == pytest.approx(-0.3)
    assert signed_boundary_distance((2.2, 2.6), duration=3.0, chunk_seconds=2.0) == pytest.approx(0.2)
    assert signed_boundary_distance((1.9, 2.1), duration=3.0, chunk_seconds=2.0) == 0.0
    # Between two boundaries the nearer one decides: 0.4 s after 2 s, 0.3 s before 4 s.
    assert signed_boundary_distance((2.4, 3.7), duration=5.0, chunk_seconds=2.0) == pytest.approx(-0.3)
    assert signed_boundary_distance((2.3, 3.5), duration=5.0, chunk_seconds=2.0) == pytest.approx(0.3)
    assert signed_boundary_distance((0.1, 0.5), duration=2.0, chunk_seconds=2.0) is None


def test_rows():
    edges = [0.25, 0.5]
    assert [distance_bin(d, edges) for d in (0.0, 0.2, 0.25, 0.49, 0.5, 3.0, None)] == \
        [CUT, "< 0.25 s", "0.25-0.5 s", "0.25-0.5 s", ">= 0.5 s", ">= 0.5 s", ONE_CHUNK]
    assert bin_order(edges) == [CUT, "< 0.25 s", "0.25-0.5 s", ">= 0.5 s", ONE_CHUNK]
    assert [distance_bin(d, edges, sides=True) for d in (0.0, -0.2, 0.2, -0.3, 0.49, -0.5, 3.0, None)] == \
        [CUT, "before, < 0.25 s", "after, < 0.25 s", "before, 0.25-0.5 s", "after, 0.25-0.5 s", ">= 0.5 s",
         ">= 0.5 s", ONE_CHUNK]
    assert bin_order(edges, sides=True) == [CUT, "before, < 0.25 s", "before, 0.25-0.5 s", "after, < 0.25 s",
                                            "after, 0.25-0.5 s", ">= 0.5 s", ONE_CHUNK]


def test_errors_belong_to_their_words_and_insertions_to_the_word_before():
    bins = {"u1": ["near", "far", "far"], "u2": ["one"]}
    results = {"u1": (["a", "b", "c"], ["x", "b", "y", "c"]),  # a substituted, y inserted after b
               "u2": (["d"], ["e", "d"])}  # an insertion before the first word
    counts = count_by_bin(results, bins)
    assert counts == {("near", "words"): 1, ("near", "errors"): 1, ("far", "words"): 2, ("far", "errors"): 1,
                      ("one", "words"): 1, ("one", "errors"): 1}
    with pytest.raises(KeyError, match="u3"):
        count_by_bin({"u3": (["a"], ["a"])}, bins)
    with pytest.raises(ValueError, match="u2"):
        count_by_bin({"u2": (["a", "b"], ["a"])}, bins)


def test_the_table_counts_every_word_once(small_training_corpus, tmp_path, capsys):
    import kaldialign

    from asr.scoring import format_recogs
    from asr.tokenizer import load_tokenizer
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset

    tokenizer = load_tokenizer(small_training_corpus["lang"])
    torch.manual_seed(3)
    model = CTCModel(get_preset("tiny", vocab_size=tokenizer.vocab_size)).eval()
    checkpoint = tmp_path / "epoch-1.pt"
    torch.save({"config": {"model": model.config.to_dict()}, "model": model.state_dict()}, checkpoint)
    references = {"utt-a": "HELLO WORLD", "utt-b": "PRUNED CTC", "utt-c": "A SMALL TEST",
                  "utt-d": "QUICK BROWN FOX", "utt-e": "JUMPS OVER", "utt-f": "THE LAZY DOG"}
    decodes = {"good": {cut: text for cut, text in references.items()},
               "bad": {**references, "utt-c": "A TEST TEST EXTRA", "utt-f": "LAZY"}}
    arguments = [str(checkpoint), "--cuts", str(small_training_corpus["train"]), "--lang-dir",
                 str(small_training_corpus["lang"]), "--chunk-seconds", "0.5", "--output", str(tmp_path / "t.md")]
    for name, hypotheses in decodes.items():
        rows = [(cut, references[cut].split(), hypothesis.split()) for cut, hypothesis in hypotheses.items()]
        (tmp_path / f"{name}.txt").write_text(format_recogs(rows))
        arguments += ["--recogs", f"{name}={tmp_path / f'{name}.txt'}"]
    main(arguments)
    table = capsys.readouterr().out
    assert table == (tmp_path / "t.md").read_text()
    last = table.strip().splitlines()[-1].split(" | ")
    bad_errors = sum(kaldialign.edit_distance(references[c].split(), h.split())["total"]
                     for c, h in decodes["bad"].items())
    assert last == ["| all", "15", "0", f"{bad_errors} |"]
    rows = [line.split(" | ") for line in table.strip().splitlines()[2:-1]]
    assert sum(int(row[1]) for row in rows) == 15
    with pytest.raises(SystemExit):
        main(arguments[:6] + ["--recogs", "nofile"])
    # Cuts without stored features (local.join_utterances' recordings): the whole audio's
    # fbank, as the stored features were computed, places the words the same.
    from lhotse import load_manifest

    from local.chunk_boundary_errors import whole_audio_features
    from lhotse.dataset.input_strategies import PrecomputedFeatures

    cuts = load_manifest(small_training_corpus["train"])
    computed, computed_lens = whole_audio_features(cuts)
    stored, stored_lens = PrecomputedFeatures()(cuts)
    assert torch.equal(computed_lens, stored_lens.to(computed_lens.dtype))
    assert (computed - stored).abs().max() < 0.05, (computed - stored).abs().max()
    audio_only = tmp_path / "audio_only.jsonl.gz"
    cuts.drop_features().to_file(audio_only)
    arguments[2] = str(audio_only)
    main(arguments)
    assert capsys.readouterr().out == table
    # --sides splits each row near a boundary in two that add up to it.
    main(arguments + ["--sides"])
    sided = {line.split(" | ")[0][2:]: [int(cell.split()[0]) for cell in line.strip(" |").split(" | ")[1:]]
             for line in capsys.readouterr().out.strip().splitlines()[2:]}
    plain = {line.split(" | ")[0][2:]: [int(cell.split()[0]) for cell in line.strip(" |").split(" | ")[1:]]
             for line in table.strip().splitlines()[2:]}
    for row, cells in plain.items():
        parts = [cells_ for name, cells_ in sided.items() if name == row or name.endswith(f", {row}")]
        assert [sum(column) for column in zip(*parts)] == cells, (row, sided)
    assert any(name.startswith("before") for name in sided) and any(name.startswith("after") for name in sided)
    assert set(sided) - set(plain) <= {f"{side}, {row}" for side in ("before", "after") for row in plain}
    # Cut ids are how the recogs name their words: the same id in two --cuts is refused.
    with pytest.raises(SystemExit, match="both"):
        main(arguments[:2] + [str(audio_only), str(small_training_corpus["train"])] + arguments[3:])


def test_decode_folders_give_the_recogs_of_their_best_setting(tmp_path):
    from asr.scoring import save_results
    from local.chunk_boundary_errors import decode_recogs

    results = {"a": [("u1", ["x", "y"], ["x", "y"])], "b": [("u1", ["x", "y"], ["x"])]}
    keys = {"ctc-prefix-beam-search_beam-4": results["b"], "ctc-prefix-beam-search_beam-8": results["a"],
            "ctc-greedy-search": results["a"],
            "ctc-streaming-prefix-beam-search_beam-4_history-2s": results["b"],
            "ctc-streaming-prefix-beam-search_beam-4_history-8s": results["a"]}
    for test_set in ("dev", "test"):
        save_results(tmp_path, test_set, keys, suffix="iter-10_avg-1")
    assert decode_recogs(tmp_path, ["dev", "test"]) == [
        tmp_path / f"recogs-{s}-ctc-prefix-beam-search_beam-8-iter-10_avg-1.txt" for s in ("dev", "test")]
    assert decode_recogs(tmp_path, ["dev"], history=2) == [
        tmp_path / "recogs-dev-ctc-streaming-prefix-beam-search_beam-4_history-2s-iter-10_avg-1.txt"]
    with pytest.raises(ValueError, match="history-4s"):
        decode_recogs(tmp_path, ["dev"], history=4)
    with pytest.raises(FileNotFoundError, match="decode it first"):
        decode_recogs(tmp_path, ["valid"])
