"""The daemon's side of the COMP and ENV frames: what each session's keystrokes and records get.

- `complete`: when the client sends no `completions`, the daemon computes them for the input
  with `calmd.suggest.frames.completions`, from the shell's cwd (calmd/suggest/disk.py, bounded in
  time), the commands on the PATH the session's helper sent once, and the subcommands and options
  of the engine's vocabularies. `env` is the client's, cleaned (`clean_env`).
  The items are computed when a word is begun and kept while that word is typed on, as long as
  one of them still extends it: a new COMP frame costs the model a prefill of the frame and what
  follows it (bench/comp_latency.py: +7% on the median keystroke when it changed at every one),
  and a frame computed a byte or two into the word is what the corpus and the stored records
  hold (calmd/suggest/frames.py `comp_cut`).
- `record`: the command is stored with the COMP items of the session's last keystroke whose input
  it extends, typed in the same cwd (what the context held when it was typed), and with its
  `env`. A command no keystroke asked about (a pasted line, a bash user who never pressed
  Shift-Tab) is stored without COMP: the daemon does not guess what the context held.
Memory is bounded: at most `sessions` sessions are remembered (least recently used go first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from calmd.protocol import MAX_PATH_BYTES
from calmd.suggest.disk import Disk
from calmd.suggest.frames import Followers, clean_env, completions, still_extends, word_start

MAX_SESSIONS = 256


@dataclass
class _Session:
    path: str = ""  # the shell's PATH, as its helper sent it
    last_input: str = ""  # the last keystroke's input, cwd and COMP
    last_cwd: str = ""
    last_comp: tuple[str, ...] = ()


class SessionComp:
    """Per-session COMP state (module docstring). Thread-safe: keystrokes are served on the
    worker thread, records on the event loop."""

    def __init__(self, disk: Disk, sessions: int = MAX_SESSIONS) -> None:
        self.disk = disk
        self.sessions = sessions
        self._lock = threading.Lock()
        self._state: OrderedDict[str, _Session] = OrderedDict()

    def _session(self, session: str) -> _Session:
        with self._lock:
            state = self._state.get(session)
            if state is None:
                state = self._state[session] = _Session()
                while len(self._state) > self.sessions:
                    self._state.popitem(last=False)
            else:
                self._state.move_to_end(session)
            return state

    def set_path(self, session: str, path: str) -> None:
        self._session(session).path = path[:MAX_PATH_BYTES]

    def fill(self, ctx: dict[str, Any], session: str, followers: Followers | None) -> None:
        """Put the COMP items into `ctx` (unless the client sent its own) and remember them."""
        if "env" in ctx:
            env = clean_env(str(ctx["env"]))
            if env:
                ctx["env"] = env
            else:
                del ctx["env"]
        typed = str(ctx.get("input", ""))
        cwd = str(ctx.get("cwd") or "")
        state = self._session(session)
        if "completions" not in ctx:
            if self._same_word(state, typed, cwd):
                items = list(state.last_comp)
            else:
                lister = self.disk.lister(cwd) if cwd.startswith("/") else None
                commands = self.disk.commands(state.path) if state.path else ()
                items = completions(typed, lister=lister, commands=commands, followers=followers)
            if items:
                ctx["completions"] = items
        state.last_input, state.last_cwd = typed, cwd
        state.last_comp = tuple(ctx.get("completions") or ())

    @staticmethod
    def _same_word(state: _Session, typed: str, cwd: str) -> bool:
        """Whether `typed` goes on with the word the last keystroke's COMP was made for, and one of
        its items still extends it (then they are kept: module docstring)."""
        last = state.last_input
        if not state.last_comp or cwd != state.last_cwd or not last or not typed.startswith(last):
            return False
        start = word_start(last)
        if start == len(last) or any(c in " \t" for c in typed[len(last) :]):
            return False  # no word was begun then, or a new word is begun now
        return still_extends(state.last_comp, typed[start:])

    def for_record(self, session: str, cmd: str, cwd: str) -> tuple[str, ...]:
        """The COMP items the context held when `cmd` was typed (module docstring)."""
        with self._lock:
            state = self._state.get(session)
        if state is None or not state.last_input or state.last_cwd != cwd:
            return ()
        if not cmd.startswith(state.last_input):
            return ()
        comp = state.last_comp
        state.last_input, state.last_comp = "", ()  # one record per keystroke's frames
        return comp
