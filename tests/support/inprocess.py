"""The daemon's transport and service in this process, over a fake socket: protocol faults tested
in milliseconds (tests/daemon/test_transport.py). The real daemon keeps its own end-to-end tests
(tests/daemon/test_faults_protocol.py, tests/daemon/test_daemon.py).

`Harness` builds what `Server` builds (a `Listener`, a `Service` with the scripted engine of
tests/support/scripted_engine.py, a history store in a temporary folder, the fair scheduler and its
worker thread) but no socket: each client is a `Connection` on a `FakeTransport` that keeps what
is written and what the connection asked of it (pause or resume reading, close).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import msgpack

from calmd import paths
from calmd.daemon.scheduler import FairScheduler
from calmd.daemon.service import Service
from calmd.daemon.trainer import Trainer
from calmd.daemon.transport import Connection, Listener
from calmd.history.store import HistoryStore
from calmd.protocol import PROTOCOL_VERSION
from tests.support.daemon import write_test_weights
from tests.support.scripted_engine import ScriptedEngine
from tests.support.waiting import HANG_S


class FakeTransport:
    """What `Connection` needs of an asyncio transport, recorded."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = False
        self.aborted = False
        self.pauses = 0
        self.unread = 0  # what get_write_buffer_size reports

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def get_write_buffer_size(self) -> int:
        return self.unread


class Client:
    """One connection of the harness: bytes in, decoded replies out."""

    def __init__(self, listener: Listener) -> None:
        self.transport = FakeTransport()
        self.conn = Connection(listener)
        listener.connections.add(self.conn)
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self._taken = 0

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def replies(self) -> list[dict[str, Any]]:
        """Every reply written since the last call."""
        self._unpacker.feed(bytes(self.transport.written[self._taken :]))
        self._taken = len(self.transport.written)
        out = list(self._unpacker)
        for message in out:
            assert message.get("protocol") == PROTOCOL_VERSION, message
        return out


class _Control:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.shutdowns = 0

    def status(self) -> dict[str, Any]:
        h = self.harness
        assert h.store is not None
        return {"protocol": PROTOCOL_VERSION, "requests": h.listener.requests, "errors": h.listener.errors,
                "history": {"commands": h.store.count()}}  # fmt: skip

    async def reload(self) -> dict[str, Any]:
        return {"ok": True}

    def shutdown(self) -> None:
        self.shutdowns += 1


class Harness:
    """`async with Harness(tmp_path) as h`: h.client() gives connections; h.settle() runs the loop
    until every request in flight is answered."""

    def __init__(self, home: Path, *, reply_timeout_s: float = 10.0) -> None:
        self.home = home
        self.reply_timeout_s = reply_timeout_s
        self.store: HistoryStore | None = None

    async def __aenter__(self) -> Harness:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.scheduler = FairScheduler(self.pool)
        self._scheduler_task = asyncio.ensure_future(self.scheduler.run())
        self.control = _Control(self)
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(data, data / paths.WEIGHTS, (), self.control.reload)
        self.service = Service(self.control, self.scheduler, trainer, history_context=5, train_threshold=0,
                               train_max_load=1.0, prefetch=False)  # fmt: skip
        self.store = HistoryStore(data / paths.HISTORY)
        self.service.history = self.store
        engine = ScriptedEngine(write_test_weights(data / paths.WEIGHTS))
        engine.attach_history(self.store)
        self.service.engine = engine
        self.listener = Listener(self.service, max_connections=8, reply_timeout_s=self.reply_timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.listener.close_all()
        self._scheduler_task.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.service.disk.close()
        if self.store is not None:
            self.store.close()

    def client(self) -> Client:
        return Client(self.listener)

    async def settle(self, timeout: float = HANG_S) -> None:
        """Until no request is in flight (and the replies they scheduled are written)."""
        deadline = asyncio.get_running_loop().time() + timeout
        await asyncio.sleep(0)
        while self.listener.inflight:
            assert asyncio.get_running_loop().time() < deadline, "requests still in flight"
            await asyncio.wait(set(self.listener.inflight), timeout=0.5)
        for _ in range(3):
            await asyncio.sleep(0)
