"""How a shell helper knows that its shell is gone, however it was started (issue 39).

The helper used to compare os.getppid() with the parent it read when its loop started: started
as `sh -c 'calmd shell-helper ... & :'`, the parent was gone before Python ran, the first read
was already init's pid, and the helper never saw it change (it ran on, parent 1, for as long as
the machine did). Now:

- the shell is the pid the hook gives (`--shell-pid`: fish's `$fish_pid`), else the parent read
  first thing in the process (ShellWatch.at_start, before argparse and the imports);
- a shell that is gone already is gone at once: init's pid (1) as the parent when init is no
  shell, a pid that is not running, or one that started after this process (a pid reused);
- it is watched with a pidfd (Linux 5.3: readable the moment the process ends, never mistaken
  for a process that took its pid later), else by looking every PARENT_CHECK_EVERY seconds
  whether that pid still runs and still started when it did.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHELL_NAMES = frozenset({"bash", "zsh", "fish", "sh", "dash", "ksh", "mksh", "tcsh", "csh"})
_parent_at_start = os.getppid()  # first thing: the module is imported before the CLI parses anything


def started_at(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc), or None when it is not there
    (or there is no /proc)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().lstrip("-")
    except OSError:
        return ""


class ShellWatch:
    """The shell a helper serves, watched until it is gone."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = _parent_at_start if pid is None else pid
        self.fd: int | None = None
        self.started = started_at(self.pid)
        self.gone_at_start = self._gone_already(given=pid is not None)
        if not self.gone_at_start:
            with contextlib.suppress(OSError, AttributeError):  # no pidfd: looked at instead
                self.fd = os.pidfd_open(self.pid)

    def _gone_already(self, *, given: bool) -> bool:
        if self.pid <= 0:
            return True
        if self.pid == 1 and not given and _comm(1) not in SHELL_NAMES:
            return True  # orphaned before it ran: init adopted it (a shell as init is a real parent)
        if not _running(self.pid):
            return True
        me = started_at(os.getpid())
        return self.started is not None and me is not None and self.started > me  # a pid taken again

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when the shell ends (None: `gone()` must be asked)."""
        return self.fd

    def gone(self) -> bool:
        if self.gone_at_start:
            return True
        if self.fd is not None:
            import select

            return bool(select.select([self.fd], [], [], 0)[0])
        return not _running(self.pid) or (self.started is not None and started_at(self.pid) != self.started)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: the shell exited and was not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process holds the pid: running, and not the shell (started_at tells)
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")
