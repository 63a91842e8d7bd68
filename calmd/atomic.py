"""Atomic file replacement: write a temp file beside the target, fsync, rename, fsync the folder.

A reader (the daemon's hot reload, a training run) sees the old file or the new one, never half a
file; a crash or a full disk mid-write leaves the old file in place and no temp file behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename inside it survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """`with atomic_write(p) as f: f.write(...)` replaces `p` only if the block completes."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
