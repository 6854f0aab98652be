"""local.readout_emissions: the tokens a CTC frame argmax emits are the first frames of
its non-blank runs (checked against the collapse done by hand), the nearest emission's
offset, the attention masses and the log-probabilities are the quantities the docstring
defines, computed here from hand-built tensors."""

import math

import pytest
import torch

from local.readout_emissions import ctc_emissions, main, nearest_offset, summary, token_rows


def collapse(ids, blank):
    """CTC's collapse by its definition: merge repeats, then drop blanks."""
    merged = [label for k, label in enumerate(ids) if k == 0 or label != ids[k - 1]]
    return [label for label in merged if label != blank]


@pytest.mark.parametrize("ids", [[0, 2, 2, 0, 2, 3, 3, 0], [5, 5, 0], [0, 0, 0], [1, 2, 1, 2], []])
def test_emissions_are_what_the_collapse_keeps(ids):
    emitted = ctc_emissions(ids, blank=0)
    assert [label for _, label in emitted] == collapse(ids, 0)
    for frame, label in emitted:
        assert ids[frame] == label and (frame == 0 or ids[frame - 1] != label)


def test_nearest_offset():
    ids = torch.tensor([0, 7, 0, 0, 7, 0, 9])
    assert nearest_offset(ids, 3, 7) == 1          # frames 1 (-2) and 4 (+1)
    assert nearest_offset(ids, 1, 7) == 0
    assert nearest_offset(ids, 6, 7) == -2
    assert nearest_offset(torch.tensor([7, 0, 7]), 1, 7) == -1  # a tie: the earlier frame
    assert nearest_offset(ids, 2, 8) is None


def test_token_rows_follow_their_definitions():
    prompt_len, length, vocab, blank = 2, 5, 4, 0
    speech_ids = torch.tensor([0, 2, 2, 0, 3, 1])  # one padding frame past T
    torch.manual_seed(0)
    logits = torch.randn(6, vocab)
    logits[:, blank] += 3.0
    logits[1, 2] += 10.0  # the query readout emits 2 at frame 1 and never 3 within T
    logits[:, 3] -= 10.0
    logits[5, 3] += 40.0  # a padding frame is never read
    log_probs = logits.log_softmax(-1)
    attention = torch.rand(2, 6, prompt_len + 2 * length + 1)
    attention = attention / attention.sum(-1, keepdim=True)
    rows = token_rows(speech_ids, log_probs, attention, length, prompt_len, blank)
    assert [(r["label"], r["offset"]) for r in rows] == [(2, 0), (3, None)]
    for row, frame in zip(rows, (1, 4)):
        label = row["label"]
        assert row["position"] == pytest.approx(frame / length)
        exact = max(float(attention[h, j, prompt_len + frame]) for h in range(2) for j in range(length))
        near = max(sum(float(attention[h, j, prompt_len + k]) for k in range(frame - 1, min(length, frame + 2)))
                   for h in range(2) for j in range(length))
        assert row["attention_exact"] == pytest.approx(exact) and row["attention_pm1"] == pytest.approx(near)
        assert row["log_prob"] == pytest.approx(max(float(log_probs[j, label]) for j in range(length)))
        assert row["margin_over_blank"] == pytest.approx(
            max(float(log_probs[j, label] - log_probs[j, blank]) for j in range(length)))
    assert rows[1]["log_prob"] < math.log(0.01)


def test_summary_counts():
    rows = [{"position": p, "offset": o, "attention_exact": 0.5, "attention_pm1": 0.9, "log_prob": -1.0,
             "margin_over_blank": 0.0, "label": 1} for p, o in ((0.1, 0), (0.3, -7), (0.5, None), (0.99, 2))]
    lines = summary(rows, decode=lambda ids: "x")
    assert lines[0] == ("tokens the speech readout emits: 4; the query readout emits within +-3 frames: 2, "
                        "elsewhere: 1, never: 1")
    table = [line.split("\t") for line in lines[3:8]]
    assert [row[1] for row in table] == ["1", "1", "1", "0", "1"]
    assert table[2][2] == "1" and table[1][4] == "1" and table[4][7] == "1" and table[0][6] == "1"
    assert lines[-1] == "never emitted: 'x'"


def test_refuses_a_zipformer_run(tmp_path):
    from asr.config import RunConfig

    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    torch.save({"config": RunConfig().to_dict(), "model": {}, "batch_idx_train": 1}, exp_dir / "epoch-1.pt")
    with pytest.raises(SystemExit, match="no offline LLM-CTC run"):
        main(["--speech-exp-dir", str(exp_dir), "--query-exp-dir", str(exp_dir), "--cuts", str(tmp_path / "x.gz")])
