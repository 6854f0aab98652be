"""Streaming Query-readout LLM-CTC on the LLM side (Sec. 4.3, Fig. 2, eq. 11, App. E).

* :func:`parallel_query_states`: training-time forward, all chunks of a padded batch at
  once under the streaming mask; the query outputs concatenated in chunk order are the
  X rows of the utterance-level Pruned CTC loss (:func:`streaming_loss`).
* :class:`CachedStreamingLLM`: inference, one utterance chunk by chunk: one LLM forward of
  [E_b, Q_b] against the KV cache with explicit absolute position ids, then eviction of
  every non-prompt entry with tau < a_b + 0.01 F_b - h. Retained entries keep their
  original positions: cached keys are stored already rotated, so rows are only dropped.

Both paths take projected speech embeddings (from :mod:`llm_ctc.streaming.encoder` or
fixed, as in App. E's fixed-input checks) and the same :class:`UtteranceLayout` rule.
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from llm_ctc.language_model import backbone_states
from llm_ctc.streaming.layout import TICKS_PER_SECOND, TimeGrid, UtteranceLayout, evictable
from llm_ctc.streaming.mask import additive, streaming_mask, visibility


def _prompt(model) -> Tensor:
    return model.embed_tokens(torch.tensor(model.prompt_ids, dtype=torch.long, device=model.device))


def _check_query_model(model) -> None:
    if getattr(model, "query", None) is None:
        raise ValueError("streaming LLM-CTC needs the query readout (model.readout 'query', Sec. 4.3)")


def position_offsets_for_step(seed: int, step: int, count: int, max_chunks: int, chunk_positions: int) -> List[int]:
    """Training's position shifts of ``count`` utterances for step ``step``: each k * 2A
    with k uniform in 0 .. ``max_chunks`` (``chunk_positions`` = 2A, the speech and query
    positions of a full chunk), a function of (seed, step) only, as the history."""
    if max_chunks < 0 or chunk_positions < 1:
        raise ValueError(f"max_chunks must be >= 0 and chunk_positions >= 1, got {max_chunks} and {chunk_positions}")
    rng = random.Random((seed << 32) + step + (1 << 31))  # a stream apart from history_for_step's
    return [rng.randint(0, max_chunks) * chunk_positions for _ in range(count)]


def parallel_inputs(model, speech: Tensor, layouts: Sequence[UtteranceLayout], history_seconds: int,
                    position_offsets: Optional[Sequence[int]] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The parallel masked pass's LLM inputs (N, L, D), additive mask (N, 1, L, L) and
    position ids (N, L), from projected speech (N, T, D) whose row t of utterance n is its
    t-th embedding over all chunks. ``position_offsets``: per utterance, a shift of every
    non-prompt position id (the rotary positions of the same chunks later in a long
    stream; the mask is unchanged)."""
    _check_query_model(model)
    prompt = _prompt(model)
    batch, max_frames, dim = speech.shape
    if len(layouts) != batch:
        raise ValueError(f"{len(layouts)} layouts for a batch of {batch} utterances")
    for n, layout in enumerate(layouts):
        if layout.prompt_len != prompt.shape[0] or layout.num_frames > max_frames:
            raise ValueError(f"layout {n} has prompt {layout.prompt_len} and {layout.num_frames} frames; "
                             f"the model's prompt has {prompt.shape[0]} and speech {max_frames} rows")
    width = max(layout.length for layout in layouts)
    # Source rows: [prompt | query | zero | speech (N * T)]; one gather keeps gradients.
    query_row, zero_row, speech_base = prompt.shape[0], prompt.shape[0] + 1, prompt.shape[0] + 2
    sources = torch.cat([prompt.to(speech.dtype), model.query.to(speech.dtype)[None], speech.new_zeros(1, dim),
                         speech.reshape(batch * max_frames, dim)])
    index = torch.full((batch, width), zero_row, dtype=torch.long)
    for n, layout in enumerate(layouts):
        rows = [k if k < layout.prompt_len else
                query_row if layout.is_query[k] else speech_base + n * max_frames + layout.speech_index[k]
                for k in range(layout.length)]
        index[n, :layout.length] = torch.tensor(rows)
    inputs = sources[index.to(speech.device)]
    mask = streaming_mask(layouts, history_seconds, inputs.dtype, width, device=speech.device)
    positions = torch.arange(width, device=speech.device)[None].expand(batch, width).contiguous()
    if position_offsets is not None:
        shift = torch.tensor(list(position_offsets), dtype=torch.long, device=speech.device)
        positions = positions + torch.where(positions >= prompt.shape[0], shift[:, None], 0)
    return inputs, mask, positions


def parallel_query_states(model, speech: Tensor, layouts: Sequence[UtteranceLayout],
                          history_seconds: int, position_offsets: Optional[Sequence[int]] = None
                          ) -> Tuple[Tensor, Tensor]:
    """Query outputs (N, T_n max, D) in chunk order and T_n (N,) of the parallel masked
    pass over :func:`parallel_inputs`."""
    inputs, mask, positions = parallel_inputs(model, speech, layouts, history_seconds, position_offsets)
    batch = inputs.shape[0]
    hidden = backbone_states(model.llm, inputs, mask, positions)
    lens = torch.tensor([layout.num_frames for layout in layouts], device=speech.device)
    read = torch.zeros(batch, int(lens.max()), dtype=torch.long)
    for n, layout in enumerate(layouts):
        read[n, :layout.num_frames] = torch.tensor(layout.query_positions)
    states = torch.gather(hidden, 1, read.to(speech.device)[..., None].expand(-1, -1, hidden.shape[-1]))
    valid = torch.arange(read.shape[1], device=speech.device)[None] < lens[:, None]
    return states * valid[..., None].to(states.dtype), lens


