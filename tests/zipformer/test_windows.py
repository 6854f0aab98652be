"""The Zipformer trained and decoded on chunk windows (model.streaming; paper Sec. 4.3,
App. D.4): each chunk's frames are those of its window (h seconds of history, the chunk,
with a lookahead the next chunk's first frames, ten copies of its last frame) run alone through the same weights as a whole-utterance
model, the frame counts follow sum_b ceil(F_b / 4), training draws h per update, and the
loss is torch's CTC over those frames."""

import dataclasses
import math

import pytest
import torch

from asr.chunk_windows import history_for_step
from asr.config import RunConfig
from zipformer.model import CTCModel
from zipformer.presets import ZipformerConfig, get_preset


def model_pair(vocab_size: int = 30, max_history: int = 2, lookahead_seconds: float = 0.0):
    """A streaming tiny Zipformer and a whole-utterance one with the same weights."""
    torch.manual_seed(3)
    config = get_preset("tiny", vocab_size=vocab_size, regularization_scale=0.0, head_dropout=0.0)
    streaming = CTCModel(dataclasses.replace(config, streaming=True, streaming_max_history=max_history,
                                             streaming_lookahead_seconds=lookahead_seconds))
    whole = CTCModel(config)
    whole.load_state_dict(streaming.state_dict())
    return streaming, whole


def windows_alone(whole: CTCModel, features: torch.Tensor, num_frames: int, history_seconds: int,
                  lookahead: int = 0) -> torch.Tensor:
    """(T', V) log-probs: every 2 s chunk's window built from its definition and run alone
    (with ``lookahead`` frames of the next chunk where there are that many)."""
    parts = []
    for start in range(0, num_frames, 200):
        frames = min(200, num_frames - start)
        history = min(start, 100 * history_seconds)
        window = features[start - history:min(start + frames + lookahead, num_frames)]
        window = torch.cat([window, window[-1:].repeat(10, 1)])
        log_probs, _ = whole.log_probs(window[None], torch.tensor([len(window)]))
        parts.append(log_probs[0, math.ceil(history / 4):math.ceil((history + frames) / 4)])
    return torch.cat(parts)


