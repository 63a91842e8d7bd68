"""Atomic file replacement: write a temp file beside the target, fsync, rename, fsync the folder.

A reader (the daemon's hot reload, a training run) sees the old file or the new one, never half a
file; a crash or a full disk mid-write leaves the old file in place. A writer killed with
SIGKILL leaves its temp file (`.<name>.<random>.tmp`, private like everything calmd writes);
`remove_stale_temp_files` clears them when the daemon or a training run starts.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from calmd.errors import FormatError, one_line

PRIVATE_FILE_MODE = 0o600
# Temp names: atomic_write's `.<name>.*.tmp` and CtdsWriter's spill `.<name>.*.tokens`.
TEMP_SUFFIXES = (".tmp", ".tokens")


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename inside it survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str | os.PathLike[str], *, mode: int = PRIVATE_FILE_MODE) -> Iterator[BinaryIO]:
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


def keep_copy(path: Path, copy: Path) -> None:
    """Make `copy` hold what `path` holds now, replacing it atomically: a hard link (no bytes
    copied), or a copy on a file system without them."""
    tmp = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, copy)


class UnsafeFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a folder), or one over the size limit."""


def read_regular_file(path: str | os.PathLike[str], *, limit: int) -> bytearray:
    """The whole content of a regular file, read into memory, at most `limit` bytes.

    Opened without blocking: a FIFO or a device at the path is refused (UnsafeFile), not waited
    on, as a plain open() would for good. Read, not memory-mapped: a file truncated in place
    while mapped kills its reader with SIGBUS; truncated while read, it gives a short read that
    the caller's length checks reject."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "a device or a socket"
            )  # fmt: skip
            raise UnsafeFile(errno.EINVAL, f"not a regular file ({kind})")
        if st.st_size > limit:
            raise UnsafeFile(errno.EFBIG, f"{st.st_size} bytes, over the limit of {limit}")
        buf = bytearray(st.st_size + 1)  # one byte more: a file that grew shows as a long read
        view = memoryview(buf)
        done = 0
        while done < len(buf):
            n = os.readv(fd, [view[done:]])
            if n == 0:
                break
            done += n
        view.release()
        del buf[done:]
        return buf
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap the files at `a` and `b` in one step (Linux renameat2 RENAME_EXCHANGE): at every
    instant each name holds one complete file. False when the C library or the file system
    cannot (the caller falls back to renames); OSError for anything else."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        fsync_dir(a.parent)
        if b.parent != a.parent:
            fsync_dir(b.parent)
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def remove_stale_temp_files(folder: Path, *, older_than_s: float = 60.0) -> list[str]:
    """Remove temp files a killed writer left in `folder` (not modified for `older_than_s`
    seconds: a live writer keeps writing to its own). Returns their names."""
    removed: list[str] = []
    cutoff = time.time() - older_than_s
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIXES)):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:
            continue
    return removed


def parse_json(data: str | bytes, source: str | os.PathLike[str]) -> Any:
    """json.loads of a file's text, FormatError naming `source` when it is not JSON, and when it
    nests deeper than Python's recursion (`[[[[...]]]]`: json.loads raises RecursionError, which
    ended `calm rollback` in "unexpected RecursionError")."""
    try:
        return json.loads(data)
    except RecursionError:
        raise FormatError(f"{source}: JSON nested too deeply to be a file calmd wrote") from None
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8
        raise FormatError(f"{source}: not JSON ({exc})") from None


def read_json(path: Path, what: str) -> Any:
    """A JSON file calmd wrote (the ranker, the calibration, the vocabulary); FormatError naming
    `what` and the file when it cannot be read or parsed."""
    try:
        return parse_json(path.read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError, FormatError) as exc:
        raise FormatError(f"{path}: cannot read the {what}: {one_line(exc, named=False)}") from exc


def check_format(data: Any, name: str, version: int, source: str) -> dict[str, Any]:
    """`data` as read by read_json: a JSON object of format `name` at `version`, returned as
    such; FormatError naming `source` otherwise."""
    if not isinstance(data, dict) or data.get("format") != name:
        raise FormatError(f"{source}: not a {name} file")
    if data.get("version") != version:
        raise FormatError(f"{source}: version {data.get('version')!r}, this calmd reads {version}")
    return data
