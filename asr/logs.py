"""Logging of the toolkit's programs: one setup for training and decoding, and the
duration format of their progress lines (rate and ETA)."""

from __future__ import annotations

import datetime
import logging
import sys
from pathlib import Path


def setup_logging(exp_dir: Path, program: str, rank: int = 0) -> Path:
    """Console (rank 0) + ``exp_dir/log/log-<program>-<time>[-rank<R>]`` lines with timestamps.

    Returns the log file's path.
    """
    log_dir = Path(exp_dir) / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H-%M-%S")
    path = log_dir / f"log-{program}-{stamp}{'' if rank == 0 else f'-rank{rank}'}"
    handlers = [logging.FileHandler(path)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, force=True, handlers=handlers,
                        format=f"%(asctime)s %(levelname)s [rank {rank}] %(message)s")
    return path


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` for a progress line's ETA."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
