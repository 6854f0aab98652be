"""local.boundary_repeats: output words placed by the layout's definition (chunk, place in
the chunk, tau of their first token's query frame), the doubled words, the sides of a
boundary, and the greedy frames equal to the chunk-by-chunk recognizer's greedy output."""

import pytest
import torch

from llm_ctc.streaming.layout import FrameRateGrid, utterance_layout
from local.boundary_repeats import (Word, boundary_side, doubled, greedy_frames, is_seam_repeat, main,
                                    near_boundary_rows, output_words, seam_merged, summary)
from references.tiny_llm import random_features

PIECES = {1: " the", 2: " cat", 3: "s", 4: " sat", 5: " mat"}
BLANK = 0


def decode(ids):
    return "".join(PIECES[i] for i in ids).strip()


def collapse(ids, blank):
    """CTC's collapse by its definition: merge repeats, then drop blanks."""
    merged = [label for k, label in enumerate(ids) if k == 0 or label != ids[k - 1]]
    return [label for label in merged if label != blank]


def test_output_words_are_placed_by_the_layout():
    # 8 feature frames per embedding: a full 2 s chunk gives 25 query frames, 150 frames 19.
    layout = utterance_layout(3, [200, 150], FrameRateGrid(8))
    ids = [BLANK] * 44
    ids[3], ids[10], ids[11], ids[23] = 1, 2, 3, 4   # the, cat+s (one word), sat late in chunk 0
    ids[24], ids[26] = 4, 4                           # sat held into frame 24; sat again at chunk 1's frame 1
    ids[40] = 5
    words = output_words(ids, layout, BLANK, decode)
    assert [w.text for w in words] == ["the", "cats", "sat", "sat", "mat"]
    # By the definition: frame t of the concatenated query outputs is chunk t // 25's
    # frame t % 25, at tau = 200 * chunk + 8 * (t % 25) ticks.
    for word, frame in zip(words, (3, 10, 23, 26, 40)):
        chunk, place = frame // 25, frame % 25
        assert (word.chunk, word.frame_in_chunk, word.chunk_frames, word.tau) == \
            (chunk, place, (25, 19)[chunk], 200 * chunk + 8 * place)
    pairs = doubled(words)
    assert [(a.text, a.chunk, b.chunk) for a, b in pairs] == [("sat", 0, 1)]
    assert len(collapse(ids, BLANK)) == 6  # the, cat, s, sat, sat, mat: 5 words
    with pytest.raises(ValueError, match="43 frame ids for a layout of 44"):
        output_words(ids[:-1], layout, BLANK, decode)


def test_boundary_sides_and_who_writes_the_words_near_it():
    assert boundary_side((1.5, 2.0), 2.0) == "before"
    assert boundary_side((1.9, 2.1), 2.0) == "cut"
    assert boundary_side((2.0, 2.3), 2.0) == "after"
    reference = ["a", "bird", "sang", "far", "away"]
    spans = [(0.2, 0.4), (1.6, 1.9), (1.95, 2.2), (2.1, 2.4), (2.6, 3.0)]
    words = [Word("a", 0, 2, 25, 16), Word("bird", 0, 20, 25, 160), Word("sang", 0, 23, 25, 184),
             Word("sang", 1, 1, 20, 208), Word("away", 1, 8, 20, 264)]
    rows = near_boundary_rows(words, reference, spans, duration=3.2, chunk_seconds=2, near=0.32)
    # "a" is more than 0.5 s before the boundary and "away" starts 0.6 s after it: not near.
    assert rows == [("before", "earlier chunk"), ("cut", "both"), ("after", "neither")]
    lines = summary(doubled(words), ["cut"], rows, num_words=len(words), errors=(5, 1, 0))
    assert lines[0] == ("output words 5; written twice: 1; across a chunk boundary: 1 (first copy in the last 4 "
                        "frames of its chunk: 1; second copy in the first 4 frames of the next chunk: 1; "
                        "seam repeats: 1)")
    assert lines[1] == ("greedy output: 1 errors on 5 reference words (20.00%); with the seam repeats written "
                        "once: 0 (0.00%)")
    assert lines[2] == "across a boundary, the word against it: before 0, cut 1, after 0"
    assert "| cut | 1 | 0 | 0 | 1 | 0 |" in lines


