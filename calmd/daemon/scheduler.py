"""Fair scheduling of completions on the daemon's single inference thread.

The model runs on one worker thread (it is thread-confined, and a second thread would only
share the same two cores). A plain FIFO in front of it lets one client that queues many requests
delay every other shell by the whole queue, so jobs wait here instead, grouped two levels deep:

- by *owner* (a connection): owners take turns, round robin, one job per turn, so a client
  that floods waits behind its own requests and delays another by at most one job;
- within an owner, by *lane*: each session is a lane holding only its newest request (a newer
  `complete` of the same session supersedes the pending one, answered as cancelled, or cancels
  the running one: docs/protocol.md, "Scheduling"), and requests without a session share one
  FIFO lane per owner;
  lanes take turns too.

A session is one shell's, whatever connection carries it: a newer request of session "s" on
another connection supersedes the older one as well.

Turns alone still make a shell's keystroke wait for the flood's job that has just started. So an
owner with a single request waiting (a shell: one request at a time) takes its turn before
owners with a backlog, and its job preempts the running job of an owner that has more waiting (a
flood), as long as that job has not sent a candidate yet: the preempted job stops at its next
cancellation check and goes back to the head of its lane, to run again from the start in a later
turn (what its first attempt produced is dropped, so no candidate is sent twice). Owners that
both have work waiting never preempt each other, so two floods cannot thrash, and two shells
never do.

At most one job is handed to the executor at a time, so other work submitted to the same
executor (a weight reload) waits for one job at most. Everything here runs on the event loop;
only `Job.run` runs on the worker thread.

A background job (`prepares`: the daemon preparing a session's next line after a `record`; or
`background`: a slice of the history index's catch-up, calmd/daemon/catch_up.py) is preempted by
any other session's request, and waits behind every request (the request of the session it
prepares cancels it: calmd/daemon/service.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger("calmd")

SESSIONLESS = ""  # the lane of an owner's requests that name no session


@dataclass(eq=False)
class Job:
    """One completion. `run(cancelled, attempt)` runs on the worker thread and returns True when
    it finished, False when it saw `cancelled`; whatever it sends must first pass `deliver`."""

    owner: Hashable
    session: str
    run: Callable[[threading.Event, int], bool]
    cancelled: threading.Event = field(default_factory=threading.Event)  # this attempt's
    result: asyncio.Future[bool] | None = None  # set by submit(): False when dropped or cancelled
    attempt: int = 0
    delivered: bool = False  # a candidate went out: too late to preempt
    preempted: bool = False  # stopped to let another owner's job go first: runs again
    dropped: bool = False  # superseded or its owner gone: never runs again
    prepares: str | None = None  # a background job preparing this session's next line (prefetch)
    background: bool = False  # a background job for no session (the index's catch-up)

    @property
    def in_background(self) -> bool:
        return self.background or self.prepares is not None

    def deliver(self, attempt: int) -> bool:
        """On the event loop, before a candidate of `attempt` is sent: False when that attempt
        was preempted (the candidate is dropped; the next attempt produces it again)."""
        if attempt != self.attempt:
            return False
        self.delivered = True
        return True

    def _resolve(self, finished: bool) -> None:
        assert self.result is not None
        if not self.result.done():
            self.result.set_result(finished)


class FairScheduler:
    def __init__(self, executor: concurrent.futures.Executor) -> None:
        self._executor = executor
        self._owners: dict[Hashable, OrderedDict[str, deque[Job]]] = {}
        self._turns: deque[Hashable] = deque()  # owners with waiting jobs, next turn first
        self._by_session: dict[str, Job] = {}  # each session's newest job, waiting or running
        self._wake = asyncio.Event()
        self.running: Job | None = None

    @property
    def waiting(self) -> int:
        return sum(len(lane) for lanes in self._owners.values() for lane in lanes.values())

    def submit(self, job: Job) -> asyncio.Future[bool]:
        """Queue `job`; the future says whether it finished (True) or was superseded/cancelled."""
        job.result = asyncio.get_running_loop().create_future()
        if job.session:
            self.cancel_session(job.session)
            self._by_session[job.session] = job
        lanes = self._owners.get(job.owner)
        if lanes is None:
            lanes = self._owners[job.owner] = OrderedDict()
            self._turns.append(job.owner)
        lanes.setdefault(job.session or SESSIONLESS, deque()).append(job)
        self._wake.set()
        self._maybe_preempt(job)
        return job.result

    def _waiting(self, owner: Hashable) -> int:
        lanes = self._owners.get(owner)
        return sum(len(lane) for lane in lanes.values()) if lanes else 0

    def _maybe_preempt(self, newcomer: Job) -> None:
        running = self.running
        if (
            running is not None
            and running.in_background
            and not newcomer.in_background
            and (running.prepares is None or newcomer.session != running.prepares)
            and not running.cancelled.is_set()
        ):  # a prefetch never delays another shell's keystroke: it stops and runs again later
            running.preempted = True
            running.attempt += 1
            running.cancelled.set()
            return
        if (
            running is None
            or running.owner == newcomer.owner
            or running.delivered
            or running.cancelled.is_set()
            or self._waiting(running.owner) == 0  # the running owner is no flood
            or self._waiting(newcomer.owner) > 1  # a flood does not preempt
        ):
            return
        running.preempted = True
        running.attempt += 1  # whatever the stopped attempt still emits is dropped
        running.cancelled.set()
        self._turns.remove(newcomer.owner)
        self._turns.appendleft(newcomer.owner)  # its job is next

    def cancel(self, job: Job) -> None:
        """Drop `job` (waiting) or tell it to stop (running)."""
        self._drop(job)

    def cancel_session(self, session: str) -> None:
        """Supersede the session's older job: dropped if it waits, told to stop if it runs."""
        older = self._by_session.pop(session, None)
        if older is not None:
            self._drop(older)

    def cancel_owner(self, owner: Hashable) -> None:
        """The owner went away (its connection closed): drop its jobs, stop its running one."""
        lanes = self._owners.pop(owner, None)
        if lanes is not None:
            self._turns.remove(owner)
            for lane in lanes.values():
                for job in lane:
                    self._forget(job)
                    job.dropped = True
                    job.cancelled.set()
                    job._resolve(False)
        if self.running is not None and self.running.owner == owner:
            self.running.dropped = True
            self.running.cancelled.set()

    def _drop(self, job: Job) -> None:
        job.dropped = True
        job.cancelled.set()
        if job is self.running:
            return  # it sees the event and stops; run() resolves it
        lanes = self._owners.get(job.owner)
        lane = lanes.get(job.session or SESSIONLESS) if lanes is not None else None
        if lanes is not None and lane is not None and job in lane:
            lane.remove(job)
            if not lane:
                del lanes[job.session or SESSIONLESS]
            if not lanes:
                del self._owners[job.owner]
                self._turns.remove(job.owner)
        job._resolve(False)

    def _forget(self, job: Job) -> None:
        if job.session and self._by_session.get(job.session) is job:
            del self._by_session[job.session]

    def _background(self, owner: Hashable) -> bool:
        lanes = self._owners[owner]
        return next(iter(next(iter(lanes.values())))).in_background

    def _next(self) -> Job | None:
        if not self._turns:
            return None
        # An owner with a single request (a shell typing) goes before those with a backlog, as
        # it would preempt them a moment later anyway; among equals, turns.
        # Background jobs (prefetch) go after every request.
        owners = [o for o in self._turns if not self._background(o)] or list(self._turns)
        owner = next((o for o in owners if self._waiting(o) == 1), owners[0])
        self._turns.remove(owner)
        lanes = self._owners[owner]
        name, lane = next(iter(lanes.items()))
        job = lane.popleft()
        if lane:
            lanes.move_to_end(name)  # the owner's other lanes go first next time
        else:
            del lanes[name]
        if lanes:
            self._turns.append(owner)
        else:
            del self._owners[owner]
        return job

    async def run(self) -> None:
        """The dispatcher: hand jobs to the executor one at a time, in fair order, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            job = self._next()
            if job is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            if job.cancelled.is_set():
                self._forget(job)
                job._resolve(False)
                continue
            self.running = job
            try:
                finished = await loop.run_in_executor(self._executor, job.run, job.cancelled, job.attempt)
            except asyncio.CancelledError:
                job.cancelled.set()
                job._resolve(False)
                raise
            except Exception as exc:  # the request's own failure: its caller answers `internal`
                self.running = None
                self._forget(job)
                assert job.result is not None
                if not job.result.done():
                    job.result.set_exception(exc)
                continue
            self.running = None
            if job.preempted and not job.dropped:
                self._requeue(job)
                continue
            self._forget(job)
            job._resolve(finished)

    def _requeue(self, job: Job) -> None:
        """A preempted job goes back to the head of its lane, with a fresh cancellation event;
        its owner takes its next turn after the others waiting now."""
        job.preempted = False
        job.cancelled = threading.Event()
        lanes = self._owners.get(job.owner)
        if lanes is None:
            lanes = self._owners[job.owner] = OrderedDict()
            self._turns.append(job.owner)
        name = job.session or SESSIONLESS
        lanes.setdefault(name, deque()).appendleft(job)
        lanes.move_to_end(name, last=False)
