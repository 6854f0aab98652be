"""The committed presets (egs/*/conf/*.yaml): each holds only what differs from its base
preset or from the schema's defaults, and each still loads to the configuration it loaded
to before the presets were cut down to their differences.

The reference, effective_presets_reference.json, was computed with asr.config before that
change (at commits b400148 and 99df82d, the same there): every preset's configuration, and
egs/gigaspeech/run.sh's per-size settings added to the LLM presets (rows "X + Qwen3-14B").
It uses the keys of that time; RENAMED below maps them to today's.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from asr.config import SECTIONS, load_run_config
from local.llm_size_settings import size_settings

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(REPO.glob("egs/*/conf/*.yaml"))
REFERENCE = json.loads((Path(__file__).with_name("effective_presets_reference.json")).read_text())
# Keys renamed or removed since the reference was taken (asr/renamed_keys.py says why).
RENAMED = {"model.beam": "model.alignment_beam", "model.warmup_batches": "model.layer_warmup_batches",
           "decode.beam": "decode.beam_size", "data.seed": "train.seed"}
REMOVED = {"model.ce_beam"}  # never read: generation searched with decode.beam
# The one default that changed: the schema's experiment folder is now the recipes' (every
# run.sh sets train.exp_dir itself, so no recipe run moves).
CHANGED_DEFAULTS = {"train.exp_dir": ("exp/zipformer", "exp/zipformer_pruned_ctc")}
# Fields added to a family's schema since, with their defaults.
ADDED = {"llm_ctc": {"model.query_init": None, "model.streaming_position_offset_chunks": 0,
                     "model.encoder_lr_scale": 0.0, "model.encoder_trained_blocks": 0,
                     "model.projector_lr_scale": 1.0, "model.distinct_head_rows": True,
                     "model.streaming_lookahead_seconds": 0.0, "model.llm_full_finetune": False,
                     "model.query_lr_scale": 1.0, "model.transcript_leading_space": False},
         "zipformer": {"model.streaming": False, "model.streaming_chunk_seconds": 2,
                       "model.streaming_max_history": 8, "model.streaming_seed": 0,
                       "model.trained_stacks": 0, "model.streaming_lookahead_seconds": 0.0}}
ADDED_TO_EVERY_FAMILY = {"data.concatenate_seconds": 0.0, "data.concatenate_gap": 0.1,
                         "data.concatenate_probability": 1.0, "data.concatenate_each": "batch",
                         "data.concatenate_max_gap": 0.0, "data.concatenate_gap_probability": 1.0,
                         "data.trailing_silence_max": 0.0, "data.leading_silence_max": 0.0,
                         "data.batch_across_ranks": False,
                         "train.init_from": "", "train.virtual_ranks": 1, "decode.blank_penalty": [0.0],
                         "decode.tail_padding_seconds": 0.0, "decode.lead_padding_seconds": 0.0,
                         "decode.seam_merge_seconds": 0.0}
# Values a preset changed since, on purpose (egs/mini: q starts at the query token that
# stage 7's tiny LM learned, and the projector at 10 x optim.lr; llm_ce.yaml extends it and
# never reads query_init; stage 4 trains on joined sentences, half of its batches; egs/mini
# RESULTS.md).
CHANGED_SINCE = {"egs/mini/conf/llm_ctc.yaml": {"model.query_init": "<|fim_pad|>", "model.projector_lr_scale": 10},
                 "egs/mini/conf/llm_ce.yaml": {"model.query_init": "<|fim_pad|>"},
                 "egs/mini/conf/train.yaml": {"data.concatenate_seconds": 10.0, "data.concatenate_probability": 0.5,
                                              "data.concatenate_gap": 0.0, "data.concatenate_max_gap": 0.5,
                                              "data.concatenate_gap_probability": 0.5}}


def flat(config: dict) -> dict:
    """``{"model": {"llm": x}}`` -> ``{"model.llm": x}`` (family stays a top-level key)."""
    out = {}
    for name, value in config.items():
        if isinstance(value, dict):
            out.update({f"{name}.{key}": item for key, item in value.items()})
        else:
            out[name] = value
    return out


def reference(row: str) -> dict:
    """A reference row in today's keys."""
    differences = REFERENCE["presets"][row]
    old = {**REFERENCE["defaults"][differences["family"]], **differences}
    new = {}
    for key, value in old.items():
        if key in REMOVED:
            assert value == old["decode.beam"], f"{row}: {key}={value} differs from decode.beam"
            continue
        if key in RENAMED and RENAMED[key] in old:
            assert value == old[RENAMED[key]], f"{row}: {key} and {RENAMED[key]} differ"
            continue
        new[RENAMED.get(key, key)] = value
    for key, (before, now) in CHANGED_DEFAULTS.items():
        if new[key] == before:
            new[key] = now
    new.update(ADDED.get(new["family"], {}))
    new.update(ADDED_TO_EVERY_FAMILY)
    new.update(CHANGED_SINCE.get(row, {}))
    return new