def test_seam_repeats_by_their_definition():
    # 25 frames per full chunk: frame 21 is 4 from the end, frame 20 five.
    def word(text, chunk, frame):
        return Word(text, chunk, frame, 25, 200 * chunk + 8 * frame)

    assert is_seam_repeat(word("a", 0, 21), word("a", 1, 3), 4)
    assert not is_seam_repeat(word("a", 0, 20), word("a", 1, 3), 4)   # too early in its chunk
    assert not is_seam_repeat(word("a", 0, 21), word("a", 1, 4), 4)   # too late in the next
    assert not is_seam_repeat(word("a", 0, 24), word("a", 2, 0), 4)   # not the next chunk
    assert is_seam_repeat(word("a", 0, 20), word("a", 1, 4), 5)
    words = [word("the", 0, 3), word("cat", 0, 22), word("Cat", 1, 1), word("sat", 1, 9), word("sat", 1, 12),
             word("on", 1, 24), word("on", 2, 0)]
    kept = seam_merged(words, 4)
    # The repeats across the seams go; "sat sat" within one chunk stays.
    assert [w.text for w in kept] == ["the", "cat", "sat", "sat", "on"]
    assert kept[1] is words[1] and kept[4] is words[5]


def test_greedy_frames_are_the_chunk_by_chunk_greedy_output(ctc_model):
    from llm_ctc.streaming.recognizer import recognize_streaming

    features, lens = random_features([610, 230], seed=12)
    with torch.no_grad():
        frames, layouts = greedy_frames(ctc_model, features, lens, history=1)
        ids, _, _ = recognize_streaming(ctc_model, features, lens, history_seconds=1)
    # 610 frames: chunks of 200, 200, 200 and 10 frames, 25 + 25 + 25 + ceil(10 / 8) query
    # frames; 230: 25 + ceil(30 / 8).
    assert [len(f) for f in frames] == [layout.num_frames for layout in layouts] == [77, 29]
    assert [collapse(f, ctc_model.blank_id) for f in frames] == ids


def test_refuses_an_offline_run(tmp_path):
    from asr.config import RunConfig

    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    torch.save({"config": RunConfig().to_dict(), "model": {}, "batch_idx_train": 1}, exp_dir / "epoch-1.pt")
    with pytest.raises(SystemExit, match="no streaming LLM-CTC run"):
        main([str(exp_dir), "--cuts", str(tmp_path / "x.gz")])
    with pytest.raises(SystemExit, match="--seam-frames must be >= 1"):
        main([str(exp_dir), "--cuts", str(tmp_path / "x.gz"), "--seam-frames", "0"])
    with pytest.raises(SystemExit, match="--zipformer and --lang-dir go together"):
        main([str(exp_dir), "--cuts", str(tmp_path / "x.gz"), "--zipformer", str(tmp_path / "z.pt")])


def test_word_spans_of_cuts_without_stored_features(small_training_corpus, tmp_path):
    """The recordings of local.join_utterances carry audio only: their words are placed by
    the forced alignment of the whole audio's fbank, the same spans as from stored features."""
    from lhotse import load_manifest

    from asr.tokenizer import load_tokenizer
    from local.boundary_repeats import aligned_spans
    from zipformer.model import CTCModel
    from zipformer.presets import get_preset

    tokenizer = load_tokenizer(small_training_corpus["lang"])
    torch.manual_seed(3)
    zipformer = CTCModel(get_preset("tiny", vocab_size=tokenizer.vocab_size)).eval()
    cuts = list(load_manifest(small_training_corpus["train"]))[:4]
    with torch.inference_mode():
        stored = aligned_spans((zipformer, tokenizer), cuts)
        audio_only = aligned_spans((zipformer, tokenizer), [cut.drop_features() for cut in cuts])
    assert audio_only == stored
    for cut, spans in zip(cuts, stored):
        words = " ".join(s.text for s in cut.supervisions).split()
        assert len(spans) == len(words) and all(0 <= a < b <= cut.duration + 0.04 for a, b in spans)
        assert all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))
