"""local.chunked_encoder_wer: each chunk's frames are those of its own window run alone
(the window built here from its definition in llm_ctc/streaming/encoder.py: h seconds of
history, the chunk, the lookahead's first frames of the next chunk, ten copies of its last
frame), and every setting is scored on the same reference words."""

import math

import pytest
import torch

from local.chunked_encoder_wer import chunked_log_probs, main
from zipformer.model import CTCModel
from zipformer.presets import get_preset


def tiny_zipformer(vocab_size: int) -> CTCModel:
    torch.manual_seed(3)
    return CTCModel(get_preset("tiny", vocab_size=vocab_size)).eval()


@pytest.mark.parametrize("history_seconds, lookahead", [(1, 0), (2, 0), (8, 0), (2, 32)])
def test_each_chunk_is_read_from_its_own_window_alone(history_seconds, lookahead):
    model = tiny_zipformer(30)
    features = torch.randn(530, 80, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = chunked_log_probs(model, features, 530, history_seconds=history_seconds, chunk_seconds=2,
                                lookahead_frames=lookahead)
        expected = []
        for start, frames in ((0, 200), (200, 200), (400, 130)):
            history = min(start, 100 * history_seconds)
            window = features[start - history:min(start + frames + lookahead, 530)]
            window = torch.cat([window, window[-1:].repeat(10, 1)])
            log_probs, _ = model.log_probs(window[None], torch.tensor([len(window)]))
            expected.append(log_probs[0, math.ceil(history / 4):math.ceil((history + frames) / 4)])
    assert got.shape[0] == math.ceil(530 / 4)
    torch.testing.assert_close(got, torch.cat(expected), rtol=1e-4, atol=1e-4)


def test_every_setting_is_scored_on_the_same_words(small_training_corpus, tmp_path, capsys):
    from asr.tokenizer import load_tokenizer

    vocab_size = load_tokenizer(small_training_corpus["lang"]).vocab_size
    model = tiny_zipformer(vocab_size)
    checkpoint = tmp_path / "epoch-1.pt"
    torch.save({"config": {"model": model.config.to_dict()}, "model": model.state_dict()}, checkpoint)
    output = tmp_path / "table.tsv"
    main([str(checkpoint), str(small_training_corpus["train"]), "--lang-dir", str(small_training_corpus["lang"]),
          "--history", "1", "2", "--output", str(output), "--recogs-dir", str(tmp_path / "recogs")])
    rows = [line.split("\t") for line in output.read_text().splitlines()]
    assert rows[0] == ["setting", "WER (%)", "errors", "words"]
    assert [row[0] for row in rows[1:]] == ["whole, stored features", "whole, per-chunk features",
                                            "chunked, h = 1 s", "chunked, h = 2 s"]
    words = 2 + 2 + 3 + 3 + 2 + 3  # the six training transcripts
    assert all(int(row[3]) == words for row in rows[1:])
    assert all(float(row[1]) == pytest.approx(100 * int(row[2]) / words, abs=0.005) for row in rows[1:])
    assert capsys.readouterr().out.strip() == output.read_text().strip()
    # Each setting's hypotheses, as recogs- files, score to the table's errors (kaldialign).
    import kaldialign

    from asr.scoring import read_recogs

    names = {"whole, stored features": "whole-stored-features", "whole, per-chunk features":
             "whole-per-chunk-features", "chunked, h = 1 s": "chunked-h1s", "chunked, h = 2 s": "chunked-h2s"}
    for row in rows[1:]:
        recogs = read_recogs(tmp_path / "recogs" / f"recogs-{names[row[0]]}.txt")
        assert len(recogs) == 6
        errors = sum(kaldialign.edit_distance(ref, hyp)["total"] for ref, hyp in recogs.values())
        assert errors == int(row[2]), row
    with pytest.raises(SystemExit):
        main([str(checkpoint), str(small_training_corpus["train"]), "--lang-dir", "x", "--history", "-1"])
    with pytest.raises(SystemExit):
        main([str(checkpoint), str(small_training_corpus["train"]), "--lang-dir", "x", "--lookahead-seconds", "0.005"])
    assert "--lookahead-seconds must be a multiple of 0.01 s" in capsys.readouterr().err
