"""Specifications of the model configuration (zipformer/presets.py)."""

import pytest

from asr.config import load_run_config
from zipformer.presets import PRESETS, ZipformerConfig, config_from_dict, get_preset


def test_presets_hold_the_icefall_sizes():
    small, medium, large = get_preset("S"), get_preset("M"), get_preset("L")
    assert medium == ZipformerConfig()
    assert small.num_encoder_layers == (2, 2, 2, 2, 2, 2)
    assert medium.encoder_dim == (192, 256, 384, 512, 384, 256)
    assert large.feedforward_dim == (512, 768, 1536, 2048, 1536, 768)
    assert large.encoder_unmasked_dim == (192, 192, 256, 320, 256, 192)
    for config in (small, medium, large):
        assert config.downsampling_factor == (1, 2, 4, 8, 4, 2)
        assert config.num_heads == (4, 4, 4, 8, 4, 4)
        assert config.cnn_module_kernel == (31, 31, 15, 15, 15, 31)
    assert (small.output_dim, medium.output_dim, large.output_dim) == (256, 512, 768)


def test_unknown_preset_names_the_value_and_the_valid_names():
    with pytest.raises(ValueError, match=r"'XL'.*S, M, L, mini, tiny"):
        get_preset("XL")
    with pytest.raises(ValueError, match="'XXL'"):
        config_from_dict({"preset": "XXL"})


def test_keyword_overrides_and_single_values_broadcast_to_every_stack():
    config = get_preset("S", vocab_size=4336, cnn_module_kernel=15)
    assert config.vocab_size == 4336
    assert config.cnn_module_kernel == (15,) * 6


def test_per_stack_lists_of_the_wrong_length_are_named():
    with pytest.raises(ValueError, match="num_heads has 5 entries, expected one per stack"):
        get_preset("M", num_heads=(4, 4, 4, 8, 4))


def test_invalid_values_are_named():
    with pytest.raises(ValueError, match="unknown loss 'dense'"):
        get_preset("M", loss="dense")
    with pytest.raises(ValueError, match="encoder_unmasked_dim 300"):
        get_preset("M", encoder_unmasked_dim=(192, 192, 256, 300, 256, 192),
                   encoder_dim=(192, 256, 384, 256, 384, 256))
    with pytest.raises(ValueError, match=r"unknown model option\(s\) \['encoder_dims'\]"):
        config_from_dict({"encoder_dims": 3})


def test_command_line_overrides_are_typed_by_the_field():
    config = load_run_config(None, ["model.encoder_dim=192,256,256,256,256,256", "model.alignment_beam=20",
                                    "model.loss=standard", "model.chunk-size=1024"]).model
    assert (config.encoder_dim, config.alignment_beam, config.loss, config.chunk_size) == (
        (192, 256, 256, 256, 256, 256), 20.0, "standard", 1024)
    assert load_run_config(None, ["model.alignment_beam=none"]).model.alignment_beam is None
    with pytest.raises(ValueError, match="unknown model option 'beem'"):
        load_run_config(None, ["model.beem=3"])
    with pytest.raises(ValueError, match="not of the form <section>.<field>=<value>"):
        load_run_config(None, ["model.alignment_beam"])


@pytest.mark.parametrize("old, new", [("beam", "alignment_beam"), ("warmup_batches", "layer_warmup_batches")])
def test_renamed_model_keys_are_refused_naming_the_new_key(tmp_path, old, new):
    with pytest.raises(ValueError, match=f"model.{old} is now model.{new}"):
        load_run_config(None, [f"model.{old}=3"])
    preset = tmp_path / "old.yaml"
    preset.write_text(f"model:\n  preset: S\n  {old}: 3\n")
    with pytest.raises(ValueError, match=f"{preset}: model.{old} is now model.{new}"):
        load_run_config(preset)


def test_saved_model_sections_with_the_old_keys_still_load():
    """A checkpoint written before the renames keeps its model: warmup_batches and beam
    are read as layer_warmup_batches and alignment_beam."""
    saved = {**get_preset("tiny").to_dict(), "warmup_batches": 2000.0, "beam": 30.0}
    del saved["layer_warmup_batches"], saved["alignment_beam"]
    config = config_from_dict(saved)
    assert (config.layer_warmup_batches, config.alignment_beam) == (2000.0, 30.0)
    assert config == get_preset("tiny", layer_warmup_batches=2000.0, alignment_beam=30.0)
    with pytest.raises(ValueError, match="cannot read model.chunk_size='many' as Optional.int."):
        load_run_config(None, ["model.chunk_size=many"])


def test_yaml_preset_with_overrides(tmp_path):
    conf = tmp_path / "zipformer.yaml"
    conf.write_text("model:\n  preset: S\n  loss: pruned\ndata:\n  max_duration: 700\n")
    config = load_run_config(conf, ["model.num_encoder_layers=1,1,1,1,1,1"]).model
    assert config.num_encoder_layers == (1,) * 6
    assert config.encoder_dim == PRESETS["S"]["encoder_dim"]
    assert load_run_config(conf, ["model.preset=L"]).model.encoder_dim == PRESETS["L"]["encoder_dim"]
    assert load_run_config(None, []).model == get_preset("M")


def test_to_dict_round_trips():
    config = get_preset("mini", vocab_size=77)
    assert config_from_dict(config.to_dict()) == config
