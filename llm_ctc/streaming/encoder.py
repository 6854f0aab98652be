"""The encoder side of streaming LLM-CTC (Sec. 4.3): for chunk b the frozen encoder sees
the preceding h seconds with the chunk (never later audio; with
``model.streaming_lookahead_seconds``, not in the paper, also that much of the next
chunk) and only the current chunk's outputs go on to the projector. The windows of all
chunks run as independent sequences, batched by length (App. D.4: at most 10 s of
encoder input per chunk with h = 8 s).

Which encoder frames belong to the chunk, for a window of H history frames and the
chunk's F frames (H a multiple of 100: chunks start on whole seconds):

* Qwen3-ASR: windows of 100 mel frames give 13 frames each, so the chunk's are the last
  13 floor(F/100) + ceil((F mod 100)/8) (App. E), starting at 13 H / 100.
* Zipformer: :mod:`zipformer.windows` (25 frames per second; the window is extended by
  copies of its last frame, not by later audio).

The projector then runs per chunk (a stacking projector groups from the chunk start),
giving the :func:`streaming_grid`'s T_b embeddings.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from asr.chunk_windows import chunk_windows as feature_windows
from asr.chunk_windows import encode_windows, feature_chunk_frames
from asr.lookahead import lookahead_frames_of
from llm_ctc.streaming.layout import FrameRateGrid, Qwen3ASRGrid, TimeGrid, UtteranceLayout, utterance_layout
from zipformer import windows as zipformer_windows


def streaming_grid(config) -> TimeGrid:
    """The time grid of the model's encoder + projector."""
    if config.encoder_type == "qwen3_asr":
        if config.projector_type != "mlp":
            raise ValueError("streaming with the Qwen3-ASR encoder needs model.projector_type 'mlp'")
        return Qwen3ASRGrid()
    stack = config.projector_stack if config.projector_type == "stack" else 1
    return FrameRateGrid(zipformer_windows.FRAMES_PER_OUTPUT * stack)


def chunk_output_range(encoder_type: str, history_frames: int, chunk_frames: int) -> Tuple[int, int]:
    """(first encoder frame of the chunk in its window, number of them)."""
    if encoder_type == "qwen3_asr":
        return 13 * (history_frames // 100), Qwen3ASRGrid().count(chunk_frames)
    return zipformer_windows.chunk_output_range(history_frames, chunk_frames)


def chunk_windows(features: Tensor, history_seconds: int, encoder_type: str,
                  chunk_seconds: int = 2, lookahead_frames: int = 0) -> List[Tuple[Tensor, int]]:
    """(window features, history frames) per chunk of one utterance's (T, F) features."""
    return [make_window(history, chunk, encoder_type, lookahead)
            for history, chunk, lookahead in feature_windows(features, chunk_seconds, history_seconds,
                                                             lookahead_frames)]


def make_window(history: Tensor, chunk: Tensor, encoder_type: str,
                lookahead: Optional[Tensor] = None) -> Tuple[Tensor, int]:
    """(encoder input, history frames) from the history's, the chunk's and the lookahead's
    features (the lookahead: the Zipformer only)."""
    if encoder_type != "qwen3_asr":
        return zipformer_windows.window_input(history, chunk, lookahead)
    if lookahead is not None and lookahead.shape[0]:
        raise ValueError("the Qwen3-ASR encoder streams without lookahead")
    return torch.cat([history, chunk]), history.shape[0]


def lookahead_frames(config) -> int:
    """The model's lookahead into the next chunk, in feature frames."""
    return lookahead_frames_of(config.streaming_lookahead_seconds, config.streaming_chunk_seconds,
                               "model.streaming_lookahead_seconds")


def streaming_speech_embeddings(model, features: Tensor, feature_lens: Tensor, history_seconds: int,
                                chunk_seconds: int = 2) -> Tuple[Tensor, List[UtteranceLayout]]:
    """Projected speech (N, T_n max, D) of every chunk of a padded batch, in chunk order,
    and the utterances' layouts."""
    config, grid = model.config, streaming_grid(model.config)
    prompt_len = len(model.prompt_ids)
    layouts, windows = [], []
    for n in range(features.shape[0]):
        frames = feature_chunk_frames(int(feature_lens[n]), chunk_seconds)
        layouts.append(utterance_layout(prompt_len, frames, grid, chunk_seconds))
        windows += chunk_windows(features[n, :int(feature_lens[n])], history_seconds, config.encoder_type,
                                 chunk_seconds, lookahead_frames(config))
    all_frames = [f for layout in layouts for f in layout.chunk_frames]
    embeddings = chunk_embeddings(model, windows, all_frames)
    dim = embeddings[0].shape[-1]
    speech = embeddings[0].new_zeros(len(layouts), max(layout.num_frames for layout in layouts), dim)
    index = 0
    for n, layout in enumerate(layouts):
        parts = embeddings[index:index + len(layout.chunk_frames)]
        index += len(layout.chunk_frames)
        speech[n, :layout.num_frames] = torch.cat(parts)
    return speech, layouts


def chunk_embeddings(model, windows: Sequence[Tuple[Tensor, int]], chunk_frames: Sequence[int]) -> List[Tensor]:
    """Projected embeddings (T_b, D) of each chunk from its (window, history frames)."""
    config = model.config
    encoded = encode_windows(model.encoder, [window for window, _ in windows], model.device)
    ranges = [chunk_output_range(config.encoder_type, history, frames)
              for (_, history), frames in zip(windows, chunk_frames)]
    counts = torch.tensor([count for _, count in ranges], device=encoded[0].device)
    current = encoded[0].new_zeros(len(windows), int(counts.max()), encoded[0].shape[-1])
    for m, (first, count) in enumerate(ranges):
        if first + count > encoded[m].shape[0]:
            raise RuntimeError(f"chunk window {m} gave {encoded[m].shape[0]} encoder frames, "
                               f"fewer than the {first + count} its chunk needs")
        current[m, :count] = encoded[m][first:first + count]
    projected, projected_lens = model.projector(current.to(model.projector_dtype), counts)
    grid = streaming_grid(config)
    expected = [grid.count(frames) for frames in chunk_frames]
    if projected_lens.tolist() != expected:
        raise RuntimeError(f"projector gave {projected_lens.tolist()} embeddings per chunk, the time "
                           f"grid says {expected}")
    projected = projected.to(model.llm_dtype)
    return [projected[m, :count] for m, count in enumerate(expected)]
