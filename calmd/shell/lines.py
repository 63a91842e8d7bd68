"""The line protocol between a shell's hook and its helper (calmd/shell/helper.py), as the helper
parses it. UTF-8; in every field `\\` is written `\\\\`, newline `\\n`, tab `\\t`; fields
separated by tabs. The hooks start the helper with `--format 2`:

    shell -> helper   c <seq> <n> <cwd> <git> <min> <input>      complete `input`, best `n`
                      r <exit> <cwd> <git> <ts> <cmd> [<secs>]   record an executed command (and
                                                                 how long it ran; ts empty: then)
                      p <ts> <secs>                              a command ran while recording was
                                                                 paused (CALM_RECORD=0): when, and
                                                                 nothing else (ts empty: then)
                      e <virtualenv> <conda env>                 the environment changed
    helper -> shell   <seq> <final> <flags> <candidate>...       candidates, best first

`e` comes from the prompt hook when $VIRTUAL_ENV or $CONDA_DEFAULT_ENV changed (and once after the
helper starts), never per keystroke; the helper sends its short form (`venv:proj`,
calmd.suggest.frames.short_env) as `env` with every `complete` and with the records read after
it. `p` (the fish hook's, issue 39) lets the daemon leave a paused line out of any import of the
shell's own history file, which holds it (calmd/history/coverage.py): it carries the start only.

An `r` or `p` line without a `ts` is timed by the helper: the moment it was written (fish's
request file's mtime; else when the helper read it) less the seconds it ran.

`min` is the shell's CALM_MIN_CONFIDENCE (empty: the daemon's fitted ghost rule,
calmd/suggest/ghost.py), sent on as the request's `min_confidence`. `flags` holds one character per
candidate: 1 for the one the daemon says to draw (`ghost`), so that it is shown unasked; 0 when
only cycling should reach it (an older daemon sends no `ghost`: then 1 when the confidence reaches
`min`, else DEFAULT_MIN_CONFIDENCE). A `c` line is answered first, at once, with the daemon's
`early` answer (the history's best line, asked for with `"early": true`) when the daemon draws it;
then with the first candidate when it is drawn and differs from what is shown (both final=0);
then with every candidate (final=1), which may hold none (no daemon, disabled, nothing to
suggest). Only the newest `c` matters: older ones that are still queued are skipped, and the
daemon cancels an older request of the same session when a newer one arrives. `r` and `p` lines
get no answer; they are sent before the next `c`, and kept (up to 256) while no daemon runs.

Without `--format 2` (a hook from before it, whose helper was restarted by an upgraded calmd),
`c` lines have no `min` and answers no `flags`, and nothing else changes: no early answer.

With `--format 3` (zsh's hook), a `c` line for the empty prompt asks the daemon for its first keys
too (`keys`, docs/protocol.md): the final answer carries, after the candidates, the line to draw at
once for each likely first character, flagged 2. The shell draws the one that extends a buffer of
that one character as soon as the key is typed, with no round trip, until the answer to that key
comes; flag-2 lines are never cycled to (issue 42).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from calmd.protocol import EXIT_MAX, EXIT_MIN, MAX_CANDIDATES, TS_MAX

log = logging.getLogger("calmd.shell.helper")


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass
class Complete:
    seq: str
    n: int
    input: str
    cwd: str
    git: str
    min_confidence: float | None = None  # None: the default threshold


def parse_duration(text: str) -> float | None:
    """Seconds from the shell (`1.25`), else None; within what the protocol takes."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1e9 else None


def parse_time(text: str) -> float | None:
    """The shell's time of a command: seconds since the epoch from 1970 to 2100 (protocol.TS_MAX),
    else None (the daemon's clock times it: a clock that is wrong costs the time, not the
    command, which the daemon refused with `bad_field`). ValueError when it is not a number."""
    value = float(text) if text else None
    return value if value is not None and 0.0 <= value <= TS_MAX else None


def parse_confidence(text: str) -> float | None:
    """A threshold from the shell: a number in [0, 1], else None (the default)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


@dataclass
class Record:
    cmd: str
    exit: int | None
    cwd: str
    git: str
    ts: float | None
    env: str = ""  # the short form of the environment the command was typed in
    duration: float | None = None  # seconds it ran, when the shell measured it
    paused: bool = False  # a `p` line: a command ran while recording was paused (cmd empty)

    def fields(self, session: str) -> dict[str, Any]:
        """The `record` request's fields besides `cmd`, unset ones left out. A paused one carries
        its start and session alone: nothing of the line (an older daemon takes its empty `cmd`
        for an empty command, and stores nothing)."""
        if self.paused:
            return {"paused": True, "session": session, **({"ts": self.ts} if self.ts is not None else {})}
        fields = {"exit": self.exit, "cwd": self.cwd, "git": self.git, "ts": self.ts, "session": session,
                  "env": self.env, "duration": self.duration}  # fmt: skip
        return {k: v for k, v in fields.items() if v is not None and v != ""}


@dataclass
class Env:
    virtual_env: str
    conda_env: str

    def short(self) -> str:
        from calmd.suggest.frames import short_env  # not at start-up: the first prompt waits for it

        return short_env(self.virtual_env, self.conda_env)


def parse_request(line: str, written: float | None = None) -> Complete | Record | Env | None:
    """One line from the shell; `written`: when the shell wrote it, if known (a spool file's
    mtime), else now: the start of a command the shell gave no time for is then less its seconds."""
    parts = line.split("\t")
    now = time.time() if written is None else written
    try:
        if parts[0] == "e" and len(parts) == 3:
            return Env(unescape(parts[1]), unescape(parts[2]))
        if parts[0] == "c" and len(parts) in (6, 7):  # 6: a hook from before --format 2
            n = max(0, min(MAX_CANDIDATES, int(parts[2] or 5)))
            threshold = parse_confidence(parts[5]) if len(parts) == 7 else None
            cwd, git = unescape(parts[3]), unescape(parts[4])
            return Complete(parts[1], n, unescape(parts[-1]), cwd, git, threshold)
        if parts[0] == "r" and len(parts) in (6, 7):  # 7: with the seconds it ran
            exit_code = int(parts[1]) if parts[1].lstrip("-").isdigit() and len(parts[1]) < 12 else None
            if exit_code is not None and not EXIT_MIN <= exit_code <= EXIT_MAX:
                exit_code = None  # no status a shell reports: unknown, and the command still recorded
            duration = parse_duration(parts[6]) if len(parts) == 7 else None
            ts = parse_time(parts[4])
            if ts is None and duration is not None:  # the shell had no clock: it started that long ago
                ts = now - duration
            cwd, git = unescape(parts[2]), unescape(parts[3])
            return Record(unescape(parts[5]), exit_code, cwd, git, ts, duration=duration)
        if parts[0] == "p" and len(parts) == 3:  # paused: when it started, nothing else
            ts = parse_time(parts[1])
            if ts is None:
                ts = now - (parse_duration(parts[2]) or 0.0)
            return Record("", None, "", "", ts, paused=True)
    except ValueError:
        pass
    log.warning("ignoring a malformed request: %.200r", line)
    return None
