"""`calm search`: the history search's terminal UI, which Ctrl-R opens in zsh, bash and fish.

    python -m calmd.shell.search_ui [--session ID] [--cwd DIR] [--mode MODE] [--] [QUERY...]

The shell waits for it, so it starts lean: the standard library, msgpack and the socket client,
nothing else (no numpy, no rich; about what `python -c pass` costs plus 20 ms). It asks the
daemon's `search` op (docs/protocol.md) at every keystroke and draws the answer; the daemon does
the matching and the ranking (calmd/suggest/search.py). Drawn by hand with ANSI escapes on the
alternate screen, as McFly and atuin draw theirs (no TUI library: none of the maintained ones
starts in the few milliseconds a Ctrl-R may take, see docs/shells.md), so the shell's screen
comes back exactly as it was.

It never blocks the shell: with no daemon listening, or one that does not answer the first
search within FIRST_ANSWER_S, it exits at once with UNAVAILABLE, before it touches the terminal,
and the hook opens the shell's own search instead; the reason is one line on stderr (the hooks
send it to /dev/null; typed at a prompt, it says why). Once drawn, it never waits for the daemon:
keys are read while answers are awaited, only the answer to the newest query is drawn, and a
daemon that goes away is said on the status line (Esc still leaves).

Keys: typing edits the query (Backspace, Ctrl-W, Ctrl-U, Left/Right, Home/End); Up/Down
(Ctrl-P/Ctrl-N), PageUp/PageDown move; Enter runs the line, Tab puts it on the prompt to edit, Esc
(Ctrl-G, Ctrl-C) gives the prompt back as it was; Ctrl-R switches the filter mode (global, this
machine, this folder, this session, successful only); Ctrl-D deletes every run of the line from the history,
for good, after a y/n (the `forget` op: HistoryStore.forget_command, `calm forget`'s path).

Output, for the hook: `run` or `edit`, a newline and the command on stdout, exit 0; nothing and
exit CANCELLED after Esc; nothing and exit UNAVAILABLE when the shell's own search should open.
Nothing secret is drawn: the daemon never sends a line its credential detector flags, and the
query itself is neither stored nor logged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from calmd.arguments import Parser, run_tool
from calmd.errors import CalmError, one_line
from calmd.protocol import MAX_QUERY_BYTES, MAX_SEARCH_RESULTS, SEARCH_MODES, wire_text
from calmd.shell.search_screen import Screen, clip
from calmd.visible import visible

CHOSEN, CANCELLED, UNAVAILABLE = 0, 1, 3
FIRST_ANSWER_S = 1.0  # the daemon's first answer, at most; else the shell's own search opens
CONNECT_TIMEOUT_S = 0.5
ESC_WAIT_S = 0.03  # a lone Esc byte is the Esc key unless more of a sequence follows this soon

# Escape sequences of the keys the UI knows (xterm and its imitators, both cursor-key modes).
SEQUENCES = {
    "\x1b[A": "up", "\x1bOA": "up", "\x1b[B": "down", "\x1bOB": "down",
    "\x1b[C": "right", "\x1bOC": "right", "\x1b[D": "left", "\x1bOD": "left",
    "\x1b[H": "home", "\x1bOH": "home", "\x1b[1~": "home", "\x1b[7~": "home",
    "\x1b[F": "end", "\x1bOF": "end", "\x1b[4~": "end", "\x1b[8~": "end",
    "\x1b[5~": "pageup", "\x1b[6~": "pagedown", "\x1b[3~": "delete-char",
}  # fmt: skip
CONTROL = {
    "\r": "run", "\n": "run", "\t": "edit", "\x1b": "cancel", "\x07": "cancel", "\x03": "cancel",
    "\x7f": "backspace", "\x08": "backspace", "\x17": "kill-word", "\x15": "kill-line",
    "\x01": "home", "\x05": "end", "\x02": "left", "\x06": "right", "\x10": "up", "\x0e": "down",
    "\x12": "mode", "\x04": "forget",
}  # fmt: skip


# --------------------------------------------------------------------------- state


@dataclass
class State:
    """What the UI shows: the query being edited, the mode, the answer, the selection."""

    query: str
    mode: str = "global"
    cursor: int = -1  # in the query; -1: at its end
    results: list[dict[str, Any]] = field(default_factory=list)
    matches: int = 0
    selected: int = 0
    top: int = 0  # the first result drawn (scrolling)
    status: str = ""  # a message on the status line (replaces the keys' help)
    confirm: str = ""  # the line awaiting a y/n to be deleted
    waiting: bool = False  # a search is on its way
    outcome: tuple[int, str] | None = None  # what the UI ends with, decided by a reply (a whole line)

    def __post_init__(self) -> None:
        if self.cursor < 0:
            self.cursor = len(self.query)

    def chosen(self) -> str | None:
        return str(self.results[self.selected]["cmd"]) if 0 <= self.selected < len(self.results) else None

    def chosen_cut(self) -> dict[str, Any] | None:
        """The selected result when the daemon cut its line for the reply (it has `cut` and `row`)."""
        if 0 <= self.selected < len(self.results) and self.results[self.selected].get("cut"):
            return self.results[self.selected]
        return None

    def clear(self, why: str) -> None:
        """No results (a query the daemon cannot take): Enter has nothing to run."""
        self.results, self.matches, self.selected, self.top = [], 0, 0, 0
        self.status = why

    def edit(self, action: str, text: str = "") -> bool:
        """Apply an editing action to the query; True when the query changed."""
        q, c = self.query, self.cursor
        if action == "insert":
            q, c = q[:c] + text + q[c:], c + len(text)
        elif action == "backspace" and c > 0:
            q, c = q[: c - 1] + q[c:], c - 1
        elif action == "delete-char" and c < len(q):
            q = q[:c] + q[c + 1 :]
        elif action == "kill-word":
            start = len(q[:c].rstrip()) - len(q[:c].rstrip().split(" ")[-1]) if q[:c].strip() else 0
            q, c = q[:start] + q[c:], start
        elif action == "kill-line":
            q, c = q[c:], 0
        elif action == "left":
            c = max(0, c - 1)
        elif action == "right":
            c = min(len(q), c + 1)
        elif action == "home":
            c = 0
        elif action == "end":
            c = len(q)
        changed = q != self.query
        self.query, self.cursor = q, c
        return changed

    def move(self, delta: int, rows: int) -> None:
        if not self.results:
            return
        self.selected = max(0, min(len(self.results) - 1, self.selected + delta))
        if self.selected < self.top:
            self.top = self.selected
        elif self.selected >= self.top + rows:
            self.top = self.selected - rows + 1

    def next_mode(self) -> None:
        self.mode = SEARCH_MODES[(SEARCH_MODES.index(self.mode) + 1) % len(SEARCH_MODES)]


def parse_keys(data: str) -> Iterator[tuple[str, str]]:
    """(action, text) for each key in what the terminal sent; text for `insert` only."""
    i = 0
    while i < len(data):
        ch = data[i]
        if ch == "\x1b" and i + 1 < len(data):
            known = next((data[i : i + n] for n in (4, 3) if data[i : i + n] in SEQUENCES), None)
            if known is not None:
                yield SEQUENCES[known], ""
                i += len(known)
            elif data[i + 1] in "[O":  # an unknown sequence (F-keys, modified keys): skipped whole
                j = i + 2
                while j < len(data) and not ("@" <= data[j] <= "~"):
                    j += 1
                i = j + 1
            else:  # Alt-x: skipped, never typed into the query
                i += 2
            continue
        if ch in CONTROL:
            yield CONTROL[ch], ""
        elif ch >= " " and ch != "\x7f":
            yield "insert", ch
        i += 1


# --------------------------------------------------------------------------- the loop


class Search:
    """The conversation with the daemon: one search in flight is enough, only the newest counts."""

    def __init__(self, client: Any, session: str, cwd: str, rows: int) -> None:
        self.client = client
        self.session = session
        self.cwd = cwd
        self.n = max(1, min(MAX_SEARCH_RESULTS, 3 * rows))
        self.newest = -1
        self.forgetting = -1
        self.fetching = -1  # a cut line's whole text, asked for by `row`
        self.fetch_for: tuple[str, dict[str, Any]] = ("", {})  # the key that asked, the cut result
        self.gone = False

    def ask(self, state: State) -> None:
        if self.gone:
            return
        if len(state.query.encode("utf-8", "replace")) > MAX_QUERY_BYTES:
            # what the daemon refuses: the lines of a shorter query would stay, and Enter ran one
            self.newest = -1
            state.waiting = False
            state.clear(f"the query is longer than {MAX_QUERY_BYTES:,} bytes: shorten it")
            return
        try:
            self.newest = self.client.send("search", query=state.query, mode=state.mode, n=self.n,
                                           session=self.session, cwd=self.cwd)  # fmt: skip
            state.waiting = True
        except OSError:
            self.gone = True

    def fetch(self, action: str, result: dict[str, Any], state: State) -> None:
        """Ask for the whole of a line the reply cut: `action` (run, edit, forget) waits for it."""
        try:
            self.fetching = self.client.send("search", row=int(result.get("row") or 0), n=1)
            self.fetch_for = (action, result)
            state.status = f"reading the whole line ({int(result['cut']):,} bytes)…"
        except (OSError, ValueError):
            self.gone = True

    def fetched(self, message: dict[str, Any], state: State) -> None:
        """The whole line, checked against what was cut, goes where its key asked; else it is said."""
        action, cut = self.fetch_for
        self.fetching = -1
        lines = [] if "error" in message else [str(r.get("cmd", "")) for r in message.get("results", [])]
        whole = next((line for line in lines if line.startswith(str(cut["cmd"]))
                      and len(line.encode("utf-8", "replace")) == cut["cut"]), None)  # fmt: skip
        if whole is None:
            state.status = "the whole line could not be read (deleted meanwhile?): nothing run"
        elif action == "forget":
            state.confirm = whole
            state.status = f"delete every run of `{clip(visible(whole), 40)}` from the history for good? y/n"
        else:
            state.outcome = (CHOSEN, f"{action}\n{whole}")

    def forget(self, cmd: str) -> None:
        try:
            self.forgetting = self.client.send("forget", cmd=cmd)
        except OSError:
            self.gone = True

    def take(self, state: State) -> bool:
        """Read what the daemon sent; True when the screen changes."""
        try:
            messages = self.client.read_available()
        except (OSError, ValueError, RuntimeError):
            self.gone = True
            state.status = "calmd went away: Esc gives the prompt back"
            state.waiting = False
            return True
        changed = False
        for message in messages:
            rid = message.get("id")
            if rid == self.fetching:
                self.fetched(message, state)
                changed = True
            elif rid == self.forgetting:
                n = int(message.get("forgotten", 0)) if "error" not in message else 0
                state.status = f"deleted {n} run{'s' * (n != 1)} from the history" if n else "nothing deleted"
                self.ask(state)
                changed = True
            elif rid == self.newest:
                state.waiting = False
                if "error" in message:  # the lines shown answer another query: Enter must not run one
                    state.clear(f"calmd: {visible(str(message['error'].get('message', 'error')))}")
                elif not message.get("superseded"):
                    state.results = list(message.get("results", []))
                    state.matches = int(message.get("matches", 0))
                    # a new query starts at its best line; after a deletion, the next line is selected
                    keep = state.selected if state.status.startswith("deleted") else 0
                    state.selected = min(keep, max(0, len(state.results) - 1))
                    state.top = min(state.top, state.selected) if keep else 0
                changed = True
        return changed


class Unavailable(Exception):
    """Why the search does not open (the hook opens the shell's own instead): one line, exit
    UNAVAILABLE. Before issue 39 each of these was a bare exit 3, read as "no daemon"."""


def first_answer(client: Any, state: State, session: str, cwd: str, n: int) -> None:
    """The first search, answered within FIRST_ANSWER_S, or Unavailable (the shell's own opens)."""
    deadline = time.monotonic() + FIRST_ANSWER_S
    rid = client.send("search", query=state.query, mode=state.mode, n=n, session=session, cwd=cwd)
    while time.monotonic() < deadline:
        ready, _, _ = select.select([client.fileno()], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        for message in client.read_available():
            if message.get("id") == rid:
                if "error" in message:
                    error = message["error"] if isinstance(message["error"], dict) else {}
                    why = visible(str(error.get("message", error)))
                    raise Unavailable(f"calmd refused the search: {why}")
                state.results = list(message.get("results", []))
                state.matches = int(message.get("matches", 0))
                return
    raise Unavailable(f"calmd did not answer the search within {FIRST_ANSWER_S:g} s")


def run(args: argparse.Namespace) -> tuple[int, str]:
    """(exit status, what to print for the hook). CalmError when there is no terminal to draw on;
    Unavailable when the daemon is not there or does not answer."""
    from calmd import paths
    from calmd.shell.client import CalmClient

    socket_path = args.socket or str(paths.socket_path())
    state = State(wire_text(" ".join(args.query)), mode=args.mode)
    tty: int | None = None
    no_tty, rows = "", 20
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        rows = os.get_terminal_size(tty).lines - 3
    except OSError as exc:  # no terminal is said once the daemon answered (without one: exit 3)
        no_tty = exc.strerror or str(exc)
    try:
        client = CalmClient(socket_path, timeout=CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        if tty is not None:
            os.close(tty)
        why = visible(exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc))
        raise Unavailable(f"calmd is not running ({visible(str(socket_path))}: {why}); start it with "
                          "`calmd serve`") from None  # fmt: skip
    session, cwd = wire_text(args.session), wire_text(args.cwd)
    search = Search(client, session, cwd, rows)
    try:
        first_answer(client, state, session, cwd, search.n)
        if tty is None:
            raise CalmError(f"no terminal to draw the search on (/dev/tty: {no_tty}); run it in one")
        with Screen(tty) as screen:
            return interact(screen, state, search)
    except (OSError, ValueError, RuntimeError) as exc:
        raise Unavailable(f"the search stopped: {one_line(exc)}") from None
    finally:
        client.close()
        if tty is not None:
            os.close(tty)


def interact(screen: Screen, state: State, search: Search) -> tuple[int, str]:
    home = os.environ.get("HOME", "")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    resized = [False]

    def on_winch(signum: int, frame: Any) -> None:
        resized[0] = True

    def on_stop(signum: int, frame: Any) -> None:
        raise SystemExit(CANCELLED)  # the terminal is restored on the way out

    handlers = {signal.SIGWINCH: on_winch, signal.SIGTERM: on_stop, signal.SIGHUP: on_stop}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        screen.draw(state, time.time(), home)
        pending = ""
        while True:
            fds = [screen.fd, wake_r] + ([] if search.gone else [search.client.fileno()])
            timeout = ESC_WAIT_S if pending else None
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                ready = []
            redraw = False
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 64)
            if resized[0]:
                resized[0] = False
                redraw = True
            if not search.gone and search.client.fileno() in ready:
                redraw |= search.take(state)
                if state.outcome is not None:
                    return state.outcome
            if screen.fd in ready:
                data = os.read(screen.fd, 4096)
                if not data:
                    return CANCELLED, ""
                pending += data.decode("utf-8", "replace")
                if pending.endswith("\x1b") or _incomplete(pending):
                    continue  # wait ESC_WAIT_S for the rest of an escape sequence
            if pending:
                keys, pending = pending, ""
                for action, text in parse_keys(keys):
                    outcome = handle(action, text, state, search, screen.size()[1] - 3)
                    if outcome is not None:
                        return outcome
                redraw = True
            if redraw:
                screen.draw(state, time.time(), home)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wake_r)
        os.close(wake_w)


def _incomplete(data: str) -> bool:
    """Whether `data` ends inside a CSI/SS3 escape sequence (its final byte still to come)."""
    at = data.rfind("\x1b")
    if at < 0 or at + 1 >= len(data) or data[at + 1] not in "[O":
        return False
    rest = data[at + 2 :]
    return not any("@" <= c <= "~" for c in rest) and len(rest) < 8


def handle(action: str, text: str, state: State, search: Search, rows: int) -> tuple[int, str] | None:
    """One key; an outcome when the UI is done."""
    if state.confirm:
        cmd, state.confirm = state.confirm, ""
        if action == "insert" and text in "yY":
            search.forget(cmd)
            state.status = "deleting…"
        else:
            state.status = ""
        return None
    if action == "cancel":
        return CANCELLED, ""
    if action in ("run", "edit", "forget") and state.chosen_cut() is not None:
        search.fetch(action, state.chosen_cut() or {}, state)  # the reply cut it: the whole line first
        return None
    if action in ("run", "edit"):
        chosen = state.chosen()
        if chosen is None:
            return (CANCELLED, "") if action == "run" and not state.query else None
        return CHOSEN, f"{action}\n{chosen}"
    if action in ("up", "down", "pageup", "pagedown"):
        step = {"up": -1, "down": 1, "pageup": -rows, "pagedown": rows}[action]
        state.move(step, rows)
        return None
    if action == "mode":
        state.next_mode()
        state.status = ""
        search.ask(state)
        return None
    if action == "forget":
        chosen = state.chosen()
        if chosen is not None:
            state.confirm = chosen
            state.status = f"delete every run of `{clip(visible(chosen), 40)}` from the history for good? y/n"
        return None
    if state.edit(action, text):
        state.status = ""
        search.ask(state)
    return None


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="calm search",
        description="Search the whole history, ranked by calmd (Ctrl-R in zsh, bash and fish). Prints "
        "`run` or `edit` and the chosen command; exit 1 when cancelled (or no terminal), 2 for a query "
        "too long, 3 when no daemon answers (each but a cancel says why on stderr).",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", nargs="*", metavar="QUERY", help="what to search first (the line typed so far)")
    p.add_argument("--session", default="", help="the shell session (ranks and filters by it)")
    p.add_argument("--cwd", default="", help="the folder the search is opened in (default: the current one)")
    p.add_argument("--mode", choices=SEARCH_MODES, default=os.environ.get("CALM_SEARCH_MODE") or "global",
                   help="the filter to start in (default $CALM_SEARCH_MODE, else global)")  # fmt: skip
    p.add_argument("--socket", metavar="PATH", help="the daemon's socket (default: $CALMD_SOCKET, ...)")


def cmd_search(args: argparse.Namespace, prog: str = "calm search") -> int:
    """The search, and its outcome for the hook (module docstring); what keeps it from opening is
    one line on stderr, which the hooks send to /dev/null: a query too long for the daemon (exit
    2), no daemon or no answer (UNAVAILABLE), no terminal (1, through run_tool). A query's bytes
    that are not UTF-8 are searched as U+FFFD, as the store keeps them."""
    if args.mode not in SEARCH_MODES:  # from $CALM_SEARCH_MODE
        args.mode = "global"
    if not args.cwd:
        with contextlib.suppress(OSError):
            args.cwd = os.getcwd()
    size = len(" ".join(args.query).encode("utf-8", "surrogateescape"))
    if size > MAX_QUERY_BYTES:
        print(f"{prog}: error: the query is {size:,} bytes, longer than the {MAX_QUERY_BYTES:,} a search "
              "takes; give a shorter one", file=sys.stderr)  # fmt: skip
        return 2
    try:
        status, out = run(args)
    except Unavailable as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return UNAVAILABLE
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return cmd_search(args)


if __name__ == "__main__":
    sys.exit(run_tool("calm search", main))
