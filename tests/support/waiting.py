"""How the tests wait: for an event or a condition, never for a fixed time, under one ceiling that
only a hang reaches.

A busy machine (other builds, two busy loops beside the suite) makes everything slower, a daemon's
start first of all (it imports torch): a ceiling of a few seconds fails there although nothing is
wrong, and a suite that fails when the machine is busy trains everyone to rerun it. So a test
waits for what it needs (the daemon's `ready` line, a row in the store, a line on the screen),
polling where there is no event to block on, and gives up only after HANG_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

HANG_S = 300.0  # what only a hang reaches, on the busiest machine the suite is run on

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    what: str,
    *,
    ceiling: float = HANG_S,
    every: float = 0.01,
    report: Callable[[], str] | None = None,
) -> T:
    """`check()` once it is truthy (returned). Polled after `every` s at first, then less often
    (up to every 0.1 s: a long wait costs little CPU, a short one is seen at once); after `ceiling`
    s an AssertionError naming `what`, with `report()` (a screen, a log) when given."""
    deadline = time.monotonic() + ceiling
    pause = every
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{report()}" if report else ""
            raise AssertionError(f"still waiting after {ceiling:.0f} s for {what}{detail}")
        time.sleep(pause)
        pause = min(pause * 1.5, max(every, 0.1))
