"""The first key of a line answered at once, from what the daemon prepared for the line (issue 42).

A line's first request is the empty prompt's (zsh asks as soon as the prompt is drawn; the daemon
prepares it after each `record`: the prefetch). With that answer, the daemon prepares the first
key too (`prepare_keys`: for zsh, asking with `keys`, before the answer's `done`, as `key` replies
zsh draws itself with no round trip; else between keystrokes, a background job of the scheduler):
for the first characters of the user's likeliest commands, the engine's early line for that one
character (the history's best line, its confidence and whether the ghost rule draws it:
`ModelEngine.early`). When the first key is asked of the daemon, the same line is sent as the
request's `early` from the event
loop, before the request reaches the model's thread, where it waited for the empty prompt's job to
stop, for its COMP frame and its history proposals, and for the interpreter (10-13 ms p50 to the
ghost in a real zsh, against 3.8-4.0 ms for zsh-autosuggestions' async mode). The line is the one
the engine would draw first (`resolve`): the empty prompt's ghost while the key extends it, else
the early line prepared for the key, else the answer's best line that extends it, each only when
the shells would draw it. The engine is told it is drawn (`drawn`): the final answer keeps it
unless it has a clearly better line (the ghost rule's margin, calmd/suggest/ghost.py), as when the
user types along a ghost.

What was prepared counts only for a request in the same context: every field of the request's
context but the input (the folder, the branch, the history frames, ENV, ...) equal, and no command
recorded or forgotten since (`Answers.version`). The session's own answer first; a session without
one in that context (a shell just opened, whose first line's frames are the user's latest commands)
takes the newest answer of another session in the same context (`_by_context`): the engine would
answer it the same, and it is ready, where the new session's own empty prompt is still being
answered when a quick first key comes (the first line of a new zsh was the p90 of the first keys).
Drawn or not is the engine's decision for the early line (the shell's own threshold when it sent
one, else the fitted rule's early threshold; an answer's line is drawn at its empty-prompt
confidence: one more matching character only makes a line likelier).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calmd.daemon.gate import KeystrokeGate
from calmd.daemon.scheduler import FairScheduler, Job

MAX_SESSIONS = 256  # sessions whose empty-prompt answer is kept
FIRST_KEYS = 16  # first characters prepared per line (of the likeliest commands' first words)


@dataclass(frozen=True)
class Line:
    text: str
    confidence: float
    ghost: bool  # the shells drew it (or its head, `draw`)
    draw: str | None = None  # the head drawn of it, when only its head was


@dataclass
class Answer:
    """An empty prompt's answer: its lines in rank order, and the early line prepared for each
    first key (`keys`: filled on the model's thread, read on the event loop; a key's line is
    set once)."""

    key: str
    typed: str
    lines: list[Line] = field(default_factory=list)
    keys: dict[str, Line | None] = field(default_factory=dict)


def context_key(ctx: dict[str, Any], version: int) -> str:
    """What makes two requests the same context: every field but the input, and the store's
    version. (Built before the model's thread adds the COMP and ENV frames to `ctx`.)"""
    return repr((version, sorted((k, v) for k, v in ctx.items() if k != "input")))


class Answers:
    """Each session's empty-prompt answer, on the event loop; its first keys prepared on the model's
    thread (the scheduler's background jobs, calmd/daemon/scheduler.py)."""

    def __init__(self, scheduler: FairScheduler | None = None, gate: KeystrokeGate | None = None) -> None:
        self._last: OrderedDict[str, Answer] = OrderedDict()
        self._by_context: OrderedDict[str, Answer] = OrderedDict()  # the newest answer per context key
        self._scheduler = scheduler
        self._gate = gate
        self._preparing: dict[str, Job] = {}  # each session's first keys being prepared
        self.version = 0  # bumped by every stored or forgotten command: older answers are stale
        self.sent = 0  # first keys answered at once (status)
        self.keyed = 0  # empty-prompt answers that went out with their first keys (status)

    def describe(self) -> dict[str, int]:
        """`first_keys`: first keys answered at once from the empty prompt's answer; `keyed`:
        empty-prompt answers sent with their first keys (zsh draws those itself)."""
        return {"first_keys": self.sent, "keyed": self.keyed}

    def changed(self) -> None:
        """A command was stored or forgotten: every answer kept belongs to another history."""
        self.version += 1
        self._last.clear()
        self._by_context.clear()

    def keep(self, session: str, answer: Answer) -> bool:
        """Keep the session's answer to the empty prompt (answers to a typed input are not kept:
        typing along them is the engine's, calmd/suggest/engine.py `_typed_through`)."""
        if not session or not answer.lines or answer.typed:
            return False
        for kept, name in ((self._last, session), (self._by_context, answer.key)):
            kept[name] = answer
            kept.move_to_end(name)
            while len(kept) > MAX_SESSIONS:
                kept.popitem(last=False)
        return True

    def keep_and_prepare(self, session: str, answer: Answer, ctx: dict[str, Any], engine: Any) -> None:
        """Keep a session's empty-prompt answer, and prepare its first keys between keystrokes (a
        background job, stopped by any keystroke and taken up after it); `ctx`: the answer's,
        its COMP and ENV filled."""
        if not self.keep(session, answer) or engine is None or self._scheduler is None:
            return
        older = self._preparing.pop(session, None)
        if older is not None:
            self._scheduler.cancel(older)

        def work(cancelled: threading.Event, attempt: int) -> bool:
            if self.current(session) is not answer:
                return True  # a newer answer has its own
            return prepare_keys(engine, answer, ctx, session, cancelled.is_set)

        job = Job(owner=self, session="", run=work, background=True)
        self._preparing[session] = job

        def finished(_: asyncio.Future[bool]) -> None:
            if self._preparing.get(session) is job:
                del self._preparing[session]

        self._scheduler.submit(job).add_done_callback(finished)

    def send_keys(
        self, session: str, answer: Answer, ctx: dict[str, Any], engine: Any, min_confidence: float | None,
        send: Callable[[str, Line], None], cancelled: threading.Event,
    ) -> None:  # fmt: skip
        """On the model's thread, after an empty prompt's candidates (a request with `keys`): the
        line the shell draws at once for each likely first key, each handed to `send` as soon as
        it is known. It stops when another keystroke waits (the rest is prepared between
        keystrokes, for the daemon's own early line) or the session's next request comes."""
        known = self.in_context(session, answer.key)
        if known is not None:
            answer.keys.update(known.keys)  # this context's, prepared before

        def found(key: str) -> None:
            line = resolve(answer, key, min_confidence, engine)
            if line is not None:
                send(key, line)

        def stop() -> bool:
            return cancelled.is_set() or (self._gate is not None and self._gate.in_flight > 1)

        prepare_keys(engine, answer, ctx, session, stop, found)

    def current(self, session: str) -> Answer | None:
        """The session's answer kept now (any thread: one dict lookup)."""
        return self._last.get(session)

    def in_context(self, session: str, key: str) -> Answer | None:
        """The empty-prompt answer kept for a request of `session` in the context `key`: the
        session's own, else the newest of another session in that context (module docstring)."""
        own = self._last.get(session)
        if own is not None and own.key == key:
            return own
        return self._by_context.get(key)

    def pick(self, session: str, asked: Answer, min_confidence: float | None, engine: Any) -> Line | None:
        """The line to draw at once for the request `asked` (its context's key and input, no lines
        yet), from an empty-prompt answer in the same context (`in_context`); else None."""
        answer = self.in_context(session, asked.key)
        if answer is None:
            return None
        return resolve(answer, asked.typed, min_confidence, engine)


def resolve(answer: Answer, typed: str, min_confidence: float | None, engine: Any) -> Line | None:
    """What the shells draw at once for `typed` from an empty prompt's answer, in the engine's
    order: the line drawn on the empty prompt while it extends `typed` (the user types along it);
    else, for a first key, the engine's early line for that key (the history's best, which the
    engine itself would draw first) when drawn; else the answer's best line that extends `typed`
    when drawn; else None."""
    if not typed:
        return None
    extending = [ln for ln in answer.lines if len(ln.text) > len(typed) and ln.text.startswith(typed)]
    choices = [ln for ln in extending if ln.ghost][:1]
    early = answer.keys.get(typed) if len(typed) == 1 else None
    if early is not None and len(early.text) > 1:
        choices.append(early)
    choices += extending[:1]
    for line in choices:
        if drawn(line, typed, min_confidence, engine):
            head = line.draw
            if head is not None and len(head) > len(typed) and head.startswith(typed):
                return Line(head, line.confidence, True)
            return line
    return None


def drawn(line: Line, typed: str, min_confidence: float | None, engine: Any) -> bool:
    """Whether the shells draw `line` as the early line for `typed` (the engine's rule)."""
    if min_confidence is not None:
        return line.confidence >= min_confidence
    if line.ghost:
        return True
    rule = getattr(engine, "ghost", None)  # calmd/suggest/ghost.py GhostRule; a test's engine has none
    if rule is None:
        return False
    index = getattr(engine, "index", None)
    return bool(rule.draws_early(typed, line.confidence, len(index) if index is not None else 0))


def first_keys(engine: Any, limit: int = FIRST_KEYS) -> list[str]:
    """The first characters of the user's likeliest commands: of the latest ones, then of the
    most frequent first words (the engine's history index; on the model's thread)."""
    index = getattr(engine, "index", None)
    if index is None:
        return []
    keys: dict[str, None] = {}
    for cmd in reversed(index.recent):
        if cmd[:1].strip():
            keys.setdefault(cmd[0])
    for word, _ in index.word_count.most_common(limit * 2):
        keys.setdefault(word[0])
    return list(keys)[:limit]


def prepare_keys(
    engine: Any, answer: Answer, ctx: dict[str, Any], session: str, stop: Callable[[], bool],
    found: Callable[[str], None] | None = None,
) -> bool:  # fmt: skip
    """The early line of each likely first key into `answer.keys` (on the model's thread), until
    `stop()`; True when all are there. `ctx`: the empty prompt's, COMP and ENV filled. `found(key)`:
    called for each key once its line is known (those known already too), and for the first
    characters of the answer's own lines."""
    early = getattr(engine, "early", None)  # ModelEngine.early; a test's scripted engine has none
    keys = first_keys(engine) if early is not None else []
    keys += [ln.text[0] for ln in answer.lines if ln.text[:1] and ln.text[0] not in keys]
    for key in dict.fromkeys(keys):
        if stop():
            return False
        if early is not None and key not in answer.keys:
            got = early({**ctx, "input": key}, session)
            answer.keys[key] = None if got is None else Line(str(got[0]), float(got[1]), bool(got[2]))
        if found is not None:
            found(key)
    return True
