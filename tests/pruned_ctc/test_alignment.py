"""The alignment DP's contract with its input S (M, K): frames are read only through
``frame_offsets`` and ``frame_counts``."""

import pytest
import torch

from pruned_ctc.alignment import align


def packed_batch(seed):
    """Three utterances of 6, 9 and 4 frames over K = 5 classes, packed in S (19, 5)."""
    generator = torch.Generator().manual_seed(seed)
    frame_counts = torch.tensor([6, 9, 4])
    targets = torch.tensor([[1, 2, 2], [3, 1, 4], [2, 0, 0]])
    target_lengths = torch.tensor([3, 3, 1])
    scores = torch.randn(int(frame_counts.sum()), 5, generator=generator, dtype=torch.float64)
    return scores.log_softmax(-1), frame_counts, targets, target_lengths


@pytest.mark.parametrize("beam", [None, 1.0, 4.0])
def test_rows_outside_every_utterance_are_never_read(beam):
    """Utterances stored in another order among NaN rows give the same losses, and the
    occupancy lands on their rows, with zeros elsewhere."""
    packed, frame_counts, targets, target_lengths = packed_batch(seed=3)
    alignable = torch.ones(3, dtype=torch.bool)
    packed_offsets = torch.cumsum(frame_counts, 0) - frame_counts
    expected = align(packed, packed_offsets, frame_counts, targets, target_lengths, alignable,
                     beam, True)

    scattered = torch.full((30, 5), float("nan"), dtype=torch.float64)
    offsets = torch.tensor([20, 2, 13])
    for start, new_start, count in zip(packed_offsets.tolist(), offsets.tolist(),
                                       frame_counts.tolist()):
        scattered[new_start:new_start + count] = packed[start:start + count]
    result = align(scattered, offsets, frame_counts, targets, target_lengths, alignable, beam,
                   True)

    assert not result.excluded.any()
    torch.testing.assert_close(result.losses, expected.losses, rtol=1e-14, atol=0)
    used = torch.zeros(30, dtype=torch.bool)
    for start, new_start, count in zip(packed_offsets.tolist(), offsets.tolist(),
                                       frame_counts.tolist()):
        used[new_start:new_start + count] = True
        torch.testing.assert_close(result.occupancy[new_start:new_start + count],
                                   expected.occupancy[start:start + count], rtol=0, atol=1e-14)
    assert torch.equal(result.occupancy[~used], torch.zeros_like(result.occupancy[~used]))