def same(expected: dict, actual: dict) -> list:
    """Keys whose values differ (NaN-free floats compare exactly; lists and tuples alike)."""
    def normal(value):
        return list(value) if isinstance(value, tuple) else value
    keys = sorted(set(expected) | set(actual))
    return [k for k in keys if normal(expected.get(k, "<missing>")) != normal(actual.get(k, "<missing>"))]


@pytest.mark.parametrize("row", sorted(REFERENCE["presets"]))
def test_every_preset_loads_to_its_configuration_before_the_change(row):
    path, _, size = row.partition(" + Qwen3-")
    overrides = size_settings(REPO / path, f"Qwen/Qwen3-{size}") if size else []
    assert bool(overrides) == bool(size), "a Qwen3 size without its overlay, or settings without a size"
    actual = flat(load_run_config(REPO / path, overrides).to_dict())
    assert same(reference(row), actual) == []


# Presets written after the reference (each still checked below to restate nothing).
NEWER = {"egs/mini/conf/llm_ctc_smollm2.yaml", "egs/mini/conf/llm_ce_smollm2.yaml",
         "egs/mini/conf/train_streaming.yaml"}


def test_the_reference_covers_every_preset_a_recipe_runs():
    runnable = {str(p.relative_to(REPO)) for p in PRESETS
                if not p.stem.endswith(("_base", "_14b", "_32b"))}
    assert runnable - NEWER == {row.partition(" + ")[0] for row in REFERENCE["presets"]}
    assert NEWER <= runnable


def own_keys(path: Path):
    document = yaml.safe_load(path.read_text()) or {}
    if "family" in document:
        yield ("family",)
    for section in SECTIONS:
        for key in document.get(section) or {}:
            yield section, key


def without(path: Path, key: tuple, scratch: Path) -> Path:
    """A copy of ``path`` (beside copies of its folder's presets, its possible bases)
    without ``key``."""
    folder = scratch / path.parent.name
    if not folder.exists():
        shutil.copytree(path.parent, folder)
    document = yaml.safe_load(path.read_text())
    if len(key) == 1:
        del document[key[0]]
    else:
        del document[key[0]][key[1]]
    copy = folder / f"without_{path.name}"
    copy.write_text(yaml.safe_dump(document))
    return copy


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_preset_restates_a_default_of_its_base_or_of_the_schema(path, tmp_path):
    loaded = load_run_config(path).to_dict()
    restated = []
    for key in own_keys(path):
        try:
            changed = load_run_config(without(path, key, tmp_path)).to_dict()
        except ValueError:
            continue  # needed: the preset does not load without it
        if changed == loaded:
            restated.append(".".join(key))
    assert restated == [], f"{path} restates what it would be without these keys"


def test_the_gigaspeech_llm_presets_share_one_base():
    conf = REPO / "egs/gigaspeech/conf"
    for objective in ("ctc", "ce"):
        for encoder in ("spear", "zipformer", "qwen3_asr"):
            document = yaml.safe_load((conf / f"llm_{objective}_{encoder}.yaml").read_text())
            assert document["base"] == f"llm_{objective}_base.yaml"
            assert set(document) == {"base", "model"} and len(document["model"]) <= 4
        assert yaml.safe_load((conf / f"llm_{objective}_base.yaml").read_text())["base"] == "llm_base.yaml"


@pytest.mark.parametrize("objective, size, expected", [
    ("ctc", "14B", {"model.activation_checkpointing": True}),
    ("ctc", "32B", {"model.activation_checkpointing": True, "optim.lr": 5e-5}),
    ("ce", "14B", {"data.max_duration": 100.0, "train.accum_grad": 2}),
    ("ce", "32B", {"model.activation_checkpointing": True, "optim.lr": 5e-5, "data.max_duration": 100.0,
                   "train.accum_grad": 2}),
])
def test_the_qwen3_size_overlays_hold_the_papers_training_configurations(objective, size, expected):
    """App. D.3: activation checkpointing for LLM-CTC 14B and both 32B, peak lr 5e-5 for 32B,
    LLM-CE's 100 s microbatches two per update for 14B and 32B (1,600 s per update on 8
    GPUs, as 200 s x 1 for the other sizes)."""
    conf = REPO / "egs/gigaspeech/conf"
    for encoder in ("spear", "zipformer", "qwen3_asr"):
        preset = conf / f"llm_{objective}_{encoder}.yaml"
        settings = size_settings(preset, f"Qwen/Qwen3-{size}")
        plain = flat(load_run_config(preset).to_dict())
        sized = flat(load_run_config(preset, settings).to_dict())
        assert {k: v for k, v in sized.items() if plain[k] != v} == expected
        assert math.isclose(sized["data.max_duration"] * sized["train.accum_grad"] * 8, 1600.0)
    assert size_settings(conf / f"llm_{objective}_spear.yaml", "Qwen/Qwen3-8B") == []
