"""Specifications of the convolutional front end (zipformer/subsampling.py)."""

import pytest
import torch

from zipformer.subsampling import Conv2dSubsampling, subsampled_lengths


@pytest.fixture(scope="module")
def embed():
    torch.manual_seed(0)
    return Conv2dSubsampling(80, 32, 4, 8, 16).eval()


def test_parameter_count_of_the_recipe_front_end():
    # icefall's Zipformer-M log: encoder_embed of Zipformer-M (80 -> 192) has 611,953 parameters.
    assert sum(p.numel() for p in Conv2dSubsampling(80, 192).parameters()) == 611_953


@pytest.mark.parametrize("num_frames", [9, 10, 11, 12, 57, 100, 101, 333])
def test_output_length_is_t_minus_7_halved(embed, num_frames):
    x = torch.randn(2, num_frames, 80)
    y, lens = embed(x, torch.tensor([num_frames, 9]))
    assert y.shape == (2, (num_frames - 7) // 2, 32)
    assert lens.tolist() == [(num_frames - 7) // 2, 1]


def test_subsampled_lengths_formula():
    frames = torch.arange(9, 3000)
    assert torch.equal(subsampled_lengths(frames), (frames - 7) // 2)


def test_valid_outputs_ignore_padding(embed):
    x = torch.randn(1, 60, 80)
    with torch.no_grad():
        alone, _ = embed(x, torch.tensor([60]))
        padded, _ = embed(torch.cat([x, torch.randn(1, 40, 80)], dim=1), torch.tensor([60]))
    assert (padded[:, : alone.shape[1]] - alone).abs().max() < 1e-5


def test_wrong_feature_dimension_is_named(embed):
    with pytest.raises(ValueError, match=r"\(N, T, 80\).*\(2, 50, 40\)"):
        embed(torch.randn(2, 50, 40), torch.tensor([50, 50]))


def test_too_few_frames_is_named(embed):
    with pytest.raises(ValueError, match="at least 9 frames, got 8"):
        embed(torch.randn(1, 8, 80), torch.tensor([8]))
