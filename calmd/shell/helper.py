"""The per-shell helper (`calmd shell-helper`): one per shell, between its hook and the daemon.

The hooks in client/ never start a Python process per keystroke. Each shell starts one helper
when the hook loads, talks to it over two pipes (bash, zsh; fish: files and a FIFO,
calmd/shell/spool.py) with one line per message (calmd/shell/lines.py), and the helper holds one
CalmClient connection to the daemon, reconnecting whenever the daemon comes back. The helper is
silent: its errors go to a log file. It goes when its shell does, however it was started
(calmd/shell/lifetime.py): at the end of its stdin, when the shell's process ends (the pid the
hook gives with --shell-pid, else its parent's, read first thing), on SIGTERM and SIGHUP.

The hooks' own files (`calmd init`, the hook file, `calm enable|disable`): calmd/shell/hooks.py.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calmd import paths
from calmd.protocol import MAX_PATH_BYTES
from calmd.shell.hooks import (
    disabled_flag,
    hook_file,
    init_script,
    log_path,
    python_command,
    write_hook_file,
)
from calmd.shell.lifetime import ShellWatch
from calmd.shell.lines import Complete, Env, Record, escape, parse_request

if TYPE_CHECKING:
    from calmd.shell.client import CalmClient

LOG_MAX_BYTES = 1 << 20
BACKLOG = 256  # records kept while the daemon is away
PARENT_CHECK_EVERY = 5.0  # seconds between checks that the shell still runs (without a pidfd)
IDLE_AFTER = 0.5  # seconds without work before the helper does its chores (the hook file)
MAX_KEYS = 64  # first-key lines kept per answer

log = logging.getLogger("calmd.shell.helper")


@dataclass
class Active:
    """The complete request in flight: its line seq, its request id, the candidates so far."""

    seq: str
    rid: int
    input: str = ""
    threshold: float = 0.0  # for a daemon that sends no `ghost`
    candidates: list[str] = field(default_factory=list)
    confident: list[bool] = field(default_factory=list)
    shown: str = ""  # the candidate already sent on its own (final=0), early or the model's best
    keys: list[str] = field(default_factory=list)  # the empty prompt's lines for a first key (`key`)

    def is_drawn(self, message: dict[str, Any]) -> bool:
        """Whether the daemon draws this early line or candidate (`ghost`); from an older daemon
        that does not say, its confidence at or above the threshold, or no confidence at all."""
        ghost = message.get("ghost")
        if isinstance(ghost, bool):
            return ghost
        confidence = message.get("confidence")
        if isinstance(confidence, bool) or not isinstance(confidence, int | float):
            return True
        return float(confidence) >= self.threshold


class Helper:
    """One per shell: stdin/stdout lines on one side, one daemon connection on the other."""

    def __init__(
        self,
        session: str,
        socket_path: Path,
        *,
        stdin: int = 0,
        stdout: int = 1,
        autostart: bool = False,
        line_format: int = 1,
        shell: str | None = None,
        socket_arg: str | None = None,
        watch: ShellWatch | None = None,
    ) -> None:
        from calmd.protocol import DEFAULT_MIN_CONFIDENCE

        self.default_threshold = DEFAULT_MIN_CONFIDENCE
        self.watch = watch  # the shell: the helper goes when it does
        self.line_format = line_format
        self.shell = shell  # the hook file to keep current, and the --socket it was made with
        self.socket_arg = socket_arg
        self.chores_done = False
        self.session = session
        self.socket_path = socket_path
        self.stdin = stdin
        self.stdout = stdout
        self.autostart = autostart
        self.autostarted = False
        self.client: CalmClient | None = None
        self.connected_once = False
        self.inbuf = b""
        self.backlog: deque[Record] = deque(maxlen=BACKLOG)
        self.pending_records: set[int] = set()
        self.queued: Complete | None = None
        self.active: Active | None = None
        self.flag = disabled_flag()
        self.out: list[tuple[str, bool, str]] = []  # (seq, final, line) waiting for flush()
        self.env = ""  # the environment's short form, from the last `e` line
        self.path = os.environ.get("PATH", "")  # the shell's, as it started this helper
        self.path_sent = False  # on this connection
        self.drawn = ""  # the line the shell was last told to draw: the next request's incumbent
        # zsh draws a multi-line entry as lines (ghost text, then the buffer): it may be offered
        # one. bash inserts it whole into the line, where a newline is a second command: never.
        self.multiline = shell == "zsh"
        from calmd.suggest.filters import sendable

        self.sendable = sendable

    # -- shell side ------------------------------------------------------------------------------

    def emit(
        self, seq: str, final: bool, candidates: list[str], confident: list[bool] | None = None,
        keys: list[str] | None = None,
    ) -> None:  # fmt: skip
        """A line for the shell; `keys` (format 3): lines drawn at once when their first character
        alone is typed, after the candidates, flagged 2 (calmd/shell/lines.py)."""
        head = [seq, "1" if final else "0"]
        extra = keys if keys and self.line_format >= 3 else []
        if self.line_format >= 2:
            flags = confident if confident is not None else [True] * len(candidates)
            head.append("".join("1" if f else "0" for f in flags) + "2" * len(extra))
        lines = [*candidates, *extra]
        self.out.append((seq, final, "\t".join([*head, *(escape(c) for c in lines)]) + "\n"))

    def flush(self) -> None:
        """Write what `emit` queued, in one write. An early or first answer that came in the same
        batch as the final one for its request is left out: each line the shell reads costs it a
        wake-up and a parse, and the final line says it all."""
        if not self.out:
            return
        finals = {seq for seq, final, _ in self.out if final}
        data = "".join(line for seq, final, line in self.out if final or seq not in finals).encode()
        self.out.clear()
        while data:
            written = os.write(self.stdout, data)
            data = data[written:]

    def read_stdin(self) -> bool:
        """Take in what the shell wrote; False at end of file (the shell is gone)."""
        chunk = os.read(self.stdin, 65536)
        if not chunk:
            return False
        self.inbuf += chunk
        *lines, self.inbuf = self.inbuf.split(b"\n")
        for raw in lines:
            self.take(raw)
        return True

    def take(self, raw: bytes, written: float | None = None) -> None:
        """One line from the shell (`written`: when, if known: calmd/shell/lines.py)."""
        request = parse_request(raw.decode("utf-8", "replace"), written)
        log.debug("shell: %r", request)
        if isinstance(request, Record):
            request.env = self.env
            self.backlog.append(request)
        elif isinstance(request, Env):
            self.env = request.short()
        elif isinstance(request, Complete):
            self.queued = request  # one still queued is superseded: the shell waits for the newest

    # -- daemon side -----------------------------------------------------------------------------

    def connect(self) -> bool:
        """Connect when not connected (a failed attempt costs microseconds: no throttling)."""
        if self.client is not None:
            return True
        from calmd.shell.client import CalmClient

        try:
            self.client = CalmClient(self.socket_path, timeout=2.0)
        except OSError as exc:
            if self.connected_once:
                log.info("daemon away (%s)", exc)
                self.connected_once = False
            self.maybe_autostart()
            return False
        log.info("connected to %s", self.socket_path)
        self.connected_once = True
        self.path_sent = False
        return True

    def maybe_autostart(self) -> None:
        if not self.autostart or self.autostarted:
            return
        self.autostarted = True
        calmd = Path(sys.executable).parent / "calmd"
        argv = [str(calmd)] if calmd.exists() else [*python_command(), "-m", "calmd.cli"]
        with open(log_path(), "ab") as out:
            subprocess.Popen(
                [*argv, "serve"], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        log.info("started the daemon in the background")

    def drop(self, exc: BaseException) -> None:
        """The connection broke: answer the shell's pending request with nothing, retry later."""
        log.info("connection lost: %s", exc)
        if self.client is not None:
            self.client.close()
        self.client = None
        self.pending_records.clear()
        self.connected_once = False
        if self.active is not None:
            self.emit(self.active.seq, True, [])
            self.active = None

    def send_work(self) -> None:
        """Records first (in order), then the newest complete once the records are stored, so that
        the prediction after a command already sees it. A newer complete makes the daemon cancel
        the older one (same session); replies to it are then dropped by `on_message`."""
        if self.queued is not None and self.flag.exists():
            self.emit(self.queued.seq, True, [])
            self.queued = None
        if not self.backlog and self.queued is None:
            return
        if not self.connect():
            if self.queued is not None:
                self.emit(self.queued.seq, True, [])
                self.queued = None
            return
        assert self.client is not None
        try:
            while self.backlog:
                record = self.backlog[0]
                self.pending_records.add(
                    self.client.send("record", cmd=record.cmd, **record.fields(self.session))
                )
                self.backlog.popleft()
            if self.queued is not None and not self.pending_records:
                q, self.queued = self.queued, None
                ctx = {
                    "input": q.input,
                    **({"cwd": q.cwd} if q.cwd else {}),
                    **({"git": q.git} if q.git else {}),
                    **({"env": self.env} if self.env else {}),
                }
                extra: dict[str, Any] = {"early": True} if self.line_format >= 2 else {}
                if q.min_confidence is not None:
                    extra["min_confidence"] = q.min_confidence
                if self.line_format >= 3 and not q.input:
                    extra["keys"] = True  # the empty prompt: its first keys, to draw in the shell at once
                if len(self.drawn) > len(q.input) and self.drawn.startswith(q.input):
                    extra["drawn"] = self.drawn  # the user typed along it: it stays unless beaten
                if self.multiline:
                    extra["multiline"] = True
                if not self.path_sent and self.path:
                    extra["path"] = self.path[:MAX_PATH_BYTES]
                    self.path_sent = True
                rid = self.client.send("complete", n=q.n, session=self.session, ctx=ctx, **extra)
                log.debug("sent complete %s as %d", q.seq, rid)
                threshold = self.default_threshold if q.min_confidence is None else q.min_confidence
                self.active = Active(q.seq, rid, q.input, threshold)
        except OSError as exc:
            self.drop(exc)

    def on_message(self, message: dict[str, Any]) -> None:
        rid = message.get("id")
        log.debug("daemon: %r", message)
        if rid in self.pending_records:
            if "error" in message:
                log.warning("record failed: %s", message["error"])
            self.pending_records.discard(rid)
            return
        active = self.active
        if active is None or rid != active.rid:
            return  # a cancelled or superseded request
        if "early" in message:
            # The history's best line, before the model runs: the ghost text at once, if sure enough.
            text = message["early"]
            if (
                self.line_format >= 2
                and isinstance(text, str)
                and self.sendable(text, multiline=self.multiline)
                and len(text) > len(active.input)
                and text.startswith(active.input)
                and not active.candidates
                and active.is_drawn(message)
            ):
                active.shown = self.drawn = text
                self.emit(active.seq, False, [text])
            return
        if "key" in message:
            # The line the shell draws at once when this first character alone is typed.
            key, text = message.get("key"), message.get("line")
            if (
                not active.input
                and isinstance(key, str)
                and len(key) == 1
                and isinstance(text, str)
                and len(text) > 1
                and text.startswith(key)
                and self.sendable(text, multiline=self.multiline)
                and len(active.keys) < MAX_KEYS
            ):
                active.keys.append(text)
            return
        if "candidate" in message:
            candidate = str(message["candidate"])
            # an older daemon sent control characters too: none reaches the shell
            if not self.sendable(candidate, multiline=self.multiline):
                return
            if candidate and candidate not in active.candidates:
                confident = active.is_drawn(message)
                # Only the line's likely head is drawn (`draw`, calmd/suggest/ghost.py): the head
                # is the entry drawn, the whole line stays for cycling.
                draw = message.get("draw")
                if (
                    confident
                    and isinstance(draw, str)
                    and len(active.input) < len(draw) < len(candidate)
                    and candidate.startswith(draw)
                    and draw.startswith(active.input)
                    and draw not in active.candidates
                ):
                    active.candidates += [draw, candidate]
                    active.confident += [True, False]
                    candidate = draw
                else:
                    active.candidates.append(candidate)
                    active.confident.append(confident)
                # The model's best, at once, when it changes what is shown: not when it is the
                # early answer again, and not to take a shown one away (the final list says so).
                if active.candidates[0] == candidate and (
                    self.line_format < 2 or (confident and candidate != active.shown)
                ):
                    active.shown = candidate
                    self.drawn = candidate if confident else self.drawn
                    self.emit(active.seq, False, [candidate], [confident])
            return
        if "error" in message:
            log.warning("complete failed: %s", message["error"])
        self.drawn = next((c for c, f in zip(active.candidates, active.confident, strict=True) if f), "")
        self.emit(active.seq, True, active.candidates, active.confident, active.keys)
        self.active = None

    def read_daemon(self) -> None:
        """Every message the daemon has sent so far (the socket is non-blocking meanwhile)."""
        client = self.client
        assert client is not None
        try:
            messages = client.read_available()
        except (OSError, ValueError, RuntimeError) as exc:  # ConnectionError, ProtocolMismatch, msgpack
            self.drop(exc)
            return
        for message in messages:
            self.on_message(message)

    def refresh_hook_file(self) -> None:
        """An upgraded calmd rewrites the hook file the setup line sources (only one that exists:
        `calmd init` makes it), so the next shell loads the new hook without running Python. A
        shell that still runs the old hook goes on with it: this helper speaks its lines too."""
        if self.shell is None or self.socket_arg is not None or not hook_file(self.shell).exists():
            return  # (a hook for another socket never came from the file)
        if write_hook_file(self.shell, init_script(self.shell)):
            log.info("rewrote %s for calmd as installed now", hook_file(self.shell))

    def shell_gone(self, ready: list[int], look: bool) -> bool:
        """Whether the shell ended: its pidfd is in `ready`, or (without one; `look`: it is time to
        look, every PARENT_CHECK_EVERY at most) it no longer runs."""
        watch = self.watch
        if watch is None:
            return False
        fd = watch.fileno()
        return fd in ready if fd is not None else look and watch.gone()

    def watched(self) -> list[int]:
        """The descriptors the loop waits on besides its own: the shell's pidfd, when there is one."""
        fd = None if self.watch is None else self.watch.fileno()
        return [] if fd is None else [fd]

    def run(self) -> int:
        if self.watch is not None and self.watch.gone():
            return 0  # the shell ended before the helper ran
        while True:
            self.send_work()
            self.flush()
            fds = [self.stdin, *self.watched()]
            if self.client is not None:
                fds.append(self.client.fileno())
            try:
                # Chores wait until the first answers are out and nothing came for a moment.
                wait = PARENT_CHECK_EVERY if self.chores_done else IDLE_AFTER
                ready, _, _ = select.select(fds, [], [], wait)
            except InterruptedError:
                continue
            if not ready and not self.chores_done:
                self.chores_done = True
                self.refresh_hook_file()
                continue
            if self.shell_gone(ready, look=not ready):
                return 0  # the shell is gone; a process it started may still hold our stdin open
            if self.stdin in ready and not self.read_stdin():
                return 0
            if self.client is not None and self.client.fileno() in ready:
                self.read_daemon()


