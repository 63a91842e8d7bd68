"""How this machine takes part in sync: `sync.json` (the folder, the mode, a git remote, the
interval), the error every misconfiguration raises, and the CALM_HOME's sync lock (the daemon and
`calm sync now` never run at once; `calm forget --all` waits for it)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from calmd import paths
from calmd.atomic import atomic_write, read_regular_file
from calmd.errors import CalmError, one_line

MODES = ("both", "send", "receive")


class SyncError(CalmError):
    """Sync is not set up, or set up wrong (one line naming the file or the flag)."""


@dataclass(frozen=True)
class SyncConfig:
    """`sync.json`: where the folder is and how this machine takes part."""

    folder: str
    mode: str = "both"  # both, send (share only), receive (receive only)
    git: str = ""  # a git remote the folder is committed to and pulled from ('' : none)
    interval_s: float = 30.0  # the daemon's export and import, every so often

    @property
    def sends(self) -> bool:
        return self.mode in ("both", "send")

    @property
    def receives(self) -> bool:
        return self.mode in ("both", "receive")


def read_config(path: Path) -> SyncConfig | None:
    """The sync config, or None when sync is not set up; SyncError naming the file and field."""
    try:
        data = json.loads(bytes(read_regular_file(path, limit=65536)).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SyncError(f"{path}: cannot read the sync config: {one_line(exc, named=False)}") from None
    if not isinstance(data, dict) or data.get("format") != "calm-sync-config":
        raise SyncError(f"{path}: not a calm sync config (run `calm sync --folder DIR` again)")
    folder, mode, git, interval = data.get("folder"), data.get("mode", "both"), data.get("git", ""), \
        data.get("interval_s", 30.0)  # fmt: skip
    if not isinstance(folder, str) or not folder.startswith("/") or not _is_text(folder):
        raise SyncError(f"{path}: field 'folder' must be an absolute path")
    if mode not in MODES:
        raise SyncError(f"{path}: field 'mode' must be one of {', '.join(MODES)}")
    if not isinstance(git, str):
        raise SyncError(f"{path}: field 'git' must be a text (a git remote) or empty")
    if not isinstance(interval, int | float) or not math.isfinite(interval) or interval <= 0:
        raise SyncError(f"{path}: field 'interval_s' must be a positive number of seconds")
    return SyncConfig(folder, mode, git, float(interval))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def write_config(path: Path, config: SyncConfig) -> None:
    data = {"format": "calm-sync-config", "version": 1, **dataclasses.asdict(config)}
    with atomic_write(path) as f:
        f.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))


@contextlib.contextmanager
def sync_lock(data_dir: Path) -> Iterator[bool]:
    """The CALM_HOME's sync lock (a file lock), taken without waiting: whether it was."""
    fd = os.open(paths.sync_lock_path(data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
