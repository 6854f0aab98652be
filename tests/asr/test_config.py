"""Specifications of asr.config: presets that extend a base preset, errors that name the
preset file at fault, keys renamed since checkpoints were first written (refused in
presets and overrides, translated in saved configurations), one seed, one exp_dir default."""

import warnings
from pathlib import Path

import pytest

from asr.config import (DataOptions, DecodeOptions, RunConfig, TrainOptions, format_value, load_run_config,
                        parse_value)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_preset_extends_its_base_key_by_key(tmp_path):
    write(tmp_path, "base.yaml", "model:\n  preset: S\n  loss: standard\ndata:\n  max_duration: 300\n"
                                 "  num_buckets: 12\ntrain:\n  num_epochs: 5\n")
    child = write(tmp_path, "child.yaml", "base: base.yaml\ndata:\n  max_duration: 400\ntrain:\n  precision: bf16\n")
    config = load_run_config(child, ["train.num_epochs=7"])
    assert (config.model.loss, config.model.encoder_dim) == ("standard", (192, 256, 256, 256, 256, 256))
    assert (config.data.max_duration, config.data.num_buckets) == (400.0, 12)
    assert (config.train.num_epochs, config.train.precision) == (7, "bf16")  # the override applies last


def test_bases_are_resolved_recursively_relative_to_each_presets_folder(tmp_path):
    write(tmp_path, "shared/root.yaml", "family: llm_ctc\noptim:\n  lr: 0.001\n  warmup_batches: 10\n")
    write(tmp_path, "shared/middle.yaml", "base: root.yaml\noptim:\n  warmup_batches: 20\n")
    leaf = write(tmp_path, "recipe/leaf.yaml", "base: ../shared/middle.yaml\nmodel:\n  objective: ce\n")
    config = load_run_config(leaf)
    assert config.family == "llm_ctc"
    assert (config.optim.lr, config.optim.warmup_batches, config.model.objective) == (0.001, 20, "ce")


def test_a_cycle_of_bases_is_an_error_naming_the_files(tmp_path):
    first = write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: c.yaml\n")
    write(tmp_path, "c.yaml", "base: a.yaml\n")
    with pytest.raises(ValueError, match=r"cycle: .*a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml"):
        load_run_config(first)
    itself = write(tmp_path, "self.yaml", "base: self.yaml\n")
    with pytest.raises(ValueError, match=r"cycle: .*self\.yaml -> .*self\.yaml"):
        load_run_config(itself)


