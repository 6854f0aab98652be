"""Configuration keys renamed or removed since checkpoints were first written.

A preset or an override that still uses an old key is refused with a message naming the
new one (:func:`refusal`); a configuration saved inside a checkpoint is translated when it
is read (:func:`translate_saved_config`, :func:`translate_saved_model`), so that old
checkpoints keep loading, resuming and decoding. Standard library only.

| old key                           | new key                    | why                              |
|-----------------------------------|----------------------------|----------------------------------|
| model.beam                        | model.alignment_beam       | Pruned CTC's alignment beam      |
|                                   |                            | (paper App. B.3), not a search   |
| decode.beam                       | decode.beam_size           | the search width (icefall's      |
|                                   |                            | --beam-size)                     |
| model.warmup_batches (zipformer)  | model.layer_warmup_batches | layer warm-up in schedule units, |
|                                   |                            | not optim.warmup_batches (lr)    |
| data.seed                         | train.seed                 | one seed for a run               |
| model.ce_beam (llm_ctc)           | (removed)                  | never read: generation searches  |
|                                   |                            | with decode.beam_size            |
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Optional

# section -> {old key: new "section.key"}; the model section's keys depend on the family.
RENAMED: Dict[str, Dict[str, str]] = {
    "data": {"seed": "train.seed"},
    "decode": {"beam": "decode.beam_size"},
}
RENAMED_IN_MODEL: Dict[str, Dict[str, str]] = {
    "zipformer": {"warmup_batches": "model.layer_warmup_batches", "beam": "model.alignment_beam"},
    "llm_ctc": {"beam": "model.alignment_beam"},
}
# family -> {removed model key: what to use instead}.
REMOVED_IN_MODEL: Dict[str, Dict[str, str]] = {
    "llm_ctc": {"ce_beam": "LLM-CE's beam search, llm-beam-search, searches with decode.beam_size"},
}
# Why each renamed key was renamed, for the refusal messages.
REASONS = {
    "model.alignment_beam": "Pruned CTC's alignment pruning beam, paper App. B.3; the search width is "
                            "decode.beam_size",
    "decode.beam_size": "the search width of ctc-prefix-beam-search and llm-beam-search (icefall's "
                        "--beam-size); Pruned CTC's alignment beam is model.alignment_beam",
    "model.layer_warmup_batches": "the Zipformer layers' warm-up, in schedule units of train.schedule_ref_duration; "
                                  "optim.warmup_batches is the learning-rate warm-up, in updates",
    "train.seed": "the run's one seed, for model initialization, data order and augmentation",
}


def renamed_keys(family: str, section: str) -> Dict[str, str]:
    return RENAMED_IN_MODEL.get(family, {}) if section == "model" else RENAMED.get(section, {})


def removed_keys(family: str, section: str) -> Dict[str, str]:
    return REMOVED_IN_MODEL.get(family, {}) if section == "model" else {}


def refusal(family: str, section: str, key: str) -> Optional[str]:
    """Why ``section.key`` is refused (it was renamed or removed), or None:
    ``"now model.alignment_beam: ..."``, ``"removed: ..."``."""
    new = renamed_keys(family, section).get(key)
    if new is not None:
        return f"now {new}: {REASONS[new]}"
    instead = removed_keys(family, section).get(key)
    if instead is not None:
        return f"removed: {instead}"
    return None


def translate_saved_model(family: str, values: Mapping[str, Any]) -> Dict[str, Any]:
    """A saved model section with its old keys renamed and removed ones dropped."""
    translated = dict(values)
    for old, new in renamed_keys(family, "model").items():
        if old in translated:
            translated.setdefault(new.partition(".")[2], translated.pop(old))
    for old in removed_keys(family, "model"):
        translated.pop(old, None)
    return translated


def translate_saved_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """A configuration saved in a checkpoint (``RunConfig.to_dict``), in today's keys.

    ``model.ce_beam`` (LLM-CE) was validated but never read: generation always searched
    with the decode section's beam. It is dropped; when it differed from that beam a
    warning says so, since the saved value never took effect and must not start to.
    ``data.seed`` and ``train.seed`` become one ``train.seed``; when they differed, a
    warning says that the data is now seeded by ``train.seed``.
    """
    translated = {name: (dict(value) if isinstance(value, Mapping) else value) for name, value in config.items()}
    family = translated.get("family") or "zipformer"
    sections = {name: value for name, value in translated.items() if isinstance(value, dict)}
    model, decode = sections.get("model", {}), sections.get("decode", {})
    ce_beam, search_beam = model.get("ce_beam"), decode.get("beam", decode.get("beam_size"))
    if family == "llm_ctc" and ce_beam is not None and search_beam is not None and ce_beam != search_beam:
        warnings.warn(f"saved configuration: model.ce_beam={ce_beam} was never used (generation searched with "
                      f"decode.beam={search_beam}); dropped", stacklevel=2)
    data, train = sections.get("data", {}), sections.get("train", {})
    if "seed" in data and "seed" in train and data["seed"] != train["seed"]:
        warnings.warn(f"saved configuration: data.seed={data['seed']} differs from train.seed={train['seed']}; "
                      "one seed remains, train.seed, which now also orders and augments the data",
                      stacklevel=2)
    for section, values in sections.items():
        if section == "model":
            translated["model"] = translate_saved_model(family, values)
            continue
        for old, new in renamed_keys(family, section).items():
            if old in values:
                value = values.pop(old)
                new_section, _, new_key = new.partition(".")
                translated.setdefault(new_section, {}).setdefault(new_key, value)
    return translated


__all__ = ["RENAMED", "RENAMED_IN_MODEL", "REMOVED_IN_MODEL", "refusal", "translate_saved_config",
           "translate_saved_model"]