def streaming_loss(model, speech: Tensor, layouts: Sequence[UtteranceLayout], history_seconds: int,
                   targets, target_lengths: Optional[Tensor] = None,
                   position_offsets: Optional[Sequence[int]] = None) -> Tuple[Tensor, Dict[str, Any]]:
    """The utterance-level Pruned CTC loss over the concatenated query outputs (eq. 11),
    exactly as the offline model's loss over its X rows."""
    states, lens = parallel_query_states(model, speech, layouts, history_seconds, position_offsets)
    return model.loss_of_states(states, lens, targets, target_lengths)


class CachedStreamingLLM:
    """One utterance's LLM state: the KV cache with each entry's time coordinate (None
    for the prompt). :meth:`step` takes one chunk's embeddings E_b (T_b, D) and its F_b;
    :meth:`reset` starts the next utterance."""

    def __init__(self, model, history_seconds: int, grid: TimeGrid, chunk_seconds: int = 2) -> None:
        _check_query_model(model)
        if history_seconds < 1:
            raise ValueError(f"history_seconds must be >= 1, got {history_seconds}")
        self.model, self.history, self.grid = model, history_seconds, grid
        self.chunk_ticks = chunk_seconds * TICKS_PER_SECOND
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        prompt = _prompt(self.model)
        length = prompt.shape[0]
        self.next_position = length
        self.cache_tau: List[Optional[int]] = [None] * length
        self.cache_positions: List[int] = list(range(length))
        self.chunk_index = 0
        self.largest_cache = length
        if length:
            causal = torch.ones(length, length, dtype=torch.bool, device=prompt.device).tril()
            mask = additive(causal, prompt.dtype)[None, None]
            positions = torch.arange(length, device=prompt.device)[None]
            with torch.no_grad():
                _, self.cache = backbone_states(self.model.llm, prompt[None], mask, positions,
                                                cache=self.cache, use_cache=True)

    @property
    def cache_size(self) -> int:
        return len(self.cache_tau)

    def step(self, speech: Tensor, chunk_frames: int) -> Tensor:
        """Query states (T_b, D) of the next chunk from its speech embeddings (T_b, D)."""
        count = self.grid.count(chunk_frames)
        if speech.dim() != 2 or speech.shape[0] != count:
            raise ValueError(f"chunk {self.chunk_index} with F_b = {chunk_frames} frames needs ({count}, D) "
                             f"speech embeddings, got {tuple(speech.shape)}")
        start = self.chunk_index * self.chunk_ticks
        times = [start + offset for offset in self.grid.offsets(count)]
        new_tau = times + times
        device, dtype = speech.device, speech.dtype
        inputs = torch.cat([speech, self.model.query.to(dtype)[None].expand(count, -1)])[None]
        # The mask from the definition over [cache rows, new rows]; every retained row
        # is visible here, the check is only that the rule says so.
        key_tau = [0 if t is None else t for t in self.cache_tau] + new_tau
        key_chunk = [-1 if t is None else self.chunk_index - 1 for t in self.cache_tau] + \
            [self.chunk_index] * (2 * count)
        chunk = torch.tensor(key_chunk, dtype=torch.long, device=device)
        tau = torch.tensor(key_tau, dtype=torch.long, device=device)
        starts = torch.where(chunk >= 0, start, 0)
        visible = visibility(chunk, tau, starts, self.history)[self.cache_size:]
        mask = additive(visible, dtype)[None, None]
        positions = torch.arange(self.next_position, self.next_position + 2 * count, device=device)[None]
        with torch.no_grad():
            hidden, self.cache = backbone_states(self.model.llm, inputs, mask, positions,
                                                 cache=self.cache, use_cache=True)
        self.cache_tau += new_tau
        self.cache_positions += positions[0].tolist()
        self.largest_cache = max(self.largest_cache, self.cache_size)
        self.evict(start, chunk_frames)
        self.next_position += 2 * count
        self.chunk_index += 1
        return hidden[0, count:]

    def evict(self, chunk_start: int, chunk_frames: int) -> None:
        """Keep the prompt and the entries with tau >= a_b + 0.01 F_b - h (App. E)."""
        keep = [k for k, t in enumerate(self.cache_tau)
                if t is None or not evictable(t, chunk_start, chunk_frames, self.history)]
        if len(keep) == len(self.cache_tau):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.model.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)
        self.cache_tau = [self.cache_tau[k] for k in keep]
        self.cache_positions = [self.cache_positions[k] for k in keep]


def streaming_training_loss(model, features: Tensor, feature_lens: Tensor, targets, history_seconds: int,
                            target_lengths: Optional[Tensor] = None, chunk_seconds: int = 2,
                            position_offsets: Optional[Sequence[int]] = None) -> Tuple[Tensor, Dict[str, Any]]:
    """What a training step calls (Sec. 4.3, App. D.4): encoder windows of h seconds of
    history + chunk, projector per chunk, all chunks in parallel under the mask with the
    same h, Pruned CTC over the concatenated query outputs. Validation uses h = 8."""
    from llm_ctc.streaming.encoder import streaming_speech_embeddings

    speech, layouts = streaming_speech_embeddings(model, features, feature_lens, history_seconds, chunk_seconds)
    return streaming_loss(model, speech, layouts, history_seconds, targets, target_lengths, position_offsets)
