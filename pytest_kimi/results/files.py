"""Atomic file writes: a reader (or a crash) never sees a half-written result file.

Every result file (records, summaries, manifests, comparisons, baselines) is written to a
temporary name in the same folder, flushed to disk, then renamed over the old one. Rename is
atomic on POSIX: the path holds the old content or the new, never a mix. If writing fails,
the temporary file is removed and the old file is left as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def atomic_write(path: Path) -> Iterator[TextIO]:
    """Open a temporary file for text; on a clean exit it replaces ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())  # the data is on disk before the name points at it
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_write(path) as fh:
        fh.write(text)
