"""The keystroke gate (calmd/daemon/gate.py): the history index's catch-up takes its slices in the
gaps the typing leaves: right after a keystroke's answer, or once the typing stopped, never while
a keystroke is answered."""

from __future__ import annotations

import asyncio
import time

import pytest

from calmd.daemon import gate as gate_module
from calmd.daemon.gate import KeystrokeGate

SOON_S = 0.05  # long enough for a task that can go on to do so


async def settled(task: asyncio.Task[None]) -> bool:
    """Whether `task` is over after the loop ran a moment."""
    await asyncio.sleep(SOON_S)
    return task.done()


def test_a_slice_starts_at_once_when_nobody_types_or_a_key_was_just_answered() -> None:
    async def scenario() -> None:
        gate = KeystrokeGate()
        await asyncio.wait_for(gate.between_keys(), 5)  # never a keystroke
        gate.begin()
        gate.end()
        await asyncio.wait_for(gate.between_keys(), 5)  # the moment after an answer

    asyncio.run(scenario())


def test_a_slice_waits_while_a_key_is_answered_and_in_the_middle_of_the_typing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gate_module, "TYPING_STOPPED_S", 60.0)  # the typing goes on for the test
    monkeypatch.setattr(gate_module, "GAP_CEILING_S", 60.0)

    async def scenario() -> None:
        gate = KeystrokeGate()
        gate.begin()
        task = asyncio.ensure_future(gate.between_keys())
        assert not await settled(task)  # a keystroke is answered: no slice beside it
        gate.end()
        await asyncio.wait_for(task, 5)  # its answer ended: the gap after it is the slice's
        gate.last_end = time.monotonic() - 0.5 * gate_module.TYPING_STOPPED_S  # half-way to the next key
        task = asyncio.ensure_future(gate.between_keys())
        assert not await settled(task)
        gate.begin()
        assert not await settled(task)
        gate.end()  # the next key's answer
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_slice_goes_on_once_the_typing_stopped_or_a_key_is_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_module, "TYPING_STOPPED_S", 0.2)
    monkeypatch.setattr(gate_module, "GAP_CEILING_S", 0.4)

    async def scenario() -> None:
        gate = KeystrokeGate()
        gate.begin()
        gate.end()
        gate.last_end -= 2 * gate_module.AFTER_KEY_S  # past the gap right after it
        await asyncio.wait_for(gate.between_keys(), 5)  # no key for TYPING_STOPPED_S: the typing stopped
        assert time.monotonic() - gate.last_end >= gate_module.TYPING_STOPPED_S
        gate.begin()  # a keystroke that never ends (a hung client is cut off later): not forever
        await asyncio.wait_for(gate.between_keys(), 5)

    asyncio.run(scenario())
