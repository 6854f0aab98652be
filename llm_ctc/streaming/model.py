"""Streaming LLM-CTC (``model.streaming: true``; Sec. 4.3, App. D.4, App. E): LLM-CTC whose
loss, frames and decoding follow the chunked layout.

Training (:meth:`StreamingLLMCTCModel.loss` in training mode): per batch one
history h (App. D.4: ``streaming_max_history`` = 8 s with probability 1/2, each of
1-7 s with 1/14), a function of ``model.streaming_seed`` and the global step number
(``start_update``, called by the trainer before each update) so that a resumed run
draws the same h for the same step. The same h bounds the encoder windows (the preceding
h seconds with the chunk, :mod:`llm_ctc.streaming.encoder`) and the LLM mask; all chunks
of all utterances run in parallel; the loss is the utterance-level Pruned CTC over the
query outputs concatenated in chunk order (eq. 11). In evaluation mode (validation) h is
``streaming_max_history``.

What is per chunk (App. D.4): the features (the data pipeline computes each chunk's fbank
from that chunk's audio and SpecAugments each chunk on its own: ``data.feature_chunk_seconds``,
which a streaming run sets to ``model.streaming_chunk_seconds``, :mod:`asr.chunk_features`;
the same frontend as :class:`llm_ctc.streaming.recognizer.StreamingRecognizer`), the
encoder input (each chunk's window of h seconds of history and the chunk, batched as
independent sequences), the projector, the mask, the time coordinates. The model cuts the
features it is given at every ``streaming_chunk_seconds`` * 100 frames, which are the
chunk boundaries of those features (a full chunk gives exactly that many frames).

Decoding: ``log_probs`` is the parallel masked computation at h =
``streaming_max_history`` (what a chunk-by-chunk decoder with that history computes, in
one pass); ``streaming_ids`` runs each utterance chunk by chunk through
:class:`llm_ctc.streaming.recognizer.StreamingRecognizer` (KV cache with eviction, CTC
search state carried across chunks) and checks the cache bound P + 2A + J of App. E.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from asr.chunk_windows import history_for_step
from asr.decode_methods import CTC_SEARCH, CTC_SEARCHES, STREAMING
from asr.family import FrameCount
from llm_ctc.config import LLMASRConfig
from llm_ctc.model import LLMCTCModel, Targets
from llm_ctc.streaming.encoder import streaming_grid, streaming_speech_embeddings
from llm_ctc.streaming.layout import TICKS_PER_SECOND, cache_bound, streaming_frame_count
from llm_ctc.streaming.llm import (parallel_query_states, position_offsets_for_step,
                                   streaming_training_loss)


class CacheBoundExceeded(RuntimeError):
    """An utterance's KV cache held more than P + 2A + J positions."""


class StreamingLLMCTCModel(LLMCTCModel):
    decoding = frozenset({CTC_SEARCH, STREAMING})

    def __init__(self, config: LLMASRConfig, tokenizer=None) -> None:
        if not config.streaming:
            raise ValueError("StreamingLLMCTCModel needs model.streaming true")
        super().__init__(config, tokenizer)
        self.chunk_seconds = config.streaming_chunk_seconds
        self.max_history = config.streaming_max_history
        self.seed = config.streaming_seed
        self.grid = streaming_grid(config)
        self.update = 0
        self.last_history: Optional[int] = None  # the h of the latest loss (for logs and tests)

    def start_update(self, update: int, batch_count: float) -> None:
        """The next training update (from 1): it keys the history h drawn for it."""
        self.update = int(update)

    def history_seconds(self) -> int:
        if not self.training:
            return self.max_history
        return history_for_step(self.seed, self.update, self.max_history)

    def loss(self, features: Tensor, feature_lens: Tensor, targets: Targets,
             target_lengths: Tensor = None) -> Tuple[Tensor, Dict[str, Any]]:
        """The utterance-level Pruned CTC loss over the concatenated query outputs (eq. 11)
        at this update's history h (``streaming_max_history`` in evaluation mode)."""
        history = self.history_seconds()
        self.last_history = history
        return streaming_training_loss(self, features, feature_lens, targets, history, target_lengths,
                                       chunk_seconds=self.chunk_seconds,
                                       position_offsets=self.position_offsets(features.shape[0]))

    def position_offsets(self, count: int) -> Optional[List[int]]:
        """In training with ``model.streaming_position_offset_chunks`` K > 0: each
        utterance's non-prompt rotary positions shifted by k * 2A, k uniform in 0..K, as if
        it came k full chunks into a long stream (what chunk-by-chunk decoding of a long
        input gives the LLM); None otherwise (the positions of App. E)."""
        if not self.training or self.config.streaming_position_offset_chunks == 0:
            return None
        full_chunk = self.grid.count(self.chunk_seconds * TICKS_PER_SECOND)
        return position_offsets_for_step(self.seed, self.update, count, self.config.streaming_position_offset_chunks,
                                         2 * full_chunk)

    def output_lengths(self, num_feature_frames: FrameCount) -> FrameCount:
        """CTC frames of the concatenated query outputs: sum over chunks of T_b."""
        return streaming_frame_count(self.grid, num_feature_frames, self.chunk_seconds)

    def log_probs(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """Full-head log-probabilities of the parallel masked forward at h =
        ``streaming_max_history``, float32, and T_n."""
        speech, layouts = streaming_speech_embeddings(self, features, feature_lens, self.max_history,
                                                      self.chunk_seconds)
        states, lens = parallel_query_states(self, speech, layouts, self.max_history)
        return self.log_probs_of_states(states), lens

    def best_frame_ids(self, features: Tensor, feature_lens: Tensor) -> Tuple[Tensor, Tensor]:
        """The argmax of :meth:`log_probs` (its frames are the streaming layout's)."""
        log_probs, lengths = self.log_probs(features, feature_lens)
        return log_probs.argmax(dim=-1), lengths

    def cache_bound(self, history_seconds: int) -> int:
        return cache_bound(len(self.prompt_ids), self.grid, history_seconds, self.chunk_seconds)

    def streaming_ids(self, features: Tensor, feature_lens: Tensor, history_seconds: int, search: str,
                      beam: int = 4, token_penalty: float = 0.0, blank_penalty: float = 0.0,
                      seam_merge_seconds: float = 0.0) -> Tuple[List[List[int]], List[int]]:
        """Token ids per utterance decoded chunk by chunk with a KV cache of history
        ``history_seconds`` (``seam_merge_seconds`` > 0: the chunks' seams merged), and each
        utterance's largest cache; CacheBoundExceeded when one exceeds P + 2A + J."""
        from llm_ctc.streaming.recognizer import recognize_streaming

        if search not in CTC_SEARCHES:
            raise ValueError(f"unknown CTC search {search!r}; valid: {', '.join(CTC_SEARCHES)}")
        with torch.inference_mode():
            ids, _, largest = recognize_streaming(self, features, feature_lens, history_seconds, search, beam,
                                                  token_penalty, self.chunk_seconds, blank_penalty,
                                                  seam_merge_seconds)
        bound = self.cache_bound(history_seconds)
        if max(largest) > bound:
            raise CacheBoundExceeded(f"KV cache of {max(largest)} positions at h = {history_seconds} s, more than "
                                     f"the bound P + 2A + J = {bound}")
        return ids, largest
