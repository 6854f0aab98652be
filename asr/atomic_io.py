"""Writing outputs so that a reader never sees a half-written file: the one way every
program of the toolkit writes manifests, feature indexes, checkpoints and result files.

Every output is first written under a temporary name in the same folder and renamed
into place once complete (a rename within one file system is
atomic). An interrupted job therefore leaves either the old state or the new one, and
a rerun that checks for the final name redoes exactly the unfinished work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from asr.config import PathLike as Pathlike

TEMPORARY_MARK = ".partial"


def temporary_name(final_path: Pathlike) -> Path:
    """``data/x.jsonl.gz`` -> ``data/x.partial.jsonl.gz``: same folder and suffixes,
    so libraries that choose a format by suffix still do the right thing."""
    final_path = Path(final_path)
    name = final_path.name
    stem, dot, suffixes = name.partition(".")
    return final_path.with_name(f"{stem}{TEMPORARY_MARK}{dot}{suffixes}")


@contextlib.contextmanager
def atomic_output(final_path: Pathlike) -> Iterator[Path]:
    """Yields a temporary path to write; renames it to ``final_path`` on success and
    removes it on failure."""
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    partial = temporary_name(final_path)
    _remove(partial)
    try:
        yield partial
    except BaseException:
        _remove(partial)
        raise
    if not partial.exists():
        raise RuntimeError(f"the writer of {final_path} produced no file at {partial}")
    os.replace(partial, final_path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_text_atomically(path: Pathlike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary sibling."""
    with atomic_output(path) as partial:
        partial.write_text(text, encoding="utf-8")


def torch_save_atomically(obj: Any, path: Pathlike) -> None:
    """``torch.save`` to ``path`` through a temporary sibling, synced to disk before the rename."""
    import torch

    with atomic_output(path) as partial:
        with open(partial, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
