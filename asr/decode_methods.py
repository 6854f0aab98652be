"""The decode methods, in one registry: each method's name (``decode.methods``), the kind
of decoding it needs from the model (:attr:`asr.family.Recognizer.decoding`), the options
it reads, the key it writes into result file names and summaries, and how it turns a
batch into token ids.

* CTC search over full-vocabulary log-probabilities (paper Sec. 5.2): ``ctc-greedy-search``,
  ``ctc-prefix-beam-search`` (``decode.beam_size`` prefixes, ``decode.token_penalty``);
  both read ``decode.blank_penalty`` (subtracted from blank's log-probability per frame).
* Generation (LLM-CE, Sec. 4.1): ``llm-greedy-search``, ``llm-beam-search``.
* Streaming CTC chunk by chunk with a bounded KV cache (Sec. 4.3, App. E):
  ``ctc-streaming-greedy-search``, ``ctc-streaming-prefix-beam-search``, one setting per
  ``decode.history_seconds`` value (``..._history-8s`` in the keys).

This module imports the standard library only at import time (:mod:`asr.config`
validates names against it); the searches import torch when they run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# What a model can be decoded by (asr.family.Recognizer.decoding).
CTC_SEARCH = "ctc-search"  # full-vocabulary log-probs -> greedy or prefix beam search
GENERATION = "generation"  # autoregressive generation of token ids (LLM-CE)
STREAMING = "streaming"  # chunk-by-chunk CTC with a bounded KV cache
DECODING_KINDS = (CTC_SEARCH, GENERATION, STREAMING)

GREEDY = "ctc-greedy-search"
PREFIX_BEAM = "ctc-prefix-beam-search"
CTC_SEARCHES = (GREEDY, PREFIX_BEAM)


@dataclass(frozen=True)
class DecodeMethod:
    """One entry of the registry."""

    name: str
    needs: str  # one of DECODING_KINDS
    uses_beam: bool  # decode.beam_size is part of the setting
    uses_token_penalty: bool  # a nonzero decode.token_penalty is part of the setting
    per_history: bool  # one setting per decode.history_seconds value
    run: Callable[..., "MethodOutput"]  # (BatchOutputs, SearchSettings, history or None) -> MethodOutput

    @property
    def uses_blank_penalty(self) -> bool:
        """Every CTC search reads decode.blank_penalty; generation does not."""
        return self.needs in (CTC_SEARCH, STREAMING)

    def key(self, beam_size: int, token_penalty: float, history: Optional[int] = None,
            blank_penalty: float = 0.0, seam_merge_seconds: float = 0.0) -> str:
        """The setting's name in file names and summaries (icefall's ``<method>`` or
        ``<method>_beam-<k>``, plus ``_token-penalty-<p>``, ``_blank-penalty-<b>``,
        ``_seam-merge-<s>s`` (streaming methods) and ``_history-<h>s``)."""
        key = self.name + (f"_beam-{beam_size}" if self.uses_beam else "")
        if self.uses_token_penalty and token_penalty:
            key += f"_token-penalty-{token_penalty:g}"
        if self.uses_blank_penalty and blank_penalty:
            key += f"_blank-penalty-{blank_penalty:g}"
        if seam_merge_seconds and self.needs == STREAMING:
            key += f"_seam-merge-{seam_merge_seconds:g}s"
        return key + ("" if history is None else f"_history-{history}s")


@dataclass(frozen=True)
class SearchSettings:
    """What the searches read besides the batch: the blank, the beam (prefixes of
    ``ctc-prefix-beam-search``, hypotheses of ``llm-beam-search``), the token penalty
    and the blank penalty (CTC searches)."""

    blank_id: int
    beam_size: int = 4
    token_penalty: float = 0.0
    blank_penalty: float = 0.0
    seam_merge_seconds: float = 0.0  # streaming searches: the seams of overlapping chunks merged


@dataclass
class MethodOutput:
    """Token ids per utterance, and (streaming) the largest KV cache of each."""

    ids: List[List[int]]
    largest_cache: Optional[List[int]] = None


class BatchOutputs:
    """One batch as the methods see it: the model, its inputs, and the CTC forward pass
    computed once and shared by the CTC searches (its time is counted once per method
    that uses it, as each would pay it alone)."""

    def __init__(self, model: Any, features: Any, feature_lens: Any, methods: Sequence[str],
                 penalize_blank: bool = False) -> None:
        self.model, self.features, self.feature_lens = model, features, feature_lens
        ctc = [name for name in methods if METHODS[name].needs == CTC_SEARCH]
        # Greedy search alone needs each frame's best class, not (N, T', V) log-probs
        # (LLM-CTC's 151,936 classes: Recognizer.best_frame_ids); with a blank penalty
        # it takes the argmax of the penalized log-probs.
        self._argmax_only = ctc == [GREEDY] and not penalize_blank
        self._ctc: Optional[Tuple[Any, Any]] = None
        self.ctc_seconds = 0.0

    def ctc_outputs(self) -> Tuple[Any, Any]:
        """(log-probs (N, T', V) or, for greedy search alone, best classes (N, T')) and T'."""
        if self._ctc is None:
            import torch

            started = time.perf_counter()
            with torch.inference_mode():
                if self._argmax_only:
                    self._ctc = self.model.best_frame_ids(self.features, self.feature_lens)
                else:
                    self._ctc = self.model.log_probs(self.features, self.feature_lens)
            self.ctc_seconds = time.perf_counter() - started
        return self._ctc


