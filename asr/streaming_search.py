"""CTC search fed chunk by chunk (streaming, paper Sec. 4.3 and Fig. 2c): the search
state persists across chunk boundaries, so the result over chunks equals the offline
search over the concatenated log-probabilities.

* :class:`StreamingGreedySearch` keeps the previous frame's raw label (blank included):
  a token repeated across a boundary is collapsed, one separated by a blank is not.
* :class:`StreamingPrefixBeamSearch` keeps each prefix with its blank-ending and
  token-ending log-probabilities (the CTC collapse spans chunk boundaries).

Both are per utterance (the state is model-independent: it only sees (T, V)
log-probabilities); :meth:`reset` starts a new utterance.

``seam_frames`` S > 0 (default 0: off; :class:`SeamMerge`) merges the seams of chunks
whose encoder windows overlap (a lookahead into the next chunk; not in the paper): the
tokens the frame argmax takes in the first S frames of a chunk, where they repeat the
tokens it took last in the last S frames of the chunk before (the longest such overlap),
are one observation of the shared audio, so the later chunk's frames up to the next
token read them as blank (their probability added to blank's): both
searches then write the tokens once, as decoders of overlapping buffers merge their
seams. The per-frame step of the
prefix beam search is :func:`asr.search.ctc_prefix_beam_search`'s own (``_advance_frames``,
the same pruning argument and tie order) over a state kept between calls; token sequences
are kept per beam slot and extended after each chunk from that chunk's back-pointers.
"""

from __future__ import annotations

from typing import List, Sequence

import numba
import numpy as np
import torch

from asr.search import _NO_TOKEN, Hypothesis, _advance_frames, _check_penalty, _check_search_options, _log_add, penalized_argmax

__all__ = ["SeamMerge", "StreamingGreedySearch", "StreamingPrefixBeamSearch"]


def _chunk_array(log_probs: torch.Tensor, blank_id: int) -> np.ndarray:
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 2 or not log_probs.is_floating_point():
        raise ValueError("log_probs must be a floating (T, V) tensor of one chunk, got "
                         f"{getattr(log_probs, 'shape', type(log_probs).__name__)}")
    if not 0 <= blank_id < log_probs.shape[1]:
        raise ValueError(f"blank_id must lie in [0, V={log_probs.shape[1]}), got {blank_id}")
    scores = log_probs.detach()
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    return np.ascontiguousarray(scores.cpu().numpy())


class SeamMerge:
    """The seam rule over the frame argmax of consecutive chunks (``seam_frames`` S >= 1):
    A = the tokens (CTC collapse, blank dropped) the argmax takes in the last S frames of
    a chunk, B = those it takes in the first S frames of the next (a run continuing
    across the boundary is no new token); the longest j >= 1 with A[-j:] == B[:j]: the
    later chunk's frames from its first to the next token after B[j-1]'s run (past the
    window too; the chunk's end if none) read the tokens of B[:j] as blank. Then the next seam's A is read from this chunk's
    argmax after the change."""

    def __init__(self, blank_id: int, seam_frames: int) -> None:
        _check_seam_frames(seam_frames)
        self.blank_id, self.seam_frames = blank_id, seam_frames
        self.reset()

    def reset(self) -> None:
        self.tail: List[int] = []  # A of the next seam
        self.previous = _NO_TOKEN  # the argmax of the last frame so far

    def merged(self, labels: Sequence[int]) -> Tuple[int, List[int]]:
        """(F, tokens): this chunk's frames 0 .. F - 1 (its argmax ``labels``) read
        ``tokens`` as blank (F = 0: none); updates the state for the next chunk."""
        labels = [int(label) for label in labels]
        window = self.seam_frames
        head, frames_of, previous = [], [], self.previous
        for frame, label in enumerate(labels[:window]):
            if label != self.blank_id and label != previous:
                head.append(label)
                frames_of.append([frame])
            elif label != self.blank_id and frames_of and label == previous:
                frames_of[-1].append(frame)  # the same run
            previous = label
        end, tokens = 0, []
        for j in range(min(len(self.tail), len(head)), 0, -1):
            if self.tail[-j:] == head[:j]:
                end, tokens = frames_of[j - 1][-1] + 1, head[:j]
                while end < len(labels) and labels[end] == head[j - 1]:
                    end += 1  # the last run to its end, past the window too,
                while end < len(labels) and labels[end] == self.blank_id:
                    end += 1  # and the blanks after it
                break
        kept = [self.blank_id if frame < end and label in tokens else label for frame, label in enumerate(labels)]
        if kept:
            start = max(0, len(kept) - window)
            previous = kept[start - 1] if start else self.previous
            self.tail = []
            for label in kept[start:]:
                if label != self.blank_id and label != previous:
                    self.tail.append(label)
                previous = label
            self.previous = kept[-1]
        return end, tokens


