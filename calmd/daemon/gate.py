"""The keystrokes in flight, for the daemon's background threads to step aside.

Python runs one thread at a time (the GIL): a thread that reads rows in a loop (the history search
index catching up with an import, calmd/daemon/search.py) gives the interpreter up only when forced,
every 5 ms, and the model's worker thread, which gives it up at each call into the fused kernel,
waits up to as long to get it back: a keystroke of 20 such calls took several times its time
(issue 42). So those loops call `pause()` between two small slices: while a keystroke is answered
they wait (without the GIL) until it is, or for PAUSE_CEILING_S at most, so that a client asking
without a pause (a flood) slows them down without stopping them.

The history index's catch-up, on the model's own thread, takes its slices in the gaps the typing
leaves (`between_keys`): in the moments right after a keystroke's answer, when the next key is
furthest away, and freely once the typing stopped. A keystroke that came while a slice ran waited
for the slice to look up, then for the interpreter: 1.3-1.5x the p90 of the same keys typed at a
daemon with nothing to catch up, beside an import of 100,000 commands (bench/heavy_jobs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

PAUSE_CEILING_S = 0.25  # the longest a background slice waits for the keystrokes to end
# After a keystroke's answer, a slice may start this long (a slice lasts 8 ms at most: its end
# falls well before the next key of fast typing, 80-100 ms apart, keys included) ...
AFTER_KEY_S = 0.03
# ... and once no key came this long, the typing stopped: slices run back to back.
TYPING_STOPPED_S = 0.25
GAP_CEILING_S = 1.0  # a keystroke in flight longer is stuck: the slices go on beside it


class KeystrokeGate:
    """`begin`/`end` around each keystroke's answer, on the event loop; `pause` on any thread."""

    def __init__(self) -> None:
        self._active = 0  # changed on the event loop only
        self._quiet = threading.Event()
        self._quiet.set()
        self.pauses = 0  # times a background slice stepped aside (status)
        self.last_end = -TYPING_STOPPED_S  # time.monotonic() of the last keystroke's answer
        self._ended: asyncio.Event | None = None  # set at each answer's end (made on the event loop)

    @property
    def busy(self) -> bool:
        return not self._quiet.is_set()

    @property
    def in_flight(self) -> int:
        """Keystrokes being answered now (read on any thread: one int)."""
        return self._active

    def begin(self) -> None:
        self._active += 1
        self._quiet.clear()

    def end(self) -> None:
        self._active -= 1
        self.last_end = time.monotonic()
        if self._active <= 0:
            self._active = 0
            self._quiet.set()
            if self._ended is not None:
                self._ended.set()

    async def between_keys(self) -> None:
        """Until a slice may start (module docstring): no keystroke in flight, and either the last
        one's answer ended at most AFTER_KEY_S ago or none came for TYPING_STOPPED_S. On the event
        loop."""
        if self._ended is None:
            self._ended = asyncio.Event()
        give_up = time.monotonic() + GAP_CEILING_S
        while True:
            now = time.monotonic()
            since = now - self.last_end
            if (not self.busy and (since <= AFTER_KEY_S or since >= TYPING_STOPPED_S)) or now >= give_up:
                return
            self._ended.clear()
            wait = min(TYPING_STOPPED_S - since if not self.busy else TYPING_STOPPED_S, give_up - now)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ended.wait(), max(wait, 0.001))

    def pause(self, ceiling: float = PAUSE_CEILING_S) -> None:
        """Wait while a keystroke is answered (at most `ceiling` s); at once when none is."""
        if not self._quiet.is_set():
            self.pauses += 1
            self._quiet.wait(ceiling)
