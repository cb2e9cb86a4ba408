"""Atomic output files for the measurement tools: a result is written beside its final path and renamed
over it, so an interrupted or failed run never leaves a half-written profile, CSV or plot behind, and
an earlier result stays intact until the new one is complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A temporary path in `path`'s directory to write; renamed to `path` when the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_target(path) as tmp:
        tmp.write_text(text)
