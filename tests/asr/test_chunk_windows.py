"""Running chunk windows through an encoder (asr.chunk_windows.encode_windows): windows
batched by length give each window the output it gets alone, and no group pads a window
to more than 1 / min_fill of its length."""

import pytest
import torch

from asr.chunk_windows import encode_windows, length_groups


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
