"""Running chunk windows through an encoder (asr.chunk_windows.encode_windows): windows
batched by length give each window the output it gets alone, and no group pads a window
to more than 1 / min_fill of its length; each window holds the h seconds before its chunk,
the chunk and a lookahead of the next chunk's first frames, as defined."""

import pytest
import torch

from asr.chunk_windows import chunk_windows, encode_windows, length_groups
from asr.lookahead import lookahead_frames_of


class SummaryEncoder(torch.nn.Module):
    """Every output frame depends on the whole valid input (its mean over the valid
    frames), outputs at half the frame rate: padding read as input, or a wrong length,
    shows in the outputs. Records the (M, L) shapes of the batches it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes = []

    def forward(self, batch: torch.Tensor, lens: torch.Tensor):
        self.shapes.append(tuple(batch.shape[:2]))
        valid = (torch.arange(batch.shape[1])[None] < lens[:, None]).to(batch.dtype)
        mean = (batch * valid[..., None]).sum(1) / lens[:, None].to(batch.dtype)
        out = batch[:, ::2] * 2.0 + mean[:, None]
        return out, (lens + 1) // 2


def test_groups_hold_every_window_once_longest_first_within_their_fill():
    lengths = [210, 1010, 410, 610, 1010, 810, 135, 410, 210, 910]
    groups = length_groups(lengths, min_fill=0.75)
    assert sorted(m for group in groups for m in group) == list(range(len(lengths)))
    longest = [max(lengths[m] for m in group) for group in groups]
    assert longest == sorted(longest, reverse=True)
    for group in groups:
        assert min(lengths[m] for m in group) >= 0.75 * max(lengths[m] for m in group)
    # Greedy: the next group's longest window would not have fitted in the group before.
    for before, after in zip(groups, groups[1:]):
        assert max(lengths[m] for m in after) < 0.75 * max(lengths[m] for m in before)
    assert length_groups(lengths, min_fill=1e-9) == [sorted(range(len(lengths)), key=lambda m: -lengths[m])]
    with pytest.raises(ValueError, match="min_fill"):
        length_groups(lengths, min_fill=0.0)


def test_each_window_gets_its_output_alone_and_padding_stays_within_the_fill():
    torch.manual_seed(0)
    lengths = [210, 1010, 410, 610, 1010, 810, 135, 410, 210]
    windows = [torch.randn(length, 3) for length in lengths]
    encoder = SummaryEncoder()
    outputs = encode_windows(encoder, windows)
    padded = sum(rows * length for rows, length in encoder.shapes)
    assert padded <= sum(lengths) / 0.75
    assert padded < len(lengths) * max(lengths)  # what one padded batch would cost
    for window, output in zip(windows, outputs):
        alone, alone_lens = SummaryEncoder()(window[None], torch.tensor([window.shape[0]]))
        assert output.shape[0] == int(alone_lens[0])
        torch.testing.assert_close(output, alone[0, :int(alone_lens[0])])


@pytest.mark.parametrize("frames, history, lookahead", [(530, 1, 0), (530, 1, 32), (530, 2, 200), (400, 3, 50),
                                                         (130, 1, 20), (232, 0, 32)])
def test_each_window_holds_its_history_its_chunk_and_the_next_chunks_first_frames(frames, history, lookahead):
    features = torch.arange(frames, dtype=torch.float32)[:, None].expand(frames, 2)
    pieces = chunk_windows(features, 2, history, lookahead)
    assert len(pieces) == -(-frames // 200)
    for b, (past, chunk, ahead) in enumerate(pieces):
        start, end = 200 * b, min(200 * b + 200, frames)
        assert past[:, 0].tolist() == list(range(max(0, start - 100 * history), start))
        assert chunk[:, 0].tolist() == list(range(start, end))
        assert ahead[:, 0].tolist() == list(range(end, min(end + lookahead, frames)))
        assert ahead.shape[1] == 2


def test_lookaheads_outside_one_chunk_or_between_frames_are_refused():
    features = torch.zeros(300, 2)
    for frames in (-1, 201):
        with pytest.raises(ValueError, match="lookahead_frames must be between 0 and the 200 frames"):
            chunk_windows(features, 2, 1, frames)
    assert [lookahead_frames_of(s, 2) for s in (0, 0.0, 0.32, 0.5, 2)] == [0, 0, 32, 50, 200]
    for bad in (0.325, -0.01, 2.01, "soon"):
        with pytest.raises(ValueError, match="model.streaming_lookahead_seconds must be"):
            lookahead_frames_of(bad, 2, "model.streaming_lookahead_seconds")
