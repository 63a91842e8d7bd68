"""The daemon's `search` and `forget` ops (calmd/daemon/service.py hands them here): the history
search's index (calmd/suggest/search.py) kept up to date with the store on a thread of its own,
rebuilt in the background after deletions, and a connection's older waiting searches superseded
by its newest."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from calmd.history import query
from calmd.history.store import HistoryStore
from calmd.protocol import SEARCH_CWD_BYTES, SEARCH_LINE_BYTES, ForgetRequest, SearchRequest
from calmd.suggest.filters import terminal_safe
from calmd.suggest.search import Context, SearchIndex

MAX_REPLY_BYTES = 256 << 10  # commands in one reply, at most (a command may be 64 KiB)


class SearchService:
    """The `search` and `forget` ops of calmd/daemon/server.py. The index lives on a thread of its
    own, never the model's: a search never waits for a completion, nor a completion for a
    search. It is built on a second thread (at start, and after rows were deleted) and handed
    over when complete, so that no search waits for a rebuild: meanwhile the old index answers,
    and each line it returns is looked up in the store first (a line `calm forget` deleted is
    never shown). Of several searches a connection has waiting, only the newest is answered (the
    others get `superseded`): typing faster than the search is never a backlog. The builds and the
    refreshes between searches read the store in slices and `pause` between two (the daemon's
    keystrokes go first: calmd/daemon/gate.py); a search reads what is new at once."""

    def __init__(self, store: HistoryStore, pause: Callable[[], None] | None = None) -> None:
        self.store = store
        self.pause = pause
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="calmd-search")
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="calmd-search-build")
        self._index: SearchIndex | None = None  # touched on the search thread only
        self._building: Future[SearchIndex] | None = None
        self._db: sqlite3.Connection | None = None  # the search thread's read-only connection
        self._latest: dict[object, int] = {}  # connection -> id of its newest search
        self._refresh_queued = False
        self.counts = {"searches": 0, "superseded": 0, "forgotten": 0}
        self.last_ms: float | None = None

    # -- the event loop's side ----------------------------------------------------------------------

    def start(self) -> None:
        """Build the index in the background (seconds for 100,000 commands)."""
        self._rebuild()

    def _rebuild(self) -> None:
        """A new index, built on the builder thread and handed over on the search thread as soon
        as it is complete (not only at the next search: `status` says when it is ready)."""
        self._building = building = self._builder.submit(self._build)
        building.add_done_callback(lambda _: self._thread.submit(self._adopt))

    def _adopt(self) -> None:
        building = self._building
        if building is not None and building.done() and building.exception() is None:
            self._index = building.result()
            self._building = None

    async def search(self, request: SearchRequest, history: Sequence[str], owner: object) -> dict[str, Any]:
        self._latest[owner] = request.id
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._search, request, tuple(history), owner)

    async def forget(self, request: ForgetRequest) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._forget, request.cmd)

    def touch(self) -> None:
        """A command was stored: bring the index up to date now, in the background, so that the
        next Ctrl-R does not wait for it."""
        if not self._refresh_queued:
            self._refresh_queued = True
            self._thread.submit(self._refresh)

    def drop(self, owner: object) -> None:
        """A connection closed."""
        self._latest.pop(owner, None)

    def describe(self) -> dict[str, Any]:
        index = self._index
        return {"ready": index is not None, "commands": len(index) if index is not None else 0,
                "distinct": len(index.texts) if index is not None else 0, **self.counts,
                "last_ms": self.last_ms}  # fmt: skip

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._builder.shutdown(wait=False, cancel_futures=True)

    # -- the search thread ----------------------------------------------------------------------

    def _build(self) -> SearchIndex:
        db = query.open_read_only(self.store.path)
        try:
            index = SearchIndex()
            index.sync(db, self.pause)
            if self.pause is not None:
                self.pause()
            index.prepare()
            return index
        finally:
            db.close()

    def _current(self, pause: Callable[[], None] | None = None) -> tuple[SearchIndex, bool]:
        """The index, up to date with the store (read in slices with `pause` between two); and
        whether rows were deleted that a rebuild has not yet left out (its lines must be checked
        against the store)."""
        if self._index is None and self._building is None:  # the last build failed: again
            self._rebuild()
        building = self._building
        if building is not None and (self._index is None or building.done()):
            self._building = None
            self._index = building.result()  # the first one is waited for; a failed one raises
        index = self._index
        assert index is not None, "start() builds the first index"
        if self._db is None:
            self._db = query.open_read_only(self.store.path)
        if query.generation(self._db) != index.generation:
            if self._building is None:
                self._rebuild()
            return index, True
        index.sync(self._db, pause)
        return index, False

    def _refresh(self) -> None:
        self._refresh_queued = False
        index, _ = self._current(self.pause)
        if self.pause is not None:
            self.pause()
        index.prepare()

    def _search(self, request: SearchRequest, history: tuple[str, ...], owner: object) -> dict[str, Any]:
        if self._latest.get(owner, request.id) != request.id:
            self.counts["superseded"] += 1
            return {"results": [], "matches": 0, "superseded": True}
        started = time.perf_counter()
        index, stale = self._current()
        if request.row is not None:
            return self._whole_line(request.row)
        ctx = Context(request.cwd, request.session, history)
        answer = index.search(request.query, request.mode, ctx, request.n)
        results, size = [], 0
        for result in answer.results:
            if stale and not self._stored(result.cmd):
                continue
            item = self._cut(result.to_json())
            size += len(item["cmd"].encode("utf-8", "replace")) + len(item["cwd"].encode("utf-8", "replace"))
            if size > MAX_REPLY_BYTES:
                break
            results.append(item)
        self.counts["searches"] += 1
        self.last_ms = round((time.perf_counter() - started) * 1e3, 3)
        return {"results": results, "matches": answer.matches, "ms": self.last_ms}

    def _cut(self, item: dict[str, Any]) -> dict[str, Any]:
        """A result as the reply carries it: a line over SEARCH_LINE_BYTES cut (at a character's
        end), with `cut` (its whole length in bytes) and `row` (a row of it: a search with `row`
        gives it back whole), a folder over SEARCH_CWD_BYTES kept by its end after `…`. So the
        lines asked for fit in the reply, however long the history's lines are."""
        line = item["cmd"].encode("utf-8", "replace")
        if len(line) > SEARCH_LINE_BYTES:
            assert self._db is not None
            (row,) = self._db.execute("SELECT max(id) FROM commands WHERE cmd = ?", (item["cmd"],)).fetchone()
            item |= {"cmd": line[:SEARCH_LINE_BYTES].decode("utf-8", "ignore"), "cut": len(line), "row": row}
        folder = item["cwd"].encode("utf-8", "replace")
        if len(folder) > SEARCH_CWD_BYTES:
            item["cwd"] = "…" + folder[-(SEARCH_CWD_BYTES - 3) :].decode("utf-8", "ignore")
        return item

    def _whole_line(self, row: int) -> dict[str, Any]:
        """The command of the history's row `row`, whole, when a search could answer it (what the
        store would store today, no control character but a multi-line command's newlines)."""
        assert self._db is not None
        found = self._db.execute("SELECT cmd, ts, cwd, exit FROM commands WHERE id = ?", (row,)).fetchone()
        if found is None or not (query.shown(found[0]) and terminal_safe(found[0].replace("\n", " "))):
            return {"results": [], "matches": 0}
        cmd, ts, cwd, code = found
        return {"results": [{"cmd": cmd, "ts": ts, "cwd": cwd, "exit": code, "runs": 1, "failing": False}],
                "matches": 1}  # fmt: skip

    def _stored(self, cmd: str) -> bool:
        assert self._db is not None
        return self._db.execute("SELECT 1 FROM commands WHERE cmd = ? LIMIT 1", (cmd,)).fetchone() is not None

    def _forget(self, cmd: str) -> dict[str, Any]:
        """Delete every run of `cmd` through the store (`calm forget`'s path), drop it from the
        index at once, and rebuild the index in the background so that its text is gone from
        memory too."""
        forgotten, newest_left = self.store.forget_command(cmd)
        self.counts["forgotten"] += forgotten
        index = self._index
        if index is not None and forgotten:
            index.forget(cmd)
            if self._db is not None and index.generation is not None:
                now = query.generation(self._db)
                if now == index.generation + 1:  # the only deletion since it was read: ours
                    index.generation = now
                    # the deleted rows may have been the newest, whose ids SQLite gives again: the
                    # next command recorded would have been passed over by the index
                    index.last_id = min(index.last_id, newest_left)
            if self._building is None:
                self._rebuild()
        return {"ok": True, "forgotten": forgotten}
