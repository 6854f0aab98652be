"""The lookahead of a bounded-history streaming encoder, in feature frames (standard
library only: model configurations check it when they are read).

The paper's windows (Sec. 4.3, App. D.4) end with the chunk. A lookahead of L seconds
(not in the paper) also gives each chunk's window the first L seconds of the next chunk,
as right context of the chunk's last frames (:func:`asr.chunk_windows.chunk_windows`);
the chunk's output then waits for that much more audio.
"""

from __future__ import annotations

from asr.constants import FRAMES_PER_SECOND


def lookahead_frames_of(lookahead_seconds: float, chunk_seconds: int, name: str = "lookahead_seconds") -> int:
    """Feature frames (10 ms) of a lookahead given in seconds: a whole number of frames,
    at most one chunk (the lookahead is the start of the next chunk)."""
    try:
        exact = float(lookahead_seconds) * FRAMES_PER_SECOND
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {lookahead_seconds!r}") from None
    frames = round(exact)
    if abs(frames - exact) > 1e-6 or not 0 <= frames <= chunk_seconds * FRAMES_PER_SECOND:
        raise ValueError(f"{name} must be a multiple of 0.01 s between 0 and the {chunk_seconds} s chunk, "
                         f"got {lookahead_seconds}")
    return frames
