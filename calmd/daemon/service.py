"""The daemon's service: what each request means. `complete` (a keystroke), `record` (an executed
command), the prefetch after a record, the training trigger, `search` and `forget` (the history
search, calmd/daemon/search.py); `status`, `reload` and
`shutdown` go to the server that wires the service to its transport (calmd/daemon/server.py).

- completions run on one worker thread, off the event loop, so that `status` and `record` stay
  instant; a fair scheduler (calmd/daemon/scheduler.py) takes connections and sessions in turn,
  keeps only each session's newest request, and so lets no client delay another by more than one
  completion;
- the context a keystroke gets: the history frames from the store (calmd/suggest/context.py,
  cached per session until the next record), COMP and ENV (calmd/daemon/comp_state.py);
- the last gate before a candidate leaves: nothing that drives a terminal, nothing over 4 KiB,
  a multi-line entry only for a client that draws it as lines (calmd/suggest/filters.py);
- background training is calmd/daemon/trainer.py's `Trainer`, started here when enough new
  commands came and the machine is not busy, or when a client asks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from calmd.daemon.answers import Answer, Answers, Line, context_key
from calmd.daemon.comp_state import SessionComp
from calmd.daemon.gate import KeystrokeGate
from calmd.daemon.scheduler import FairScheduler, Job
from calmd.daemon.search import SearchService
from calmd.daemon.trainer import Trainer
from calmd.daemon.transport import Connection
from calmd.errors import DiskFull
from calmd.history.store import HistoryStore
from calmd.protocol import (
    CompleteRequest,
    ForgetRequest,
    ProtocolError,
    RecordRequest,
    SearchRequest,
    SimpleRequest,
    parse_request,
    reply,
)
from calmd.suggest.context import recent_context
from calmd.suggest.disk import Disk
from calmd.suggest.filters import sendable

log = logging.getLogger("calmd")


class Engine(Protocol):
    """What the service needs from the model side (calmd/suggest/engine.py implements it)."""

    def describe(self) -> dict[str, Any]: ...

    def attach_history(self, store: HistoryStore) -> None: ...

    def complete(
        self,
        ctx: dict[str, Any],
        n: int,
        session: str,
        cancelled: threading.Event,
        early: Callable[[str, float, bool], None] | None = None,
        *,
        min_confidence: float | None = None,
        drawn: str | None = None,
    ) -> Iterator[Suggestion]:
        """Yields (candidate, score, confidence, ghost) with the drawn one first, then best
        first; calls `early(candidate, confidence, ghost)` at most once, before the first
        candidate (the history's best proposal). `min_confidence`: the shell's threshold for the
        ghost in place of the fitted rule's (calmd/suggest/ghost.py); `drawn`: the line the shell
        shows already, which stays unless clearly beaten."""
        ...


EngineLoader = Callable[[Path], Engine]
Suggestion = tuple[Any, ...]  # (candidate, score, confidence, ghost, ...): calmd.suggest.engine.Suggestion


class Control(Protocol):
    """What the server does for the service: the requests about the daemon itself."""

    def status(self) -> dict[str, Any]: ...

    def reload(self) -> Awaitable[dict[str, Any]]: ...

    def shutdown(self) -> None: ...


class LatencyStats:
    """Recent latencies in ms; percentiles for `status`."""

    def __init__(self, size: int = 2000) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, ms: float) -> None:
        self.values.append(ms)

    def percentile(self, q: float) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class Service:
    """One per daemon; its `engine` and `history` are set by the server once loaded and opened."""

    def __init__(
        self, control: Control, scheduler: FairScheduler, trainer: Trainer, *, history_context: int,
        train_threshold: int, train_max_load: float, prefetch: bool,
    ) -> None:  # fmt: skip
        self.control = control
        self.scheduler = scheduler
        self.trainer = trainer
        self.history_context = history_context
        self.train_threshold = train_threshold
        self.train_max_load = train_max_load  # per core
        self.hold_training: str | None = None  # why automatic runs wait, besides the load (an import)
        self.prefetch = prefetch
        self.engine: Engine | None = None
        self.history: HistoryStore | None = None
        self.search: SearchService | None = None  # `search` and `forget`, on a thread of their own
        self.disk = Disk()  # COMP's listings and the disk check (calmd/suggest/disk.py)
        self.comp = SessionComp(self.disk)
        self.first_ms = LatencyStats()
        self.done_ms = LatencyStats()
        self.gate = KeystrokeGate()  # the keystrokes in flight: background threads step aside
        self.withheld = 0  # candidates the last gate held back (control characters)
        self._recent_cache: dict[str, list[dict[str, Any]]] = {}
        self._recent_generation = 0  # the history's generation the cache was filled at
        # Prefetch: each session's last request (its context without input and history, its n),
        # and the background job preparing its next line after a record.
        self._last_request: dict[str, tuple[dict[str, Any], int]] = {}
        self._prefetch: dict[str, Job] = {}
        self._prefetch_owner = object()  # the scheduler's owner of every prefetch job
        self.prefetch_stats = {"started": 0, "finished": 0, "stopped": 0}
        # each session's empty-prompt answer and its first keys: a line's first key at once
        self.answers = Answers(scheduler, self.gate)

    # -- the transport's handler --------------------------------------------------------------------

    async def handle(self, message: Any, conn: Connection) -> None:
        """Answer one decoded request (replies are written as they come; the transport does the
        flow control). A bad request gets an error reply; nothing takes the daemon down."""
        try:
            request = parse_request(message)
            if isinstance(request, CompleteRequest):
                await self.complete(request, conn)
            elif isinstance(request, RecordRequest):
                conn.send(reply(request.id, **await self.record(request)))
            elif isinstance(request, SearchRequest | ForgetRequest):
                conn.send(reply(request.id, **await self.history_search(request, conn)))
            else:
                conn.send(reply(request.id, **await self.simple(request)))
        except ProtocolError as exc:
            conn.reject(exc.request_id, exc.code, exc.message)
        except DiskFull as exc:
            rid = message.get("id") if isinstance(message, dict) else None
            log.error("disk full: %s", exc)
            conn.reject(rid if isinstance(rid, int) else None, "disk_full", str(exc))
        except Exception as exc:  # never a dead daemon: log, answer, carry on
            rid = message.get("id") if isinstance(message, dict) else None
            log.exception("request failed")
            conn.reject(rid if isinstance(rid, int) else None, "internal", str(exc))

    def connection_closed(self, conn: Connection) -> None:
        self.scheduler.cancel_owner(conn)
        if self.search is not None:
            self.search.drop(conn)

    async def simple(self, request: SimpleRequest) -> dict[str, Any]:
        if request.op == "status":
            return {"status": await asyncio.to_thread(self.control.status)}
        if request.op == "reload":
            return await self.control.reload()
        if request.op == "train":
            return await self.start_training("request")
        if request.op == "shutdown":
            asyncio.get_running_loop().call_soon(self.control.shutdown)
            return {"ok": True}
        raise AssertionError(f"parse_request let through op {request.op!r}")  # SIMPLE_OPS are all here

    # -- record ----------------------------------------------------------------------------------

    async def record(self, request: RecordRequest) -> dict[str, Any]:
        assert self.history is not None
        if request.paused:  # recording paused (CALM_RECORD=0): when, so that no import brings it back
            start = request.ts if request.ts is not None else time.time() - (request.duration or 0.0)
            deleted = await asyncio.to_thread(self.history.note_paused, start, request.session)
            if deleted:
                self._recent_cache.clear()
                if self.search is not None:
                    self.search.touch()
            return {"ok": True, "stored": False, "reason": "paused"}
        self.disk.invalidate()  # the command may have made or removed what the next keystroke lists
        result = await asyncio.to_thread(
            self.history.record,
            request.cmd,
            exit=request.exit,
            cwd=request.cwd,
            git=request.git,
            session=request.session,
            ts=request.ts,
            comp=self.comp.for_record(request.session, request.cmd, request.cwd),
            env=request.env,
            duration=request.duration,
        )
        if result.stored:
            self._recent_cache.clear()  # other sessions top up with this command too
            self.answers.changed()
            if self.search is not None:
                self.search.touch()
            if self.prefetch and request.session:
                self._start_prefetch(request.session)
        if result.stored:
            await self.check_training("record")
        return {"ok": True, "stored": result.stored, **({"reason": result.reason} if result.reason else {})}

    # -- the history search ------------------------------------------------------------------------

    async def history_search(
        self, request: SearchRequest | ForgetRequest, conn: Connection
    ) -> dict[str, Any]:
        """`search` (ranked with the session's latest commands as context) and `forget`
        (calmd/daemon/search.py, on the search's own thread)."""
        if self.search is None:  # the server starts it before it accepts: a bug, answered `internal`
            raise RuntimeError("the history search is not running")
        if isinstance(request, ForgetRequest):
            outcome = await self.search.forget(request)
            self._recent_cache.clear()
            self.answers.changed()
            return outcome
        history = [h["cmd"] for h in self.recent_history(request.session)]
        return await self.search.search(request, history, conn)

    # -- the prefetch ------------------------------------------------------------------------------

    def _start_prefetch(self, session: str) -> None:
        """Prepare the session's next empty prompt in the background, as soon as its command is
        recorded: the new context's prefill and the empty-prompt answer, which the engine keeps
        (calmd/suggest/engine.py: the next request with that context continues it). The context is
        guessed from the session's last request (its cwd and git, the store's history frames): a
        command that changed folder makes the guess wrong. The session's next request stops it."""
        last = self._last_request.get(session)
        engine = self.engine
        if last is None or engine is None:
            return
        fields, n = last
        ctx = {**fields, "history": self.recent_history(session), "input": ""}
        older = self._prefetch.pop(session, None)
        if older is not None:
            self.scheduler.cancel(older)
        version = self.answers.version
        answer = Answer(context_key(ctx, version), "")  # its lines: the first key's early

        def work(cancelled: threading.Event, attempt: int) -> bool:
            try:  # ENV (and COMP, empty before a word is begun), as the request path fills them
                self.comp.fill(ctx, session, getattr(engine, "followers", None))
            except Exception:
                log.exception("the COMP frame could not be built; preparing without it")
            answer.lines.clear()
            for suggestion in engine.complete(ctx, n, session, cancelled):
                if cancelled.is_set():
                    return False
                answer.lines.append(_line(suggestion))
            return not cancelled.is_set()

        job = Job(owner=self._prefetch_owner, session="", run=work, prepares=session)
        self._prefetch[session] = job
        self.prefetch_stats["started"] += 1

        def finished(future: asyncio.Future[bool]) -> None:
            ok = not future.cancelled() and future.exception() is None and future.result()
            self.prefetch_stats["finished" if ok else "stopped"] += 1
            if ok and self.answers.version == version:  # nothing recorded since: still this context's
                self.answers.keep_and_prepare(session, answer, ctx, engine)
            if self._prefetch.get(session) is job:
                del self._prefetch[session]

        self.scheduler.submit(job).add_done_callback(finished)

    def recent_history(self, session: str) -> list[dict[str, Any]]:
        """The context's history frames, cached per session until the next stored command (a
        keystroke must not cost a database query)."""
        generation = self.history.generation() if self.history is not None else 0
        if generation != self._recent_generation:  # rows were deleted (calm forget, a re-scan)
            self._recent_cache.clear()
            self._recent_generation = generation
        cached = self._recent_cache.get(session)
        if cached is None:
            assert self.history is not None
            rows = recent_context(self.history, session or None, self.history_context)
            cached = [{"cmd": r.cmd, "exit": r.exit} for r in rows]
            if len(self._recent_cache) > 256:
                self._recent_cache.clear()
            self._recent_cache[session] = cached
        return cached

    # -- background training ----------------------------------------------------------------------

    def training_wait(self) -> dict[str, Any]:
        """Whether an automatic run is due, and if it is, what it waits for: `pending` new commands
        against `threshold`, the 1-minute load average per core against `max_load_per_core`, and
        `waiting` (words for `status`) while a due run does not start."""
        assert self.history is not None
        pending = self.history.counter("recorded_since_train")
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
        due = bool(self.train_threshold) and pending >= self.train_threshold
        waiting: str | None = None
        if due and self.hold_training is not None:
            waiting = self.hold_training
        elif due and per_core >= self.train_max_load:
            waiting = f"load {per_core:.2f} per core, waiting for < {_limit(self.train_max_load)}"
        return {"pending": pending, "due": due, "waiting": waiting, "load_per_core": round(per_core, 3),
                "max_load_per_core": self.train_max_load}  # fmt: skip

    def _training_due(self) -> bool:
        """Enough new commands since the last run, and a machine that is not busy (per core: a
        load of 1.6 is a busy 1-core machine and a quiet 4-core one)."""
        plan = self.training_wait()
        return bool(plan["due"]) and plan["waiting"] is None

    async def check_training(self, why: str) -> dict[str, Any]:
        """The automatic trigger (at start, after the first-start import, on the timer, on each
        record): a run when `_training_due`, decided and started in one step by the trainer, so
        that any number of triggers at once start one run."""
        if not self.train_threshold or self.trainer.busy:
            return {"ok": True, "started": False, "reason": "not due"}
        return await self.start_training(why, wanted=self._training_due)

    async def start_training(self, why: str, wanted: Callable[[], bool] | None = None) -> dict[str, Any]:
        """A background run (calmd/daemon/trainer.py), when `wanted()` says it is due (decided
        and started in one step there); the count of new commands restarts with it."""
        result = await self.trainer.start(why, wanted)
        if result.get("started"):
            assert self.history is not None
            try:
                self.history.reset_counter("recorded_since_train")
            except Exception as exc:  # a full disk: the run reports it; the count restarts later
                log.warning("could not reset the count of new commands: %s", exc)
        return result

    # -- complete --------------------------------------------------------------------------------

    def _note_request(self, request: CompleteRequest, ctx: dict[str, Any]) -> None:
        """Remember what the session's next line will be asked with (for the prefetch), and stop
        the session's prefetch: the request does not wait for it. What it finished stays in the
        engine's caches: the new context's prefill (when the request has that context), and the
        whole empty-prompt answer when it had time to finish it (measured: waiting for a running
        prefetch delays the first candidate until its last, bench/prefetch.py --think 0)."""
        if request.history_given:  # the client's own history: the daemon cannot guess the next
            self._last_request.pop(request.session, None)
        else:
            fields = {k: v for k, v in ctx.items() if k not in ("input", "history")}
            self._last_request[request.session] = (fields, request.n)
            if len(self._last_request) > 256:
                self._last_request.pop(next(iter(self._last_request)))
        pending = self._prefetch.pop(request.session, None)
        if pending is not None:  # what it prepared so far stays in the engine's caches
            self.scheduler.cancel(pending)

    async def complete(self, request: CompleteRequest, conn: Connection) -> None:
        self.gate.begin()
        try:
            await self._complete(request, conn)
        finally:
            self.gate.end()

    async def _complete(self, request: CompleteRequest, conn: Connection) -> None:
        start = time.perf_counter()
        engine = self.engine
        if engine is None:  # the server loads a model before it accepts: a bug, answered `internal`
            raise RuntimeError("no model is loaded")
        ctx = dict(request.ctx)
        if request.multiline:  # the engine ranks (and picks the ghost) among what may be sent
            ctx["multiline"] = True
        if not request.history_given and self.history is not None:
            ctx["history"] = self.recent_history(request.session)
        if request.path is not None:
            self.comp.set_path(request.session, request.path)
        if request.session:
            self._note_request(request, ctx)
        loop = asyncio.get_running_loop()
        first: list[float] = []  # when the first line went out (early or candidate)
        early_sent: list[bool] = []
        answer = Answer(context_key(ctx, self.answers.version), str(ctx.get("input", "")))
        drawn = request.drawn
        if request.early and request.n > 0:  # the line's first key: from the last answer, at once
            line = self.answers.pick(request.session, answer, request.min_confidence, engine)
            if line is not None and line.text != drawn and self._terminal_safe(line.text, request):
                early_sent.append(True)
                first.append((time.perf_counter() - start) * 1e3)
                self.answers.sent += 1
                drawn = line.text  # the engine keeps it unless it has a clearly better line
                said = {"early": line.text, "confidence": round(line.confidence, 3), "ghost": True}
                conn.send(reply(request.id, **said))

        def emit(
            attempt: int, candidate: str, score: float, confidence: float, ghost: bool, draw: str | None
        ) -> None:
            if not self._terminal_safe(candidate, request):
                return
            if not job.deliver(attempt):  # that attempt was preempted; a later one sends it
                return
            if not first:
                first.append((time.perf_counter() - start) * 1e3)
            # `draw`: only the line's likely head is drawn (calmd/suggest/ghost.py), a prefix of it
            head = ghost and draw and draw != candidate and candidate.startswith(draw)
            conn.send(reply(request.id, candidate=candidate, score=round(score, 4),
                            confidence=round(min(1.0, max(0.0, confidence)), 3), ghost=ghost,
                            **({"draw": draw} if head else {})))  # fmt: skip

        def emit_early(attempt: int, candidate: str, confidence: float, ghost: bool) -> None:
            # At most one per request: a preempted attempt's is dropped unless it went out, and
            # the rerun's is dropped if it did. It does not count as delivered, so the job can
            # still be preempted (the early proposal comes from the history alone).
            if early_sent or attempt != job.attempt or job.cancelled.is_set():
                return
            if not self._terminal_safe(candidate, request):
                return
            early_sent.append(True)
            if not first:
                first.append((time.perf_counter() - start) * 1e3)
            conn.send(reply(request.id, early=candidate, confidence=round(min(1.0, max(0.0, confidence)), 3),
                            ghost=ghost))  # fmt: skip

        def work(cancelled: threading.Event, attempt: int) -> bool:
            if cancelled.is_set():
                return False
            # COMP and ENV (calmd/daemon/comp_state.py): here, off the event loop, bounded in time. A
            # failure there costs the keystroke its COMP, never its answer.
            try:
                self.comp.fill(ctx, request.session, getattr(engine, "followers", None))
            except Exception:
                log.exception("the COMP frame could not be built; answering without it")

            def on_early(candidate: str, confidence: float, ghost: bool) -> None:
                if not cancelled.is_set():
                    loop.call_soon_threadsafe(emit_early, attempt, candidate, confidence, bool(ghost))

            answer.lines.clear()  # (a preempted attempt's)
            for suggestion in engine.complete(
                ctx, request.n, request.session, cancelled, on_early if request.early else None,
                min_confidence=request.min_confidence, drawn=drawn,
            ):  # fmt: skip
                if cancelled.is_set():
                    return False
                candidate, score, confidence, ghost = suggestion[:4]
                draw = getattr(suggestion, "draw", None)  # Suggestion.draw (a test's engine sends tuples)
                loop.call_soon_threadsafe(emit, attempt, candidate, score, confidence, bool(ghost), draw)
                if sendable(str(candidate), multiline=request.multiline):
                    answer.lines.append(_line(suggestion))
            if request.keys and not answer.typed and request.session:

                def send(key: str, line: Line) -> None:
                    loop.call_soon_threadsafe(emit_key, attempt, key, line)

                self.answers.send_keys(request.session, answer, ctx, engine, request.min_confidence, send,
                                       cancelled)  # fmt: skip
            return not cancelled.is_set()

        keyed: list[bool] = []

        def emit_key(attempt: int, key: str, line: Line) -> None:
            if (
                attempt != job.attempt
                or job.cancelled.is_set()
                or not self._terminal_safe(line.text, request)
            ):
                return
            keyed.append(True)
            conn.send(reply(request.id, key=key, line=line.text, confidence=round(line.confidence, 3)))

        job = Job(owner=conn, session=request.session, run=work)
        if request.n == 0:
            if request.session:  # still the session's newest request: the older one is moot
                self.scheduler.cancel_session(request.session)
            finished = True
        else:
            finished = await self.scheduler.submit(job)
        await asyncio.sleep(0)  # let the emits scheduled by the worker run before `done`
        ms = (time.perf_counter() - start) * 1e3
        if finished:
            self.done_ms.add(ms)
            if first:
                self.first_ms.add(first[0])
            self.answers.keep_and_prepare(request.session, answer, ctx, engine)
            self.answers.keyed += bool(keyed)
            conn.send(reply(request.id, done=True, ms=round(ms, 3)))
        else:
            conn.send(reply(request.id, done=True, cancelled=True, ms=round(ms, 3)))

    def _terminal_safe(self, candidate: str, request: CompleteRequest) -> bool:
        """The last gate before a candidate leaves: nothing that drives a terminal and nothing over
        4 KiB, whatever the engine proposed (calmd/suggest/filters.py `sendable`); a multi-line entry
        only for a client that draws it as lines. What it holds back is counted, never logged (it
        is the user's history)."""
        if sendable(candidate, multiline=request.multiline):
            return True
        self.withheld += 1
        return False

    # -- status ----------------------------------------------------------------------------------

    def latency_status(self) -> dict[str, float | None]:
        """The last 2,000 keystrokes, request to the first line out (`first`: the early line or
        the first candidate, what a shell draws) and to `done`, in the daemon (the socket's and
        the shell's time not counted)."""
        return {f"{what}_p{q}": stats.percentile(q) for what, stats in (("first", self.first_ms),
                ("done", self.done_ms)) for q in (50, 90, 99)}  # fmt: skip


def _limit(value: float) -> str:
    """A configured limit as the user would write it: 1.0, 0.75."""
    return f"{value:.1f}" if round(value, 1) == value else f"{value:g}"


def _line(suggestion: Suggestion) -> Line:
    """An engine's suggestion as a line of an answer kept (calmd/daemon/answers.py)."""
    candidate, _score, confidence, ghost = suggestion[:4]
    draw = getattr(suggestion, "draw", None)
    head = ghost and draw and draw != candidate and str(candidate).startswith(draw)
    return Line(str(candidate), float(confidence), bool(ghost), draw if head else None)
