"""The daemon's in-memory indexes brought up to date with the store between keystrokes.

Rows reach the store from outside the keystrokes' path: the first start's import and the sync
turns (in the worker process, calmd/daemon/worker.py), `calm import` and `calm forget` (other
processes), a training run's re-scan. The history index (calmd/suggest/index_catch_up.py) reads
them here, in slices of at most SLICE_S, each a background job of the scheduler on the model's
worker thread, the thread the index is confined to: a job waits behind every keystroke, a
keystroke stops the job running at its next look (every 64 rows), and the job is taken up again
after it (calmd/daemon/scheduler.py). The history search's index then reads them on its own thread,
stepping aside for the keystrokes (calmd/daemon/search.py, calmd/daemon/gate.py).

The store is looked at every POLL_S (a background job too: two SQL queries), and at once when
the daemon knows rows came (`poke`: a worker's job ended).

Python's cyclic garbage collector, once in a while, walks every object the process holds: with the
model and 100,000 commands in the two indexes, 350,000 objects and 0.5 s on a busy 2-core machine,
holding the interpreter; the objects an index catching up makes set it off, and the keystroke
behind it waited (issue 42: the 450-670 ms left after the worker and the slices). So the objects
that live on are moved out of its way (`freeze_heap`, gc.freeze) once the daemon is warm and
after each round of the catch-up that read rows: a full collection then walks only what came
since. What the indexes drop is freed by its reference count (their containers hold no cycles);
the young cycles are collected before each freeze, the older ones are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from calmd.daemon.scheduler import FairScheduler, Job
from calmd.suggest.index_catch_up import IndexCatchUp, until

log = logging.getLogger("calmd")

POLL_S = 0.5  # how often the store is looked at for rows the indexes have not read
SLICE_S = 0.008  # a slice's time at most, unless a keystroke stops it first


class Parts(Protocol):
    """What the catch-up needs of the service: its engine (an engine with a history index has
    `index` and `history`; a test's scripted engine has neither) and the history search."""

    engine: Any
    search: Any


class CatchUp:
    def __init__(self, scheduler: FairScheduler, parts: Parts) -> None:
        self.scheduler = scheduler
        self.parts = parts
        self.state = IndexCatchUp()
        self.slices = 0  # background jobs run (status)
        self._wake = asyncio.Event()
        self._task: asyncio.Future[None] | None = None
        self._failed: str | None = None
        self._search_behind = False  # rows the history index read that the search index was not told of

    def start(self) -> None:
        """Catching up from now on: the engine's index is followed at once (the keystrokes read
        a few rows each, not thousands) and the store is looked at now, not after POLL_S."""
        index = getattr(self.parts.engine, "index", None)
        if index is not None:
            self.state.follow(index)
        self._wake.set()
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def poke(self) -> None:
        """Rows came (or were deleted): look now rather than at the next poll."""
        self._wake.set()

    def describe(self) -> dict[str, Any]:
        return {"slices": self.slices, "rows": self.state.rows, "rebuilt": self.state.rebuilt,
                "building": self.state.aside is not None}  # fmt: skip

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()
            try:
                await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a full disk, a store being replaced: said once, tried again later
                why = f"{type(exc).__name__}: {exc}"
                if why != self._failed:
                    log.error("the history index's catch-up failed: %s", why)
                self._failed = why

    async def _catch_up(self) -> None:
        rows = self.state.rows
        while True:
            engine = self.parts.engine
            index, store = getattr(engine, "index", None), getattr(engine, "history", None)
            if index is None or store is None:
                break
            gate = getattr(self.parts, "gate", None)
            if gate is not None:
                await gate.between_keys()  # in the gaps the typing leaves (calmd/daemon/gate.py)
            done: list[bool] = []
            self.slices += 1
            await self.scheduler.submit(Job(owner=self, session="", run=self._slice(index, store, done),
                                            background=True))  # fmt: skip
            if not done or done[-1]:  # caught up (or dropped: the daemon stops)
                break
        self._failed = None
        if self.state.rows != rows:
            freeze_heap()  # what the index holds now: out of the full collections' way
        self._tell_search(came=self.state.rows != rows)

    def _tell_search(self, came: bool) -> None:
        """The history search's index reads what came on its own thread, once the rows stop
        coming (a search reads what is new itself: this only spares the next Ctrl-R the wait).
        Told at each round of an import, it made its text's arrays again each time, 20-150 ms
        of numpy for 100,000 commands, beside the keystrokes."""
        search = self.parts.search
        if came:
            self._search_behind = True
        elif self._search_behind and search is not None:
            self._search_behind = False
            search.touch()

    def _slice(self, index: Any, store: Any, done: list[bool]) -> Callable[[threading.Event, int], bool]:
        """A job's work on the worker thread: one slice; `done` gets whether it caught up (a slice
        stopped by a keystroke runs again after it, from where it was)."""

        def work(cancelled: threading.Event, attempt: int) -> bool:
            done.append(self.state.step(index, store, until(SLICE_S, cancelled.is_set)))
            return not cancelled.is_set()

        return work


def freeze_heap(*, full: bool = False) -> None:
    """Every object the process holds now moves out of the cyclic collector's way (gc.freeze): a
    full collection then walks only the objects made since (module docstring). Cycles are
    collected first: the young ones (a millisecond), or all of them with `full` (before `ready`)."""
    gc.collect(2 if full else 1)
    gc.freeze()
