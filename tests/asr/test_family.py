"""The family contract in code (asr/family.py): a family's record and its models are
checked when they are built, and a missing member is named."""

from __future__ import annotations

import types

import pytest
import torch

from asr.decode_methods import CTC_SEARCH, GENERATION, STREAMING, check_model_decodes
from asr.family import Family, NotDecodableBy, Recognizer, check_model, load_family
from zipformer.presets import ScaledAdamOptions, ZipformerConfig


class Complete(Recognizer):
    def forward(self, features, feature_lens, targets, return_stats=False):
        return features.sum()

    def output_lengths(self, num_feature_frames):
        return num_feature_frames

    def log_probs(self, features, feature_lens):
        return features.log_softmax(-1), feature_lens


class WithoutLogProbs(Recognizer):
    def forward(self, features, feature_lens, targets, return_stats=False):
        return features.sum()

    def output_lengths(self, num_feature_frames):
        return num_feature_frames


class GeneratesWithoutGenerateIds(Complete):
    decoding = frozenset({GENERATION})


class StreamsWithoutCacheBound(Complete):
    decoding = frozenset({CTC_SEARCH, STREAMING})

    def streaming_ids(self, features, feature_lens, history_seconds, search, beam=4, token_penalty=0.0,
                      blank_penalty=0.0, seam_merge_seconds=0.0):
        return [[]], [0]


def family_of(model_class) -> Family:
    return Family("test", ZipformerConfig, ScaledAdamOptions, lambda config, vocab, blank: model_class(),
                  lambda model, options: (None, None))


def test_a_complete_model_is_built_and_keeps_the_defaults() -> None:
    model = family_of(Complete).build(ZipformerConfig(), 5, 0)
    assert model.decoding == frozenset({CTC_SEARCH})
    features = torch.randn(2, 4, 5)
    ids, lengths = model.best_frame_ids(features, torch.tensor([4, 3]))
    assert torch.equal(ids, features.log_softmax(-1).argmax(-1))
    assert model.checkpoint_state_dict().keys() == model.state_dict().keys()
    with pytest.raises(NotDecodableBy, match="Complete is not decoded by generation"):
        model.generate_ids(features, lengths)


def test_a_model_missing_a_required_member_fails_when_built_naming_it() -> None:
    with pytest.raises(TypeError, match="log_probs"):
        family_of(WithoutLogProbs).build(ZipformerConfig(), 5, 0)


@pytest.mark.parametrize("model_class, member", [(GeneratesWithoutGenerateIds, "generate_ids"),
                                                 (StreamsWithoutCacheBound, "cache_bound")])
def test_a_model_declaring_a_decoding_kind_must_define_its_member(model_class, member) -> None:
    with pytest.raises(TypeError, match=f"does not define {member}\\(\\)"):
        family_of(model_class).build(ZipformerConfig(), 5, 0)


def test_build_model_must_return_a_recognizer_of_the_family_config() -> None:
    family = Family("test", ZipformerConfig, ScaledAdamOptions, lambda config, vocab, blank: torch.nn.Linear(2, 2),
                    lambda model, options: (None, None))
    with pytest.raises(TypeError, match="not an asr.family.Recognizer"):
        family.build(ZipformerConfig(), 5, 0)
    with pytest.raises(TypeError, match="builds from a ZipformerConfig, got a ScaledAdamOptions"):
        family.build(ScaledAdamOptions(), 5, 0)
    with pytest.raises(TypeError, match="which is not"):
        check_model(object(), "test")


def test_a_family_module_without_a_record_is_refused(monkeypatch) -> None:
    import asr.family as family_module

    monkeypatch.setitem(family_module.FAMILIES, "bare", ("zipformer.presets:ZipformerConfig",
                                                          "zipformer.presets:ScaledAdamOptions", "bare_family"))
    monkeypatch.setitem(__import__("sys").modules, "bare_family", types.ModuleType("bare_family"))
    with pytest.raises(TypeError, match="bare_family defines no FAMILY"):
        load_family("bare")


@pytest.mark.parametrize("name", ["zipformer", "llm_ctc"])
def test_the_registered_families_load(name) -> None:
    family = load_family(name)
    assert family.name == name and callable(family.build_model) and callable(family.build_optimizer)


def test_a_method_the_model_cannot_run_is_refused_before_decoding() -> None:
    check_model_decodes(frozenset({CTC_SEARCH}), ["ctc-greedy-search", "ctc-prefix-beam-search"], "m")
    with pytest.raises(ValueError, match="llm-beam-search needs a model decoded by generation"):
        check_model_decodes(frozenset({CTC_SEARCH}), ["llm-beam-search"], "m")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        check_model_decodes(frozenset({CTC_SEARCH}), ["nope"], "m")
