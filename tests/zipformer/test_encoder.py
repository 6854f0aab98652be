"""Specifications of the Zipformer encoder (zipformer/encoder.py, layer.py, attention.py)."""

import math

import pytest
import torch

from zipformer.attention import CompactRelPositionalEncoding, relative_to_absolute
from zipformer.encoder import (
    REGULARIZER_ATTRIBUTES, SimpleDownsample, ZipformerEncoder, convert_num_channels,
    encoder_output_lengths,
)
from zipformer.presets import get_preset
from zipformer.scaling import ScheduledFloat, set_batch_count


# The six-stack layout of M (downsampling up to 8) at a few hundred thousand parameters.
SIX_STACKS = dict(num_encoder_layers=1, downsampling_factor=(1, 2, 4, 8, 4, 2),
                  feedforward_dim=64, num_heads=2, encoder_dim=(32, 48, 48, 64, 48, 48),
                  encoder_unmasked_dim=32, cnn_module_kernel=5)


@pytest.fixture(scope="module")
def tiny_encoder():
    torch.manual_seed(0)
    return ZipformerEncoder(get_preset("tiny", **SIX_STACKS))


@pytest.mark.parametrize("num_frames", [9, 10, 11, 13, 16, 31, 64, 99, 100, 157, 400])
def test_output_length_formula(tiny_encoder, num_frames):
    tiny_encoder.eval()
    with torch.no_grad():
        y, lens = tiny_encoder(torch.randn(2, num_frames, 80), torch.tensor([num_frames, 9]))
    expected = ((num_frames - 7) // 2 + 1) // 2
    assert y.shape == (2, expected, 64)  # max(encoder_dim)
    assert lens.tolist() == [expected, 1]


def test_output_length_helper_matches_formula():
    frames = torch.arange(9, 5000)
    assert torch.equal(encoder_output_lengths(frames), ((frames - 7) // 2 + 1) // 2)


def test_outputs_at_valid_frames_do_not_depend_on_padding(tiny_encoder):
    tiny_encoder.eval()
    torch.manual_seed(1)
    lengths = [203, 150, 97, 61, 9]  # not multiples of the downsampling factors
    features = torch.randn(len(lengths), 211, 80)
    with torch.no_grad():
        batched, batched_lens = tiny_encoder(features, torch.tensor(lengths))
        for i, length in enumerate(lengths):
            alone, alone_lens = tiny_encoder(features[i:i + 1, :length], torch.tensor([length]))
            valid = int(alone_lens[0])
            assert valid == int(batched_lens[i])
            assert alone.shape[1] == valid
            assert (batched[i, :valid] - alone[0]).abs().max() < 1e-5


def test_every_parameter_gets_a_finite_gradient(tiny_encoder):
    torch.manual_seed(2)
    tiny_encoder.train()
    set_batch_count(tiny_encoder, 30000.0)  # past warm-up: no positional-term skipping
    y, lens = tiny_encoder(torch.randn(3, 120, 80), torch.tensor([120, 100, 60]))
    (y ** 2).sum().backward()
    for name, param in tiny_encoder.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    tiny_encoder.zero_grad()


def test_bf16_autocast_forward_and_backward_on_cpu(tiny_encoder):
    tiny_encoder.train()
    features = torch.randn(2, 80, 80)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = tiny_encoder(features, torch.tensor([80, 70]))
    assert y.dtype == torch.bfloat16
    y.float().pow(2).sum().backward()
    grads = [p.grad for p in tiny_encoder.parameters()]
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    assert sum(g is not None for g in grads) > 0.9 * len(grads)
    tiny_encoder.zero_grad()


def test_wrong_feature_dimension_is_named(tiny_encoder):
    with pytest.raises(ValueError, match=r"\(N, T, 80\), got \(2, 50, 83\)"):
        tiny_encoder(torch.randn(2, 50, 83), torch.tensor([50, 50]))


def test_lengths_longer_than_the_batch_are_named(tiny_encoder):
    with pytest.raises(ValueError, match="length of 51 frames, longer than the batch's 50"):
        tiny_encoder(torch.randn(2, 50, 80), torch.tensor([51, 50]))


def test_lengths_of_the_wrong_shape_are_named(tiny_encoder):
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(3,\)"):
        tiny_encoder(torch.randn(2, 50, 80), torch.tensor([50, 50, 50]))


def test_simple_downsample_repeats_each_utterances_last_frame():
    down = SimpleDownsample(4)
    with torch.no_grad():
        down.bias.copy_(torch.tensor([0.0, 1.0, 2.0, 3.0]))
    x = torch.arange(10.0).view(1, 10, 1).repeat(2, 1, 1)
    with torch.no_grad():
        y, lens = down(x, torch.tensor([10, 6]))
    weights = torch.tensor([0.0, 1.0, 2.0, 3.0]).softmax(0)
    assert lens.tolist() == [3, 2]
    assert y[0, 2, 0] == pytest.approx(float(weights @ torch.tensor([8.0, 9.0, 9.0, 9.0])))
    assert y[1, 1, 0] == pytest.approx(float(weights @ torch.tensor([4.0, 5.0, 5.0, 5.0])))


def test_channel_conversion_truncates_or_zero_pads():
    x = torch.ones(1, 2, 4)
    assert convert_num_channels(x, 3).shape == (1, 2, 3)
    padded = convert_num_channels(x, 6)
    assert padded.shape == (1, 2, 6) and padded[..., 4:].abs().sum() == 0


def test_relative_positional_encoding_depends_on_offset_only():
    encoding = CompactRelPositionalEncoding(16).eval()
    short, long = encoding.embedding(5, "cpu"), encoding.embedding(9, "cpu")
    assert short.shape == (9, 16)
    assert torch.allclose(short, long[4:13])  # offsets -4 .. 4
    assert torch.all(short[:, -1] == 1.0)
    assert torch.allclose(short[4, 0::2], torch.ones(8))  # offset 0: cos(0) = 1


def test_relative_positional_encoding_row_m_embeds_key_minus_query_offset_m_minus_t_plus_1():
    # Written from the definition, in float64: row m is offset d = m - (T - 1), so that
    # relative_to_absolute's entry (i, j), row T-1-i+j, embeds d = j - i (icefall's sign).
    pos_dim, frames = 16, 6
    table = CompactRelPositionalEncoding(pos_dim).embedding(frames, "cpu").double()
    d = torch.arange(2 * frames - 1, dtype=torch.float64) - (frames - 1)
    c = math.sqrt(pos_dim)
    compressed = c * torch.sign(d) * torch.log1p(d.abs() / c)
    angle = torch.atan(compressed * 2 * math.pi / pos_dim)
    for k in range(pos_dim // 2):
        assert torch.allclose(table[:, 2 * k], torch.cos((k + 1) * angle), atol=1e-6)
        if 2 * k + 1 < pos_dim - 1:
            assert torch.allclose(table[:, 2 * k + 1], torch.sin((k + 1) * angle), atol=1e-6)
    assert table[frames, 1] > 0  # offset +1 (key after query): positive sine


def test_relative_to_absolute_reads_offset_query_minus_key():
    frames = 4
    offsets = torch.arange(frames - 1, -frames, -1).float()  # column m holds T-1-m
    scores = relative_to_absolute(offsets.expand(frames, -1).clone())
    expected = torch.arange(frames)[:, None] - torch.arange(frames)[None, :]
    assert torch.equal(scores, expected.float())


def test_sequence_level_skips_follow_the_staggered_schedule():
    with torch.device("meta"):
        encoder = ZipformerEncoder(get_preset("M"))
    encoder.train()
    set_batch_count(encoder, 0.0)
    first = encoder.stacks[0].layers[0].bypass.skip_rate
    assert float(first) == pytest.approx(0.5)
    set_batch_count(encoder, 1e6)
    rates = [float(stack.stack.layers[0].bypass.skip_rate) for stack in encoder.stacks[1:4]]
    assert rates == pytest.approx([0.035 * math.sqrt(f) for f in (2, 4, 8)])


def _regularizer_values(encoder, batch_count):
    """Every regularizer probability of ``encoder`` at ``batch_count``, by module path."""
    values = {}
    for path, owner in encoder.named_modules():
        if isinstance(owner, torch.nn.Dropout):
            values[path] = owner.p
        for name in REGULARIZER_ATTRIBUTES:
            schedule = getattr(owner, name, None)
            if isinstance(schedule, ScheduledFloat):
                values[f"{path}.{name}"] = schedule.value_at(batch_count)
    return values


def test_regularization_scale_multiplies_every_regularizer_once():
    torch.manual_seed(0)
    full = ZipformerEncoder(get_preset("tiny", **SIX_STACKS))
    half = ZipformerEncoder(get_preset("tiny", regularization_scale=0.5, **SIX_STACKS))
    assert half.feature_mask_prob == pytest.approx(full.feature_mask_prob / 2)
    for count in (0.0, 1500.0, 5000.0, 30000.0):
        expected = _regularizer_values(full, count)
        # Skip rates, dropouts, layerdrops of every kind are among them.
        assert sum(v > 0 for v in expected.values()) >= 20
        got = _regularizer_values(half, count)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value / 2), key


def _train_outputs(encoder, seed):
    torch.manual_seed(seed)
    features = torch.randn(3, 120, 80, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([120, 100, 64])
    return encoder(features, lengths)[0]


def test_regularization_scale_zero_makes_training_forward_deterministic():
    torch.manual_seed(0)
    regularized = ZipformerEncoder(get_preset("tiny", **SIX_STACKS)).train()
    torch.manual_seed(0)
    plain = ZipformerEncoder(get_preset("tiny", regularization_scale=0.0, **SIX_STACKS)).train()
    set_batch_count(regularized, 100.0)
    set_batch_count(plain, 100.0)
    with torch.no_grad():
        assert not torch.equal(_train_outputs(regularized, 1), _train_outputs(regularized, 2))
        assert torch.equal(_train_outputs(plain, 1), _train_outputs(plain, 2))


@pytest.mark.parametrize("scale", [-0.1, 1.5])
def test_regularization_scale_out_of_range_is_named(scale):
    with pytest.raises(ValueError, match="regularization_scale"):
        get_preset("tiny", regularization_scale=scale)
