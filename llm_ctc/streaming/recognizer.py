"""Streaming recognition with LLM-CTC (Sec. 4.3, Fig. 2c): feed features or audio chunk
by chunk, read the current hypothesis after each chunk.

Per chunk b: the encoder on the last h seconds of features with the chunk, the
projector, one LLM forward of [E_b, Q_b] against the KV cache (then eviction), the
full-head log-probabilities, and one step of the streaming CTC search whose prefixes
persist across chunks. Audio is cut into chunks and each chunk's features are computed
from that chunk's samples only (:class:`asr.chunk_features.ChunkFbank` with the encoder's
number of mel bins: the frontend and chunking that training uses with
``data.feature_chunk_seconds``, App. D.4). With a lookahead of L frames
(``model.streaming_lookahead_seconds``, not in the paper) a completed chunk waits for the
first L frames of the next one: from audio, for the next chunk's first L * 160 + 120
samples, enough for its first L frames' 25 ms windows, which are then the frames its
whole-chunk fbank gives. Each utterance has its own feature history, KV cache and search
state: :meth:`StreamingRecognizer.reset` between utterances.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor

from asr.chunk_features import HOP_SAMPLES, WINDOW_SAMPLES, ChunkFbank
from asr.lookahead import lookahead_frames_of
from asr.streaming_search import StreamingGreedySearch, StreamingPrefixBeamSearch
from asr.decode_methods import CTC_SEARCHES
from llm_ctc.tokenizer import LLMTokenizer
from llm_ctc.streaming.llm import CachedStreamingLLM
from llm_ctc.streaming.encoder import chunk_embeddings, make_window, streaming_grid
from llm_ctc.streaming.layout import SAMPLE_RATE, TICKS_PER_SECOND


@dataclass
class ChunkResult:
    index: int  # chunk b, from 0
    frames: int  # F_b
    text: str  # the hypothesis after this chunk
    tokens: List[int]
    seconds: float  # compute time of the chunk (encoder, LLM, head, search)
    attended: int = 0  # KV cache positions the chunk attended to: those kept before it and its own 2 T_b


class StreamingRecognizer:
    """One utterance at a time. ``method``: "ctc-greedy-search" or
    "ctc-prefix-beam-search" (``beam``, ``token_penalty``); both read ``blank_penalty``
    (:mod:`asr.search`). ``seam_merge_seconds`` > 0 (a model with a lookahead only, whose
    chunks' windows share the lookahead's audio): the search merges the seams over the
    query frames that many seconds span on each side of a boundary (:func:`seam_frames`;
    :mod:`asr.streaming_search`)."""

    def __init__(self, model, history_seconds: int = 8, chunk_seconds: int = 2,
                 method: str = "ctc-greedy-search", beam: int = 4, token_penalty: float = 0.0,
                 blank_penalty: float = 0.0, seam_merge_seconds: float = 0.0) -> None:
        if method not in CTC_SEARCHES:
            raise ValueError(f"unknown CTC decoding method {method!r}; valid: {', '.join(CTC_SEARCHES)}")
        self.model = model
        self.history, self.chunk_seconds = history_seconds, chunk_seconds
        self.chunk_frames = chunk_seconds * TICKS_PER_SECOND
        self.lookahead = lookahead_frames_of(model.config.streaming_lookahead_seconds, chunk_seconds,
                                             "model.streaming_lookahead_seconds")
        self.method, self.beam, self.token_penalty = method, beam, token_penalty
        self.blank_penalty = blank_penalty
        self.seam_frames = seam_frames(model, seam_merge_seconds, chunk_seconds) if seam_merge_seconds else 0
        self.tokenizer = LLMTokenizer.of_model(model)
        self.llm = CachedStreamingLLM(model, history_seconds, streaming_grid(model.config), chunk_seconds)
        self.frontend = None  # built on the first audio: features-only use needs no lhotse
        self.reset()

    def reset(self) -> None:
        self.llm.reset()
        if self.method == "ctc-greedy-search":
            self.search = StreamingGreedySearch(self.model.blank_id, self.blank_penalty, self.seam_frames)
        else:
            self.search = StreamingPrefixBeamSearch(self.beam, self.model.blank_id, self.token_penalty,
                                                    self.blank_penalty, self.seam_frames)
        self.past = None  # the last h seconds of features before the pending ones
        self.pending = None  # features not yet recognized: a chunk waiting for its lookahead, a partial one
        self.samples = torch.zeros(0)
        self.fed_audio = False  # accept_waveform was called since the reset
        self.chunk_index = 0

    # --- features ------------------------------------------------------------------

    def accept_features(self, features: Tensor) -> List[ChunkResult]:
        """Append (T, F) features; every completed chunk whose lookahead has arrived is
        recognized."""
        dim = self.model.encoder.feature_dim
        if features.dim() != 2 or features.shape[1] != dim:
            raise ValueError(f"features must have shape (T, {dim}), got {tuple(features.shape)}")
        self.pending = features if self.pending is None else torch.cat([self.pending, features])
        results = []
        while self.pending.shape[0] >= self.chunk_frames + self.lookahead:
            results.append(self._recognize_pending())
        return results

    def finish(self, tail_padding_seconds: float = 0.0) -> List[ChunkResult]:
        """Recognize the chunks still pending (the last one partial, the lookahead of the
        last ones short or none) and the pending audio, after ``tail_padding_seconds`` of
        silence (zero samples) appended to the audio: the stream's end followed by
        silence, as sherpa-onnx's tail padding (``decode.tail_padding_seconds`` decodes
        test sets so). Audio streams only: features fed to :meth:`accept_features` were
        computed without the samples their last chunk's fbank would then see."""
        if not (tail_padding_seconds >= 0 and tail_padding_seconds != float("inf")):
            raise ValueError(f"tail_padding_seconds must be a finite number of seconds >= 0, got {tail_padding_seconds!r}")
        results = []
        if tail_padding_seconds > 0:
            if not self.fed_audio and (self.pending is not None or self.chunk_index > 0):
                raise ValueError("tail_padding_seconds needs an audio stream (accept_waveform); features fed to "
                                 "accept_features cannot be followed by silence: pad their audio instead")
            results += self.accept_waveform(torch.zeros(round(tail_padding_seconds * SAMPLE_RATE)))
        if self.samples.numel():
            results += self.accept_features(self._fbank(self.samples))
            self.samples = torch.zeros(0)
        while self.pending is not None and self.pending.shape[0] > 0:
            results.append(self._recognize_pending())
        return results

    def _recognize_pending(self, lookahead: Optional[Tensor] = None) -> ChunkResult:
        """Recognize the first pending chunk, with the pending frames after it as its
        lookahead unless ``lookahead`` is given."""
        chunk = self.pending[:self.chunk_frames]
        if lookahead is None:
            lookahead = self.pending[self.chunk_frames:self.chunk_frames + self.lookahead]
        self.pending = self.pending[self.chunk_frames:]
        return self._recognize_chunk(chunk, lookahead)

    # --- audio ---------------------------------------------------------------------

    def accept_waveform(self, samples: Tensor) -> List[ChunkResult]:
        """Append 16 kHz mono samples; features are computed per chunk of audio."""
        self.fed_audio = True
        self.samples = torch.cat([self.samples, samples.float().reshape(-1)])
        per_chunk = self.chunk_seconds * SAMPLE_RATE
        results = []
        while self.samples.numel() >= per_chunk:
            chunk, self.samples = self.samples[:per_chunk], self.samples[per_chunk:]
            results += self.accept_features(self._fbank(chunk))
        needed = self.lookahead * HOP_SAMPLES + WINDOW_SAMPLES // 2 - HOP_SAMPLES // 2
        if (self.lookahead and self.pending is not None and self.pending.shape[0] >= self.chunk_frames
                and self.samples.numel() >= needed):
            # A complete chunk waits for its lookahead and the next chunk's first L frames
            # can be computed: frame j's 25 ms window ends before sample 160 j + 280.
            results.append(self._recognize_pending(self._fbank(self.samples[:needed])[:self.lookahead]))
        return results

    def _fbank(self, samples: Tensor) -> Tensor:
        if self.frontend is None:
            self.frontend = ChunkFbank(self.model.encoder.feature_dim)
        return self.frontend(samples)

    # --- state ---------------------------------------------------------------------

    @property
    def tokens(self) -> List[int]:
        return self.search.best()

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.tokens)

    def _recognize_chunk(self, chunk: Tensor, lookahead: Tensor) -> ChunkResult:
        started = time.perf_counter()
        model = self.model
        history = chunk[:0] if self.past is None else self.past
        window = make_window(history, chunk, model.config.encoder_type, lookahead if self.lookahead else None)
        with torch.no_grad():
            speech = chunk_embeddings(model, [window], [chunk.shape[0]])[0]
            attended = self.llm.cache_size + 2 * speech.shape[0]
            states = self.llm.step(speech, chunk.shape[0])
            if self.method == "ctc-greedy-search" and not self.blank_penalty:
                # The argmax of the logits is the argmax of the log-probabilities: no (T, V)
                # log-softmax (as the offline greedy search, llm_ctc.decoding).
                labels = model.frame_argmax(states)
                self.search.advance_labels(labels.tolist())
            else:
                self.search.advance(model.log_probs_of_states(states))
        keep = self.history * TICKS_PER_SECOND
        self.past = torch.cat([history, chunk])[-keep:]
        result = ChunkResult(self.chunk_index, chunk.shape[0], self.text, self.tokens,
                             time.perf_counter() - started, attended)
        self.chunk_index += 1
        return result