def test_decoding_runs_each_chunk_from_its_own_window_at_the_longest_history():
    streaming, whole = model_pair(max_history=2)
    streaming.eval(), whole.eval()
    lens = torch.tensor([530, 170, 401])
    features = torch.randn(3, 530, 80, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        log_probs, out_lens = streaming.log_probs(features, lens)
        for n, frames in enumerate(lens.tolist()):
            expected = windows_alone(whole, features[n], frames, history_seconds=2)
            assert int(out_lens[n]) == expected.shape[0] == int(streaming.output_lengths(frames))
            torch.testing.assert_close(log_probs[n, :int(out_lens[n])], expected, rtol=1e-4, atol=1e-4)
    # The whole-utterance model reads later audio: its frames differ (and are fewer).
    assert int(whole.output_lengths(530)) < int(out_lens[0])


@pytest.mark.parametrize("lookahead_seconds", [0.32, 2])
def test_a_lookahead_gives_each_window_the_next_chunks_first_frames_and_no_more(lookahead_seconds):
    streaming, whole = model_pair(max_history=1, lookahead_seconds=lookahead_seconds)
    streaming.eval(), whole.eval()
    lookahead = round(100 * lookahead_seconds)
    lens = torch.tensor([530, 401])
    features = torch.randn(2, 530, 80, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        log_probs, out_lens = streaming.log_probs(features, lens)
        for n, frames in enumerate(lens.tolist()):
            expected = windows_alone(whole, features[n], frames, history_seconds=1, lookahead=lookahead)
            assert int(out_lens[n]) == expected.shape[0] == int(streaming.output_lengths(frames))
            torch.testing.assert_close(log_probs[n, :int(out_lens[n])], expected, rtol=1e-4, atol=1e-4)
        # The first chunk's 50 frames read frames 200 .. 200 + L of the next chunk, not those after.
        after = features.clone()
        after[:, 200 + lookahead:] += 10.0
        moved, _ = streaming.log_probs(after, lens)
        assert torch.equal(moved[:, :50], log_probs[:, :50])
        inside = features.clone()
        inside[:, 200 + lookahead - 4:200 + lookahead] += 10.0
        changed, _ = streaming.log_probs(inside, lens)
        assert (changed[:, :50] - log_probs[:, :50]).abs().max() > 1e-4  # float noise: ~1e-6
        # Without the lookahead the first chunk's frames do not read the second chunk at all.
        plain, _ = model_pair(max_history=1)
        plain.eval()
        before, _ = plain.log_probs(features, lens)
        assert (before[:, :50] - log_probs[:, :50]).abs().max() > 1e-4


@pytest.mark.parametrize("frames", [1, 7, 8, 199, 200, 201, 399, 400, 401, 1234])
def test_output_lengths_count_the_frames_each_chunk_gives(frames):
    streaming, _ = model_pair()
    expected = sum(math.ceil(min(200, frames - start) / 4) for start in range(0, frames, 200))
    assert streaming.output_lengths(frames) == expected
    assert streaming.output_lengths(torch.tensor([frames, frames])).tolist() == [expected, expected]


def test_training_draws_one_history_per_update_and_the_loss_is_ctc_over_its_windows():
    streaming, whole = model_pair(vocab_size=20, max_history=3)
    streaming.train()
    lens = torch.tensor([650, 320])
    features = torch.randn(2, 650, 80, generator=torch.Generator().manual_seed(5))
    targets = [[3, 4, 5, 6, 7, 8], [9, 10, 11]]
    draws = {}
    for update in range(1, 40):
        streaming.start_update(update, float(update))
        draws[update] = streaming.history_seconds()
        assert draws[update] == history_for_step(0, update, 3)
    assert set(draws.values()) == {1, 2, 3}
    update = next(u for u, h in draws.items() if h == 1)
    streaming.start_update(update, float(update))
    loss = streaming(features, lens, targets)
    with torch.no_grad():
        per_utterance = [windows_alone(whole.eval(), features[n], int(lens[n]), history_seconds=1).double()
                         for n in range(2)]
    expected = sum(torch.nn.functional.ctc_loss(lp, torch.tensor(t), torch.tensor([lp.shape[0]]),
                                                torch.tensor([len(t)]), blank=0, reduction="sum")
                   for lp, t in zip(per_utterance, targets))
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=1e-3)
    loss.backward()
    first_layer = next(streaming.encoder.parameters())
    assert first_layer.grad is not None and first_layer.grad.abs().sum() > 0


def test_streaming_settings_are_checked_and_set_per_chunk_features():
    with pytest.raises(ValueError, match="output_downsampling_factor"):
        get_preset("tiny", streaming=True, output_downsampling_factor=1)
    with pytest.raises(ValueError, match="streaming_max_history"):
        get_preset("tiny", streaming=True, streaming_max_history=0)
    for lookahead in (0.005, 2.5, -0.1):
        with pytest.raises(ValueError, match="streaming_lookahead_seconds must be a multiple of 0.01 s between 0 "
                                             "and the 2 s chunk"):
            get_preset("tiny", streaming=True, streaming_lookahead_seconds=lookahead)
    config = RunConfig(model=ZipformerConfig(streaming=True, streaming_chunk_seconds=3))
    assert config.data.feature_chunk_seconds == 3
    assert RunConfig(model=ZipformerConfig()).data.feature_chunk_seconds == 0


def test_onnx_export_refuses_a_model_that_reads_chunk_windows(tmp_path):
    from zipformer.export_onnx import export_model

    streaming, _ = model_pair()
    with pytest.raises(ValueError, match="model.streaming"):
        export_model(streaming, [(f"t{i}", i) for i in range(30)], tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