class StreamingGreedySearch:
    """Best label per frame; a token is emitted when it is not blank and differs from
    the previous frame's raw label, the previous chunk's last frame included.
    ``blank_penalty`` as in :func:`asr.search.ctc_greedy_search`."""

    def __init__(self, blank_id: int = 0, blank_penalty: float = 0.0, seam_frames: int = 0) -> None:
        _check_penalty("blank_penalty", blank_penalty)
        self.blank_id, self.blank_penalty = blank_id, float(blank_penalty)
        self.seams = SeamMerge(blank_id, seam_frames) if seam_frames else None
        self.reset()

    def reset(self) -> None:
        self.tokens: List[int] = []
        self.previous = _NO_TOKEN
        if self.seams is not None:
            self.seams.reset()

    def advance(self, log_probs: torch.Tensor) -> List[int]:
        """Feed one chunk's (T, V) log-probabilities; returns the tokens emitted by it."""
        scores = torch.from_numpy(_chunk_array(log_probs, self.blank_id))
        return self.advance_labels(penalized_argmax(scores, self.blank_id, self.blank_penalty).tolist())

    def advance_labels(self, best: Sequence[int]) -> List[int]:
        """Feed one chunk's best label per frame (as the argmax of its log-probabilities,
        e.g. from the logits without a log-softmax, with the blank penalty already applied);
        returns the tokens emitted by it."""
        if self.seams is not None:
            end, tokens = self.seams.merged(best)
            best = [self.blank_id if frame < end and label in tokens else label for frame, label in enumerate(best)]
        emitted = []
        for label in best:
            if label != self.blank_id and label != self.previous:
                emitted.append(label)
            self.previous = label
        self.tokens.extend(emitted)
        return emitted

    def best(self) -> List[int]:
        return list(self.tokens)


class StreamingPrefixBeamSearch:
    """Prefix beam search over chunks (``beam``, ``token_penalty``, ``blank_penalty`` as
    in :func:`asr.search.ctc_prefix_beam_search`)."""

    def __init__(self, beam: int = 4, blank_id: int = 0, token_penalty: float = 0.0,
                 blank_penalty: float = 0.0, seam_frames: int = 0) -> None:
        _check_search_options(beam, token_penalty, blank_penalty)
        self.beam, self.blank_id, self.token_penalty = beam, blank_id, float(token_penalty)
        self.blank_penalty = float(blank_penalty)
        self.seams = SeamMerge(blank_id, seam_frames) if seam_frames else None
        self.reset()

    def reset(self) -> None:
        if self.seams is not None:
            self.seams.reset()
        beam = self.beam
        self.log_p_blank = np.full(beam, -np.inf)
        self.log_p_token = np.full(beam, -np.inf)
        self.length = np.zeros(beam, np.int64)
        self.last = np.full(beam, _NO_TOKEN, np.int64)
        self.prefix_hash = np.zeros(beam, np.uint64)
        self.parent_hash = np.zeros(beam, np.uint64)
        self.log_p_blank[0] = 0.0
        self.size = 1
        self.tokens: List[List[int]] = [[]]

    def advance(self, log_probs: torch.Tensor) -> None:
        """Feed one chunk's (T, V) log-probabilities."""
        scores = _chunk_array(log_probs, self.blank_id)
        if scores.shape[0] == 0:
            return
        if self.seams is not None:
            best = penalized_argmax(torch.from_numpy(scores), self.blank_id, self.blank_penalty).tolist()
            end, tokens = self.seams.merged(best)
            if end:
                scores = scores.copy()
                for token in set(tokens):  # the token's probability goes to blank
                    scores[:end, self.blank_id] = np.logaddexp(scores[:end, self.blank_id], scores[:end, token])
                    scores[:end, token] = -np.inf
        num_extensions = min(self.beam + 1, scores.shape[1] - 1)
        size, source, emitted = _advance_frames(
            scores, self.beam, self.blank_id, num_extensions, self.token_penalty, self.blank_penalty, self.size,
            self.log_p_blank, self.log_p_token, self.length, self.last, self.prefix_hash, self.parent_hash)
        origins, new_tokens, counts = _backtrack_chunk(source, emitted, size)
        self.tokens = [self.tokens[origins[s]] + new_tokens[s, :counts[s]].tolist() for s in range(size)]
        self.size = size

    def nbest(self) -> List[Hypothesis]:
        """The live hypotheses, best first (the state itself is not reordered)."""
        totals = np.array([_log_add(self.log_p_blank[s], self.log_p_token[s]) for s in range(self.size)])
        ranks = totals + self.token_penalty * self.length[:self.size]
        order = np.argsort(-ranks, kind="mergesort")
        hypotheses = [Hypothesis(list(self.tokens[s]), float(ranks[s]), float(totals[s])) for s in order]
        return hypotheses[:1] + [h for h in hypotheses[1:] if h.log_prob > -np.inf]

    def best(self) -> List[int]:
        return self.nbest()[0].tokens


def _check_seam_frames(seam_frames: int) -> None:
    if isinstance(seam_frames, bool) or not isinstance(seam_frames, int) or seam_frames < 1:
        raise ValueError(f"seam_frames must be a whole number of frames >= 1 (0: no seam merge), got {seam_frames!r}")


@numba.njit(cache=True)
def _backtrack_chunk(source, emitted, size):
    """For each final slot s < size: the slot it came from at the chunk start and the
    tokens it appended within the chunk (row s, counts[s] of them)."""
    num_frames = source.shape[0]
    origins = np.empty(size, np.int64)
    counts = np.zeros(size, np.int64)
    tokens = np.full((size, num_frames), _NO_TOKEN, np.int64)
    for s in range(size):
        slot = s
        for frame in range(num_frames - 1, -1, -1):
            if emitted[frame, slot] != _NO_TOKEN:
                counts[s] += 1
            slot = source[frame, slot]
        origins[s] = slot
        position = counts[s]
        slot = s
        for frame in range(num_frames - 1, -1, -1):
            if emitted[frame, slot] != _NO_TOKEN:
                position -= 1
                tokens[s, position] = emitted[frame, slot]
            slot = source[frame, slot]
    return origins, tokens, counts
