"""The shell helper's transport for fish, which can keep no file descriptor open between commands
(no `exec {fd}<>`, no coprocess): the same helper and line protocol as bash and zsh
(calmd/shell/helper.py), carried by files.

- Requests: the hook writes each line (or a few) to a new file in a private folder (`mktemp -d`,
  0700), named by an increasing number, with fish's builtin `printf`: a regular file never blocks
  the shell, whatever became of the helper. The helper sees it through inotify (Linux; elsewhere
  it looks every POLL_S), reads the files in numeric order once they end with a newline, and
  removes them.
- Replies: only the final answer to a `c` request, through the FIFO `reply` in that folder, as
  NUL-separated fields (`seq`, `1`, flags, candidates: no escaping, fish splits them with `string
  split0`). The hook reads it with `timeout $CALM_TIMEOUT cat reply`, so a helper that is gone or
  slow costs the key at most CALM_TIMEOUT. The helper opens the FIFO without blocking, which works
  only while that `cat` is there: an answer nobody waits for any more is dropped (after the
  timeout), never left in the pipe for the next key.
- The helper goes when its shell does (the hook gives its pid, `--shell-pid $fish_pid`:
  calmd/shell/lifetime.py), on SIGTERM and on SIGHUP, and removes the folder (its FIFO, the request
  files not read yet) on each of these ways out. A record's file's mtime is when fish wrote it:
  the start of a command fish gives no time for is that less the seconds it ran (fish has no
  clock builtin; the helper may read the file late, when it has just started).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import select
import shutil
import signal
import stat
import time
from pathlib import Path
from typing import Any

from calmd.shell.helper import PARENT_CHECK_EVERY, Helper, log, serve_shell

POLL_S = 0.05  # without inotify: how often the folder is looked at
IN_CLOSE_WRITE, IN_MOVED_TO = 0x8, 0x80
REPLY_FIFO = "reply"
REPLY_WAIT_S = 5.0  # an answer waits this long for the hook's reader, at most (its CALM_TIMEOUT is less)
MAX_REQUEST_BYTES = 1 << 20  # a request file larger than this is not the hook's: removed unread


def inotify(folder: Path) -> int | None:
    """A non-blocking inotify descriptor watching files written in `folder`, or None (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(folder), IN_CLOSE_WRITE | IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd


class SpoolHelper(Helper):
    """The helper with fish's transport (module docstring)."""

    def __init__(self, session: str, socket_path: Path, folder: Path, **options: Any) -> None:
        super().__init__(session, socket_path, stdin=-1, stdout=-1, **options)
        self.folder = folder
        self.fifo = folder / REPLY_FIFO
        self.pending: list[tuple[bytes, float]] = []  # answers waiting for the hook's reader

    def check_folder(self) -> None:
        """The folder must be the hook's: a directory of ours (else it is left alone, never removed)."""
        st = os.lstat(self.folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise PermissionError(f"{self.folder} is not a folder of this user")

    def prepare(self) -> int | None:
        """The folder made private, the reply FIFO, the watch on the folder; what is there read."""
        os.chmod(self.folder, 0o700)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.fifo, 0o600)
        watch = inotify(self.folder)  # before the first look: nothing written after it is missed
        self.read_spool()
        return watch

    def read_spool(self) -> None:
        """Take the request files written so far, oldest first; incomplete ones wait."""
        names = sorted((int(e.name), e.name) for e in os.scandir(self.folder) if e.name.isdigit())
        for _, name in names:
            path = self.folder / name
            try:
                st = path.stat()
                if st.st_size > MAX_REQUEST_BYTES:
                    path.unlink()
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            if not data.endswith(b"\n"):
                return  # still being written: it and those after it wait for the next look
            path.unlink()
            for raw in data.split(b"\n")[:-1]:
                self.take(raw, st.st_mtime)  # when fish wrote it: a record's end

    def take(self, raw: bytes, written: float | None = None) -> None:
        if raw.startswith(b"c\t"):
            self.pending.clear()  # the hook waits for this answer now, never for an older one
        super().take(raw, written)

    def emit(
        self, seq: str, final: bool, candidates: list[str], confident: list[bool] | None = None,
        keys: list[str] | None = None,
    ) -> None:  # fmt: skip
        """(fish asks for no first keys: `keys` stays out.)"""
        if not final:
            return  # fish reads one answer per key: the final one
        sure = confident if confident is not None else [True] * len(candidates)
        fields = [seq, "1", "".join("1" if f else "0" for f in sure), *candidates]
        data = "\0".join(fields).encode("utf-8", "replace") + b"\0"
        self.pending.append((data, time.monotonic() + REPLY_WAIT_S))

    def flush(self) -> None:
        """Hand the answers to the hook's reader when it is there; drop those it gave up on."""
        now = time.monotonic()
        self.pending = [(data, deadline) for data, deadline in self.pending if deadline > now]
        if self.pending:
            self.read_spool()  # a newer request written before its reader came makes these stale
        while self.pending:
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno in (errno.ENXIO, errno.ENOENT):
                    return  # no reader yet: tried again shortly
                raise
            data = self.pending[-1][0]
            self.pending.clear()  # the newest answer is the one the hook waits for
            try:
                os.set_blocking(fd, True)
                while data:
                    data = data[os.write(fd, data) :]
            except BrokenPipeError:
                log.info("the hook stopped reading an answer")
            finally:
                os.close(fd)

    def run(self) -> int:
        self.check_folder()
        watch: int | None = None
        try:
            if self.watch is not None and self.watch.gone():
                return 0  # the shell ended before the helper ran: its folder goes too
            watch = self.prepare()
            self.loop(watch)
            return 0
        finally:
            if watch is not None:
                os.close(watch)
            shutil.rmtree(self.folder, ignore_errors=True)

    def loop(self, watch: int | None) -> None:
        """Until the shell is gone: requests in, answers out (the module's docstring)."""
        last_check = time.monotonic()
        while True:
            self.send_work()
            self.flush()
            fds = ([] if watch is None else [watch]) + self.watched()
            if self.client is not None:
                fds.append(self.client.fileno())
            wait = PARENT_CHECK_EVERY if watch is not None else POLL_S
            if self.pending:
                wait = 0.005  # the hook's reader is about to open the FIFO
            elif not self.chores_done:
                wait = min(wait, 0.5)
            try:
                ready, _, _ = select.select(fds, [], [], wait)
            except InterruptedError:
                continue
            if not ready and not self.chores_done and not self.pending:
                self.chores_done = True
                self.refresh_hook_file()
            look = not ready or time.monotonic() - last_check >= PARENT_CHECK_EVERY  # without a pidfd
            if look:
                last_check = time.monotonic()
            if self.shell_gone(ready, look):
                return
            if watch is None or watch in ready:
                if watch is not None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(watch, 65536):
                            pass
                self.read_spool()
            if self.client is not None and self.client.fileno() in ready:
                self.read_daemon()


def cmd_fish_helper(args: argparse.Namespace) -> int:
    """`calmd shell-helper --spool DIR`: fish's helper. SIGHUP ends it too (with its folder): fish
    does not send it to the helper, which it disowned, so whoever does means it."""
    folder = Path(args.spool)
    make = lambda session, sock, **options: SpoolHelper(session, sock, folder, **options)  # noqa: E731
    return serve_shell(args, make, (signal.SIGTERM, signal.SIGHUP))
