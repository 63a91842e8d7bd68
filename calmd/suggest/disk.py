"""What the daemon reads from the disk for a keystroke: directory listings and PATH commands for the
COMP frame (calmd/suggest/frames.py), and whether a candidate's `cd` target or file exists.

The daemon runs as the user, so it can list the shell's cwd; the shells never run a completion
system themselves. A keystroke must not wait on a slow or remote file system, so:
- directories on network file systems (nfs, cifs, sshfs, ... by /proc/self/mountinfo) are never
  listed nor checked: no COMP from them, and no candidate is judged by them;
- a listing is made on one background thread; the keystroke waits for it at most `budget`
  seconds (then no COMP, and the listing serves a later keystroke when it is done);
- listings are kept (at most `max_dirs`, each at most `max_entries` names) and trusted for `ttl`
  seconds, then checked again in the background (the keystroke uses the old one meanwhile);
  a recorded command drops them all (`mkdir build` must show up at the next keystroke).
Only names matching the typed word leave this module (frames.completions keeps at most
COMP_ITEMS of them); no listing is logged or stored.
"""

from __future__ import annotations

import bisect
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from calmd.suggest.frames import Lister

log = logging.getLogger("calmd.suggest.disk")
T = TypeVar("T")

NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "ceph", "glusterfs", "lustre", "gpfs", "9p",
    "fuse.sshfs", "sshfs", "fuse.rclone", "fuse.s3fs", "davfs", "fuse.davfs2", "fuse.gcsfuse", "fuse.juicefs",
})  # fmt: skip
BUDGET = 0.002  # seconds a keystroke waits for a listing it does not have
TTL = 2.0  # seconds a listing is used before it is checked again (in the background)
MAX_DIRS = 64
MAX_ENTRIES = 50_000  # names kept of one directory: a bigger one is listed in part
MAX_PATH_DIRS = 64  # PATH entries read
MOUNTS_TTL = 30.0
YIELD_EVERY = 256  # entries listed between two releases of the GIL
MAX_PENDING = 16  # listings queued at once (clients can name any number of folders)


@dataclass(frozen=True)
class Listing:
    entries: tuple[str, ...]  # sorted, directories with a trailing "/"
    mtime_ns: int
    checked: float  # time.monotonic() of the last check


def _list(directory: str, max_entries: int) -> Listing | None:
    try:
        mtime = os.stat(directory).st_mtime_ns
        names: list[str] = []
        with os.scandir(directory) as it:
            for entry in it:
                try:
                    is_dir = entry.is_dir()  # d_type: no stat for most file systems
                except OSError:
                    is_dir = False
                names.append(entry.name + "/" if is_dir else entry.name)
                if len(names) >= max_entries:
                    break
                if not len(names) % YIELD_EVERY:
                    # Let the keystroke that waits for this listing give up on time: without a
                    # pause it waits for the GIL's 5 ms switch interval (measured: 5.8 ms, not 2).
                    time.sleep(0)
    except OSError:
        return None
    names.sort()
    return Listing(tuple(names), mtime, time.monotonic())


def _revalidate(directory: str, old: Listing, max_entries: int) -> Listing | None:
    try:
        if os.stat(directory).st_mtime_ns == old.mtime_ns:
            return Listing(old.entries, old.mtime_ns, time.monotonic())
    except OSError:
        return None
    return _list(directory, max_entries)


def _read_mounts() -> list[tuple[str, str]]:
    """(mount point, file system type), longest mount point first."""
    mounts: list[tuple[str, str]] = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, after = left.split(), right.split()
                if len(fields) >= 5 and after:
                    point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
                    mounts.append((point, after[0]))
    except OSError:
        return []
    mounts.sort(key=lambda m: len(m[0]), reverse=True)
    return mounts