def _setup_log() -> None:
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_MAX_BYTES:
            path.replace(path.with_name(paths.HELPER_LOG + ".old"))
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s [{os.getpid()}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if os.environ.get("CALM_DEBUG") else logging.INFO)
    log.propagate = False


def reopen_stdin_read_only() -> None:
    """The hooks give us as stdin a pipe they hold open read-write (so that neither side waits for
    the other), read-write too. Reopened read-only, it shows the shell's end as end of file (Linux:
    through /proc; elsewhere the parent check notices within PARENT_CHECK_EVERY)."""
    try:
        st = os.fstat(0)
        if not stat.S_ISFIFO(st.st_mode) or fcntl.fcntl(0, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            return
        fd = os.open("/proc/self/fd/0", os.O_RDONLY | os.O_NONBLOCK)
        if os.fstat(fd).st_ino == st.st_ino:
            os.set_blocking(fd, True)
            os.dup2(fd, 0)
        os.close(fd)
    except OSError as exc:
        log.info("stdin stays read-write: %s", exc)


def cmd_shell_helper(args: argparse.Namespace) -> int:
    """The helper of a bash or zsh shell (pipes); fish's is calmd/shell/spool.py's."""
    return serve_shell(args, Helper)


HelperFactory = Callable[..., Helper]  # (session, socket path, **options) -> the helper to run


class Stopped(BaseException):
    """A signal that ends the helper (SIGTERM; fish's also SIGHUP): raised where the loop is, so
    that it leaves through its cleanup (the spool folder), never by the default action."""


def stop_on(*signals: signal.Signals) -> None:
    """End the helper cleanly on these signals: each raises Stopped once, then they are ignored
    (a second one must not break into the cleanup)."""

    def stop(signum: int, frame: object) -> None:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in signals:
        signal.signal(sig, stop)


def serve_shell(
    args: argparse.Namespace, make: HelperFactory, stops: tuple[signal.Signals, ...] = (signal.SIGTERM,)
) -> int:
    """Run the helper `make` builds, as the hooks start it (`calmd shell-helper`), for as long as
    its shell runs (`--shell-pid`, else the parent it had when it started: calmd/shell/lifetime.py)
    and until one of `stops` comes (bash's and zsh's hooks start it with SIGHUP ignored: the
    terminal's hangup is not the shell's end)."""
    # Keys typed at the prompt must not reach the helper: it shares the shell's process group.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)
    stop_on(*stops)
    try:
        watch = ShellWatch(getattr(args, "shell_pid", None))
        _setup_log()
        reopen_stdin_read_only()
        socket_arg = getattr(args, "socket", None)
        socket = Path(socket_arg) if socket_arg else paths.socket_path()
        session = args.session or f"shell-{watch.pid}-{int(time.time())}"
        helper = make(session, socket, autostart=args.autostart, line_format=args.format, shell=args.shell,
                      socket_arg=socket_arg, watch=watch)  # fmt: skip
        return helper.run()
    except (BrokenPipeError, KeyboardInterrupt, Stopped):
        return 0
    except Exception:
        log.exception("shell helper crashed")
        return 1


if __name__ == "__main__":  # `python -m calmd.shell.helper ...`: hooks written by earlier calmd
    import runpy

    runpy.run_module("calmd", run_name="__main__", alter_sys=True)  # the `calmd` command line
