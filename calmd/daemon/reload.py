"""A hot reload beside the keystrokes: new weights (a training run's swap, `calm rollback`,
SIGHUP) or a refitted history ranker, loaded while the old engine serves.

On the model's thread, a reload held the keystrokes for the file's read (0.2-0.4 s on a busy
2-core machine: the network built, the fused step's weights packed, the ranker, calibration and
ghost rule read) and the warm-up's three requests after it (issue 42). Here the file is read on
a thread of its own (the keystrokes share the interpreter with it for those tenths of a second)
and the warm-up is a background job of the scheduler (calmd/daemon/scheduler.py): the next
keystroke stops it at the model's next step, and it runs again after it; stopped WARM_ATTEMPTS
times (a client that never pauses), the engine is installed as warm as it got. The daemon's
start still loads and warms up on the model's thread, before `ready`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calmd.daemon.scheduler import FairScheduler, Job

log = logging.getLogger("calmd")

WARM_ATTEMPTS = 3  # warm-ups a keystroke may stop before the engine is installed without one


async def load_beside(
    path: Path, loader: Callable[[Path], Any], thread: concurrent.futures.Executor, scheduler: FairScheduler,
    attach: Callable[[Any], None],
) -> Any:  # fmt: skip
    """The engine of `path`, read by `loader` on `thread`, attached (`attach`) and warmed up
    between keystrokes."""
    engine = await asyncio.get_running_loop().run_in_executor(thread, loader, path)
    attach(engine)
    warm_up = getattr(engine, "warm_up", None)  # a test's scripted engine has none
    if warm_up is None:
        return engine

    def work(cancelled: threading.Event, attempt: int) -> bool:
        try:
            warm_up(str(Path.home()), cancelled if attempt < WARM_ATTEMPTS else threading.Event())
        except Exception:
            log.exception("the warm-up of %s failed", path)
        return True  # stopped by a keystroke, the scheduler runs it again (job.preempted)

    await scheduler.submit(Job(owner=thread, session="", run=work, background=True))
    return engine
