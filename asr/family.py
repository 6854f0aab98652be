"""How a model family plugs into the trainer (:mod:`asr.train`) and decoder (:mod:`asr.decode`).

A family is named in a run's configuration (``family: zipformer``) and registered in
:data:`asr.config.FAMILIES` with its ``model`` and ``optim`` section classes and a module
that provides two functions::

    build_model(model_config, vocab_size, blank_id) -> model
    build_optimizer(model, optim_options) -> (optimizer, scheduler)

and optionally ``build_tokenizer(model_config) -> asr.tokenizer.Tokenizer`` when the
lexicon comes with the model (an LLM's own tokenizer) rather than from ``train.lang_dir``.

The model is a ``torch.nn.Module`` with

* ``forward(features, feature_lens, targets, return_stats=True) -> (loss, stats)``: the
  summed CTC loss of a batch; ``stats.excluded`` (N,) marks utterances the loss left out
  and ``stats.num_excluded`` counts them (:class:`pruned_ctc.LossStats`);
* ``log_probs(features, feature_lens) -> (log_probs (N, T', V), lengths (N,))`` for decoding,
  and optionally ``best_frame_ids(features, feature_lens) -> (argmax ids (N, T'), lengths)``
  for greedy search without the log-softmax (LLM-CTC's 151,936 classes);
* ``output_lengths(num_feature_frames)``: T' for an int or a tensor of lengths (the cut
  filter's alignability rule and the per-frame loss use it);
* optionally ``set_batch_count(count)`` (schedules driven by the duration-adjusted batch
  count) and ``checkpoint_state_dict()`` / ``load_checkpoint_state_dict(state)`` when a
  checkpoint should hold less than ``state_dict()`` (e.g. only the trainable parameters
  next to a frozen pretrained LLM; the running average then covers only those);
* a model decoded by generation instead of CTC search (LLM-CE) has
  ``generate_ids(features, feature_lens, beam=None) -> token ids per utterance`` in
  place of ``log_probs`` (``decode.methods`` llm-greedy-search / llm-beam-search);
* optionally ``prepare_for_decoding()``, called once after the weights are loaded
  (e.g. LoRA merged into the base weights);
* optionally ``set_batch_index(index)`` (the global step number before each training
  step: randomness keyed by the step stays exact on resume) and, for decoding chunk by
  chunk (``decode.methods`` ctc-streaming-*), ``streaming_ids(features, feature_lens,
  history_seconds, method, beam, token_penalty) -> (token ids, largest cache per
  utterance)`` and ``cache_bound(history_seconds)`` (streaming LLM-CTC).

An optimizer that clips gradients does so inside its ``step()``: ``GradScaler.step``
unscales fp16 gradients before calling it.

The scheduler steps per batch and per epoch (``step_batch(batch_idx)``,
``step_epoch(epoch)``), reports ``get_last_lr()`` and saves ``state_dict()``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from asr.config import FAMILIES, PathLike
from asr.tokenizer import Tokenizer, load_tokenizer


def load_family(name: str) -> ModuleType:
    """The module that builds the models and optimizers of family ``name``."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; valid: {sorted(FAMILIES)}")
    module = importlib.import_module(FAMILIES[name][2])
    for function in ("build_model", "build_optimizer"):
        if not callable(getattr(module, function, None)):
            raise TypeError(f"family {name!r}: module {module.__name__} has no function {function}()")
    return module


def load_lexicon_of(family: str, model_config: Any, lang_dir: PathLike) -> Tokenizer:
    """The run's tokenizer: the family's own (``build_tokenizer``) or ``lang_dir``'s."""
    builder = getattr(load_family(family), "build_tokenizer", None)
    return builder(model_config) if builder is not None else load_tokenizer(lang_dir)