def seam_frames(model, seconds: float, chunk_seconds: int = 2) -> int:
    """The query frames ``seconds`` span (ceil of the feature frames over the frames per
    embedding: 4 for 0.32 s and 8 for 0.64 s on the Zipformer with a stacking projector
    of 2); ValueError for a model without a lookahead, whose chunks' windows do not
    overlap, and for seconds that are not a whole number of 10 ms frames within a chunk."""
    lookahead = lookahead_frames_of(model.config.streaming_lookahead_seconds, chunk_seconds,
                                    "model.streaming_lookahead_seconds")
    if lookahead == 0:
        raise ValueError("decode.seam_merge_seconds needs a model with a lookahead "
                         "(model.streaming_lookahead_seconds > 0): without one the chunks' encoder windows do not overlap")
    frames = lookahead_frames_of(seconds, chunk_seconds, "decode.seam_merge_seconds")
    return streaming_grid(model.config).count(frames)


def recognize_streaming(model, features: Tensor, feature_lens: Tensor, history_seconds: int = 8,
                        method: str = "ctc-greedy-search", beam: int = 4, token_penalty: float = 0.0,
                        chunk_seconds: int = 2, blank_penalty: float = 0.0, seam_merge_seconds: float = 0.0):
    """Streaming decoding of a padded batch for evaluation: each utterance chunk by chunk
    through one :class:`StreamingRecognizer` (reset between utterances). Returns token ids,
    texts and each utterance's largest KV cache (positions), to check the bound
    P + 2A + J on every utterance."""
    recognizer = StreamingRecognizer(model, history_seconds, chunk_seconds, method, beam, token_penalty,
                                     blank_penalty, seam_merge_seconds)
    ids, texts, largest = [], [], []
    for n in range(features.shape[0]):
        recognizer.reset()
        recognizer.accept_features(features[n, :int(feature_lens[n])])
        recognizer.finish()
        ids.append(recognizer.tokens)
        texts.append(recognizer.text)
        largest.append(recognizer.llm.largest_cache)
    return ids, texts, largest
