"""The keystrokes in flight, for the daemon's background threads to step aside.

Python runs one thread at a time (the GIL): a thread that reads rows in a loop (the history search
index catching up with an import, calmd/daemon/search.py) gives the interpreter up only when forced,
every 5 ms, and the model's worker thread, which gives it up at each call into the fused kernel,
waits up to as long to get it back: a keystroke of 20 such calls took several times its time
(issue 42). So those loops call `pause()` between two small slices: while a keystroke is answered
they wait (without the GIL) until it is, or for PAUSE_CEILING_S at most, so that a client asking
without a pause (a flood) slows them down without stopping them.
"""

from __future__ import annotations

import threading

PAUSE_CEILING_S = 0.25  # the longest a background slice waits for the keystrokes to end


class KeystrokeGate:
    """`begin`/`end` around each keystroke's answer, on the event loop; `pause` on any thread."""

    def __init__(self) -> None:
        self._active = 0  # changed on the event loop only
        self._quiet = threading.Event()
        self._quiet.set()
        self.pauses = 0  # times a background slice stepped aside (status)

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
        if self._active <= 0:
            self._active = 0
            self._quiet.set()

    def pause(self, ceiling: float = PAUSE_CEILING_S) -> None:
        """Wait while a keystroke is answered (at most `ceiling` s); at once when none is."""
        if not self._quiet.is_set():
            self.pauses += 1
            self._quiet.wait(ceiling)