class _Worker:
    """One daemon thread that runs what is submitted, in order. Not a ThreadPoolExecutor: its
    threads are joined at exit, and a listing stuck on a dying disk must not keep calmd alive."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="calmd-disk", daemon=True)
                self._thread.start()
        self._queue.put((fn, args, future))
        return future

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits; the worker goes on
                future.set_exception(exc)


class Disk:
    """Listings and PATH commands, bounded in time and memory (module docstring). Thread-safe."""

    def __init__(
        self, *, budget: float = BUDGET, ttl: float = TTL, max_dirs: int = MAX_DIRS,
        max_entries: int = MAX_ENTRIES,
    ) -> None:  # fmt: skip
        self.budget = budget
        self.ttl = ttl
        self.max_dirs = max_dirs
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._listings: OrderedDict[str, Listing] = OrderedDict()
        self._unlistable: OrderedDict[str, float] = OrderedDict()  # directory -> when it failed
        self._pending: dict[str, Future[Listing | None]] = {}
        self._pool = _Worker()
        self._mounts: list[tuple[str, str]] = []
        self._mounts_read = -MOUNTS_TTL
        self._commands: dict[str, tuple[str, ...]] = {}
        self.timeouts = 0  # keystrokes that went without a listing (status)

    def close(self) -> None:
        self._pool.stop()

    def describe(self) -> dict[str, int]:
        """For `status`: folders listed and remembered, and keystrokes that went without COMP
        because a listing was not ready within the budget (or the queue was full)."""
        with self._lock:
            return {"folders_listed": len(self._listings), "folders_unlistable": len(self._unlistable),
                    "listings_queued": len(self._pending), "comp_timeouts": self.timeouts}  # fmt: skip

    # -- network mounts ------------------------------------------------------------------------------

    def remote(self, path: str) -> bool:
        """Whether `path` lies on a network file system (never listed nor checked)."""
        now = time.monotonic()
        if now - self._mounts_read > MOUNTS_TTL:
            self._mounts, self._mounts_read = _read_mounts(), now
        for point, fstype in self._mounts:
            if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
                return fstype in NETWORK_FS or fstype.startswith("fuse.sshfs")
        return False

    # -- listings ----------------------------------------------------------------------------------

    def invalidate(self) -> None:
        """Forget every listing (a command ran: it may have made or removed files)."""
        with self._lock:
            self._listings.clear()
            self._unlistable.clear()

    def listing(self, directory: str) -> tuple[str, ...] | None:
        """The sorted entries of the absolute `directory`, or None when it is remote, cannot be
        listed, or not within the budget."""
        if not directory.startswith("/") or "\x00" in directory:
            return None
        directory = os.path.normpath(directory)
        now = time.monotonic()
        with self._lock:
            known = self._listings.get(directory)
            if known is not None:
                self._listings.move_to_end(directory)
                if (
                    now - known.checked > self.ttl
                    and directory not in self._pending
                    and len(self._pending) < MAX_PENDING
                ):
                    self._submit(directory, known)
                return known.entries
            failed = self._unlistable.get(directory)
            if failed is not None and now - failed < self.ttl:
                return None  # (a cwd that does not exist must not cost a thread hop per keystroke)
            future = self._pending.get(directory)
        if self.remote(directory):
            self._failed(directory, now)
            return None
        if future is None:
            with self._lock:
                future = self._pending.get(directory)
                if future is None:
                    if len(self._pending) >= MAX_PENDING:
                        self.timeouts += 1  # a slow disk holds the queue: no new listing waits in it
                        return None
                    future = self._submit(directory, None)
        try:
            found = future.result(timeout=self.budget)
        except FutureTimeout:
            self.timeouts += 1
            return None
        return found.entries if found is not None else None

    def _failed(self, directory: str, when: float) -> None:
        """Remember for the ttl that `directory` cannot be listed (missing, unreadable, remote)."""
        with self._lock:
            self._unlistable[directory] = when
            self._unlistable.move_to_end(directory)
            while len(self._unlistable) > self.max_dirs:
                self._unlistable.popitem(last=False)

    def _submit(self, directory: str, old: Listing | None) -> Future[Listing | None]:
        """Under the lock: list (or check) `directory` on the background thread."""
        future = self._pool.submit(self._work, directory, old)
        self._pending[directory] = future
        return future

    def _work(self, directory: str, old: Listing | None) -> Listing | None:
        found = (
            _list(directory, self.max_entries)
            if old is None
            else _revalidate(directory, old, self.max_entries)
        )
        if found is None:
            self._failed(directory, time.monotonic())
        with self._lock:
            self._pending.pop(directory, None)
            if found is None:
                self._listings.pop(directory, None)
            else:
                self._listings[directory] = found
                self._listings.move_to_end(directory)
                while len(self._listings) > self.max_dirs:
                    self._listings.popitem(last=False)
        return found

    def lister(self, cwd: str) -> Lister:
        """A `calmd.suggest.frames.Lister` for directories relative to `cwd`."""

        def listing(relative: str) -> tuple[str, ...] | None:
            return self.listing(os.path.join(cwd, relative) if relative else cwd)

        return listing

    def exists(self, cwd: str, path: str) -> bool | None:
        """Whether `path` (relative to the absolute `cwd`, or absolute) exists, as a directory when
        it ends in `/`; None when that cannot be known in time (remote, unlistable, budget)."""
        full = os.path.normpath(os.path.join(cwd, path))
        parent, name = os.path.split(full)
        if not name:
            return True  # "/"
        entries = self.listing(parent)
        if entries is None:
            return None
        want_dir = path.endswith("/")
        i = bisect.bisect_left(entries, name)
        for candidate in entries[i : i + 2]:
            if candidate == name + "/" or (candidate == name and not want_dir):
                return True
        return False

    # -- PATH -----------------------------------------------------------------------------------------

    def commands(self, path_var: str) -> tuple[str, ...]:
        """The executable names on a PATH, sorted; read once per PATH value (the helper sends the
        shell's PATH once) on the background thread: empty until that is done."""
        with self._lock:
            found = self._commands.get(path_var)
            if found is None:
                self._commands[path_var] = ()
                self._pool.submit(self._read_path, path_var)
        return found or ()

    def _read_path(self, path_var: str) -> tuple[str, ...]:
        """Executables of each PATH directory (network mounts skipped)."""
        names: set[str] = set()
        for directory in path_var.split(":")[:MAX_PATH_DIRS]:
            if not directory.startswith("/") or self.remote(directory):
                continue
            try:
                with os.scandir(directory) as it:
                    for entry in it:
                        if len(names) >= self.max_entries:
                            break
                        try:
                            if entry.is_file() and os.access(entry.path, os.X_OK):
                                names.add(entry.name)
                        except OSError:
                            continue
            except OSError:
                continue
        found = tuple(sorted(names))
        with self._lock:
            if len(self._commands) > 16:  # a few PATH values are in use at once, not more
                self._commands.clear()
            self._commands[path_var] = found
        return found


# --------------------------------------------------------------------------- the disk check

DIR_ARGUMENT = frozenset({"cd", "pushd"})
FILE_ARGUMENTS = frozenset({
    "vim", "vi", "nvim", "nano", "emacs", "less", "more", "cat", "bat", "head", "tail", "source", ".", "wc",
})  # fmt: skip
SCRIPT_ARGUMENT = frozenset({"python", "python3", "bash", "sh", "zsh", "node", "perl", "ruby"})
MAX_CHECKS = 4  # paths checked per candidate
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
_UNCHECKABLE = set("$`*?[]{}~'\"\\<>=()")


def missing_argument(cmd: str, cwd: str, disk: Disk) -> str | None:
    """The first `cd` target or file argument of `cmd` that does not exist relative to `cwd`
    (calmd/suggest/engine.py drops such a line), or None: all there, or unknown in time. Only
    the first simple command is judged (what `cd x && make` does after `cd` is not known)."""
    return check_arguments(cmd, cwd, disk)[0]


def check_arguments(cmd: str, cwd: str, disk: Disk) -> tuple[str | None, bool]:
    """(`missing_argument`, whether every path it judged was known in time): an unknown answer
    may be asked again later in the same keystroke, when the listing has come."""
    if not cwd.startswith("/"):
        return None, True
    words: list[str] = []
    for word in cmd.split():
        if word in _SEPARATORS:
            break
        words.append(word)
    if not words:
        return None, True
    head, args = words[0], words[1:]
    if head in DIR_ARGUMENT:
        paths = [a if a.endswith("/") else a + "/" for a in args[:1] if a not in ("-", "..", ".")]
    elif head in FILE_ARGUMENTS:
        paths = [a for a in args if not a.startswith(("-", "+"))]
    elif head in SCRIPT_ARGUMENT and args and not args[0].startswith("-"):
        paths = args[:1]  # `python -m x`, `bash -c '...'` name no file
    else:
        return None, True
    known = True
    for path in paths[:MAX_CHECKS]:
        if path == "~" or path.startswith("~/"):  # the daemon runs as the user: the same home
            home = os.path.expanduser("~")
            path = home + path[1:] if home != "~" else path
        if _UNCHECKABLE.intersection(path) or path.startswith("-"):
            continue
        there = disk.exists(cwd, path)
        if there is False:
            return path, True
        known = known and there is not None
    return None, known
