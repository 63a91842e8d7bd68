"""The fair scheduler's background jobs (the prefetch after a record): they never hold up a request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from calmd.daemon.scheduler import FairScheduler, Job


def test_a_background_job_stops_for_another_sessions_request_and_runs_again_after() -> None:
    order: list[str] = []
    started = threading.Event()

    def background(cancelled: threading.Event, attempt: int) -> bool:
        order.append(f"prefetch {attempt}")
        started.set()
        if attempt == 0:
            assert cancelled.wait(10), "never preempted"  # a long prefetch: stops when told to
            return False
        return True

    def request(cancelled: threading.Event, attempt: int) -> bool:
        order.append("request")
        return True

    async def main() -> tuple[bool, bool]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            scheduler = FairScheduler(pool)
            runner = asyncio.ensure_future(scheduler.run())
            prefetch = scheduler.submit(Job(owner="daemon", session="", run=background, prepares="a"))
            await asyncio.to_thread(started.wait, 10)
            keystroke = scheduler.submit(Job(owner="shell b", session="b", run=request))
            done = await asyncio.wait_for(asyncio.gather(keystroke, prefetch), 10)
            runner.cancel()
            return done[0], done[1]

    assert asyncio.run(main()) == (True, True)
    assert order == ["prefetch 0", "request", "prefetch 1"]


def test_a_waiting_background_job_goes_after_the_requests() -> None:
    order: list[str] = []
    gate = threading.Event()

    def job(name: str) -> Job:
        def run(cancelled: threading.Event, attempt: int) -> bool:
            if name == "first":
                gate.wait(10)
            order.append(name)
            return True

        return Job(owner=name, session=name, run=run)

    async def main() -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            scheduler = FairScheduler(pool)
            runner = asyncio.ensure_future(scheduler.run())
            first = scheduler.submit(job("first"))  # holds the worker until the others wait
            await asyncio.sleep(0)
            prefetch = scheduler.submit(
                Job(
                    owner="daemon",
                    session="",
                    run=lambda c, a: order.append("prefetch") is None,
                    prepares="x",
                )
            )
            second = scheduler.submit(job("second"))
            gate.set()
            await asyncio.wait_for(asyncio.gather(first, prefetch, second), 10)
            runner.cancel()

    asyncio.run(main())
    assert order == ["first", "second", "prefetch"]