def ctc_search(name: str, scores: Any, lengths: Any, blank_id: int, beam_size: int = 4,
               token_penalty: float = 0.0, blank_penalty: float = 0.0) -> List[List[int]]:
    """Token ids per utterance of CTC search ``name`` over log-probs (N, T', V), or for
    greedy search over each frame's best class (N, T'; no blank penalty then)."""
    from asr.search import ctc_collapse, ctc_greedy_search, ctc_prefix_beam_search

    if name == GREEDY:
        if not scores.is_floating_point():
            if blank_penalty:
                raise ValueError("a blank penalty needs the log-probabilities, not each frame's best class")
            return ctc_collapse(scores, lengths, blank_id=blank_id)
        return ctc_greedy_search(scores, lengths, blank_id=blank_id, blank_penalty=blank_penalty)
    if name == PREFIX_BEAM:
        return ctc_prefix_beam_search(scores, lengths, beam=beam_size, blank_id=blank_id,
                                      token_penalty=token_penalty, blank_penalty=blank_penalty)
    raise ValueError(f"unknown CTC search {name!r}; valid: {list(CTC_SEARCHES)}")


def _ctc_method(name: str) -> Callable[..., MethodOutput]:
    def run(batch: BatchOutputs, search: SearchSettings, history: Optional[int]) -> MethodOutput:
        scores, lengths = batch.ctc_outputs()
        return MethodOutput(ctc_search(name, scores, lengths, search.blank_id, search.beam_size,
                                       search.token_penalty, search.blank_penalty))

    return run


def _generation_method(beam: bool) -> Callable[..., MethodOutput]:
    def run(batch: BatchOutputs, search: SearchSettings, history: Optional[int]) -> MethodOutput:
        import torch

        with torch.inference_mode():
            return MethodOutput(batch.model.generate_ids(batch.features, batch.feature_lens,
                                                         beam=search.beam_size if beam else None))

    return run


def _streaming_method(search: str) -> Callable[..., MethodOutput]:
    def run(batch: BatchOutputs, settings: SearchSettings, history: Optional[int]) -> MethodOutput:
        ids, caches = batch.model.streaming_ids(batch.features, batch.feature_lens, history, search,
                                                beam=settings.beam_size, token_penalty=settings.token_penalty,
                                                blank_penalty=settings.blank_penalty,
                                                seam_merge_seconds=settings.seam_merge_seconds)
        return MethodOutput(ids, caches)

    return run


METHODS: Dict[str, DecodeMethod] = {method.name: method for method in (
    DecodeMethod(GREEDY, CTC_SEARCH, False, False, False, _ctc_method(GREEDY)),
    DecodeMethod(PREFIX_BEAM, CTC_SEARCH, True, True, False, _ctc_method(PREFIX_BEAM)),
    DecodeMethod("llm-greedy-search", GENERATION, False, False, False, _generation_method(beam=False)),
    DecodeMethod("llm-beam-search", GENERATION, True, False, False, _generation_method(beam=True)),
    DecodeMethod("ctc-streaming-greedy-search", STREAMING, False, False, True, _streaming_method(GREEDY)),
    DecodeMethod("ctc-streaming-prefix-beam-search", STREAMING, True, True, True, _streaming_method(PREFIX_BEAM)),
)}
DEFAULT_METHODS = CTC_SEARCHES


def method_of(name: str, option: str = "decode.methods") -> DecodeMethod:
    """The registry entry of ``name``; ValueError naming ``option`` and the valid names."""
    if name not in METHODS:
        raise ValueError(f"{option}: unknown method {name!r}; valid: {list(METHODS)}")
    return METHODS[name]


def check_model_decodes(decoding: Sequence[str], methods: Sequence[str], model_name: str) -> None:
    """ValueError unless a model that supports ``decoding`` (its kinds) can run every method."""
    for name in methods:
        method = method_of(name)
        if method.needs not in decoding:
            raise ValueError(f"decode.methods: {name} needs a model decoded by {method.needs}, but this "
                             f"{model_name} is decoded by {', '.join(sorted(decoding))} only")