def test_a_missing_or_malformed_base_names_the_preset_that_names_it(tmp_path):
    child = write(tmp_path, "child.yaml", "base: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match=rf"{child}: base preset not found: .*nowhere\.yaml"):
        load_run_config(child)
    listed = write(tmp_path, "listed.yaml", "base: [a.yaml, b.yaml]\n")
    with pytest.raises(ValueError, match=rf"{listed}: base must name a .yaml file"):
        load_run_config(listed)


def test_errors_name_the_file_of_the_chain_at_fault(tmp_path):
    base = write(tmp_path, "base.yaml", "data:\n  max_durations: 3\n")
    child = write(tmp_path, "child.yaml", "base: base.yaml\ntrain:\n  num_epochs: 2\n")
    with pytest.raises(ValueError, match=rf"^{base}: unknown data option 'max_durations'"):
        load_run_config(child)
    write(tmp_path, "good.yaml", "train:\n  num_epochs: 2\n")
    bad_section = write(tmp_path, "bad_section.yaml", "base: good.yaml\noptimizer:\n  lr: 1\n")
    with pytest.raises(ValueError, match=rf"{bad_section}: unknown section.*optimizer"):
        load_run_config(bad_section)
    bad_value = write(tmp_path, "bad_value.yaml", "base: good.yaml\ntrain:\n  precision: fp8\n")
    with pytest.raises(ValueError, match=rf"^{bad_value}: train.precision must be one of"):
        load_run_config(bad_value)
    lexicon = write(tmp_path, "lexicon.yaml", "base: good.yaml\nmodel:\n  vocab_size: 500\n")
    with pytest.raises(ValueError, match=rf"model.vocab_size is taken from the lexicon.*remove it from {lexicon}"):
        load_run_config(lexicon)


@pytest.mark.parametrize("family, old, new", [
    ("zipformer", "model.beam", "model.alignment_beam"),
    ("llm_ctc", "model.beam", "model.alignment_beam"),
    ("zipformer", "model.warmup_batches", "model.layer_warmup_batches"),
    ("zipformer", "decode.beam", "decode.beam_size"),
    ("llm_ctc", "decode.beam", "decode.beam_size"),
    ("zipformer", "data.seed", "train.seed"),
])
def test_renamed_keys_are_refused_naming_the_new_key(tmp_path, family, old, new):
    section, _, key = old.partition(".")
    with pytest.raises(ValueError, match=rf"^{old} is now {new}: .*given as override '{old}=3'"):
        load_run_config(None, [f"family={family}", f"{old}=3"])
    write(tmp_path, "base.yaml", f"family: {family}\n")
    preset = write(tmp_path, "old.yaml", f"base: base.yaml\n{section}:\n  {key}: 3\n")
    with pytest.raises(ValueError, match=rf"^{preset}: {old} is now {new}: "):
        load_run_config(preset)


def test_the_removed_ce_beam_is_refused_naming_the_decode_beam_size(tmp_path):
    with pytest.raises(ValueError, match="model.ce_beam is removed: .*decode.beam_size"):
        load_run_config(None, ["family=llm_ctc", "model.ce_beam=4"])
    preset = write(tmp_path, "ce.yaml", "family: llm_ctc\nmodel:\n  objective: ce\n  ce_beam: 4\n")
    with pytest.raises(ValueError, match=rf"{preset}: model.ce_beam is removed"):
        load_run_config(preset)


def test_the_zipformer_layer_warmup_is_not_an_llm_key():
    with pytest.raises(ValueError, match="unknown model option 'warmup_batches'"):
        load_run_config(None, ["family=llm_ctc", "model.warmup_batches=3"])


def saved_before_the_renames(family: str, **model) -> dict:
    """A configuration as checkpoints saved it before the renames (RunConfig.to_dict with
    the old keys): data.seed beside train.seed, decode.beam, the model's old keys."""
    config = load_run_config(None, [f"family={family}"]).to_dict()
    config["data"]["seed"] = config["train"]["seed"]
    config["decode"]["beam"] = config["decode"].pop("beam_size")
    config["model"].update(model)
    return config


def test_a_saved_zipformer_configuration_with_the_old_keys_loads_translated():
    saved = saved_before_the_renames("zipformer", beam=20.0, warmup_batches=1500.0)
    del saved["model"]["alignment_beam"], saved["model"]["layer_warmup_batches"]
    saved["decode"]["beam"] = 8
    saved["data"]["seed"] = saved["train"]["seed"] = 7
    config = RunConfig.from_dict(saved, ["decode.avg=3"])
    assert (config.model.alignment_beam, config.model.layer_warmup_batches) == (20.0, 1500.0)
    assert (config.decode.beam_size, config.decode.avg, config.train.seed) == (8, 3, 7)
    expected = load_run_config(None, ["model.alignment_beam=20", "model.layer_warmup_batches=1500",
                                      "decode.beam_size=8", "decode.avg=3", "train.seed=7"])
    assert config == expected


def test_a_saved_ce_beam_equal_to_the_decode_beam_is_dropped_silently():
    saved = saved_before_the_renames("llm_ctc", ce_beam=4, beam=100.0, objective="ce")
    del saved["model"]["alignment_beam"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = RunConfig.from_dict(saved)
    assert (config.model.alignment_beam, config.decode.beam_size, config.model.objective) == (100.0, 4, "ce")
    assert "ce_beam" not in config.to_dict()["model"]


def test_a_saved_ce_beam_that_never_took_effect_is_dropped_with_a_warning():
    # Generation always searched with decode.beam: 6 here; the saved ce_beam 8 was never used.
    saved = saved_before_the_renames("llm_ctc", ce_beam=8)
    saved["decode"]["beam"] = 6
    with pytest.warns(UserWarning, match=r"model.ce_beam=8 was never used .*decode.beam=6"):
        config = RunConfig.from_dict(saved)
    assert config.decode.beam_size == 6


def test_differing_saved_seeds_become_train_seed_with_a_warning():
    saved = saved_before_the_renames("zipformer")
    saved["data"]["seed"], saved["train"]["seed"] = 3, 42
    with pytest.warns(UserWarning, match=r"data.seed=3 differs from train.seed=42"):
        config = RunConfig.from_dict(saved)
    assert config.train.seed == 42 and "seed" not in config.to_dict()["data"]


def test_resuming_compares_an_old_checkpoints_configuration_in_the_new_keys():
    from asr.checkpoint import check_config_matches

    saved = saved_before_the_renames("zipformer", beam=None, warmup_batches=4000.0)
    del saved["model"]["alignment_beam"], saved["model"]["layer_warmup_batches"]
    check_config_matches(saved, load_run_config(None).to_dict(), source="epoch-3.pt")


def test_one_seed_and_one_search_width():
    assert "seed" in {f for f in TrainOptions.__dataclass_fields__}
    assert "seed" not in DataOptions.__dataclass_fields__
    assert "beam_size" in DecodeOptions.__dataclass_fields__ and "beam" not in DecodeOptions.__dataclass_fields__
    with pytest.raises(ValueError, match="decode.beam_size must be >= 1, got 0"):
        load_run_config(None, ["decode.beam_size=0"])


def test_the_experiment_folder_default_is_the_recipes_zipformer_folder():
    # The corpus recipes write Zipformer CTC runs there (README, egs/gigaspeech/conf/llm_*_zipformer.yaml).
    assert TrainOptions().exp_dir == "exp/zipformer_pruned_ctc"


@pytest.mark.parametrize("value, kind", [
    (True, "bool"), (False, "bool"), (None, "Optional[float]"), (5e-05, "float"), (float("inf"), "float"),
    (100.0, "float"), (2, "int"), ((1, 2, 3), "Tuple[int, ...]"), (("q_proj", "v_proj"), "Tuple[str, ...]"),
    ("bfloat16", "str"),
])
def test_format_value_writes_what_parse_value_reads(value, kind):
    assert parse_value(format_value(value), kind, "x") == value


@pytest.mark.parametrize("raw", ["q_proj,v_proj", "[q_proj,v_proj]", "[q_proj, v_proj]", " q_proj , v_proj "])
def test_tuple_overrides_read_as_a_comma_list_or_a_yaml_list(raw):
    assert parse_value(raw.strip(), "Tuple[str, ...]", "model.lora_targets") == ("q_proj", "v_proj")


@pytest.mark.parametrize("raw", ["[q_proj,v_proj", "q_proj,v_proj]"])
def test_a_tuple_override_with_one_bracket_is_refused_naming_it(raw):
    with pytest.raises(ValueError, match=r"model\.lora_targets"):
        parse_value(raw, "Tuple[str, ...]", "model.lora_targets")
