"""Which past commands a prediction sees: one rule for serving, the replay and the datasets.

The model's HIST frames hold the session's own latest commands, last (next to the prediction);
when the session has run fewer than `HISTORY_FRAMES`, the user's latest commands in other shells
come before them (docs/protocol.md, `complete`). The daemon reads them from the store for each keystroke
(`recent_context`), the replay does the same, and the datasets built from the history
(the background run, `calm dataset`) replay the store in order with `ContextTracker`; all three
end in `context_rows`, so that training sees what serving sees.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from calmd.history.store import HistoryRow, HistoryStore

HISTORY_FRAMES = 5  # past commands in the context (the template caps HIST frames at 15)
MAX_HISTORY_FRAMES = 15  # the template's cap (formats/tokenizer.py MAX_FRAME_ITEMS, which imports numpy)


class _Row(Protocol):
    @property
    def session(self) -> str: ...


R = TypeVar("R", bound=_Row)


def context_rows(own: Sequence[R], others: Sequence[R], frames: int = HISTORY_FRAMES) -> list[R]:
    """The context for a prediction in a session: `own` are the session's commands and `others`
    the other sessions' commands, each oldest first (only their newest are used)."""
    mine = list(own[-frames:]) if frames > 0 else []
    missing = frames - len(mine)
    return (list(others[-missing:]) if missing > 0 else []) + mine


def recent_context(store: HistoryStore, session: str | None, limit: int = HISTORY_FRAMES) -> list[HistoryRow]:
    """The context a prediction in `session` sees, read from the store: its latest commands,
    preceded (when it has fewer than `limit`) by the user's latest other commands; without a
    session, the user's latest `limit` commands."""
    if not session:
        return store.recent(limit=limit)
    own = store.recent(limit=limit, session=session)
    others = store.recent(limit=limit - len(own), session=session, others=True) if len(own) < limit else []
    return context_rows(own, others, limit)


class ContextTracker:
    """`context_rows` for each command of a history replayed oldest first, in constant memory:
    `before(session)` is the context of the next command of `session`, `add(row)` records it."""

    def __init__(self, frames: int = HISTORY_FRAMES) -> None:
        self.frames = frames
        self._own: dict[str, deque[_Row]] = {}
        # The newest `frames` rows of all sessions hold the newest `missing` rows of the others:
        # at most frames - missing of them are the session's own.
        self._everyone: deque[_Row] = deque(maxlen=frames)

    def before(self, session: str) -> list[_Row]:
        own = list(self._own.get(session, ()))
        others = [r for r in self._everyone if r.session != session]
        return context_rows(own, others, self.frames)

    def add(self, row: _Row) -> None:
        self._own.setdefault(row.session, deque(maxlen=self.frames)).append(row)
        self._everyone.append(row)
