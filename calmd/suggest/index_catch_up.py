"""The history index (calmd/suggest/ranking.py `HistoryIndex`) kept up with the store without a
keystroke waiting for it.

A keystroke used to read up to 5,000 of the store's new rows into the index (KEYSTROKE_SYNC_ROWS of
calmd/suggest/engine.py): while an import or a sync added thousands of rows a second, every
keystroke paid 50 ms for them, more on a busy machine (2.3 s seen after a 100,000-record sync
import, when the index started over from the newest 50,000 inside a keystroke). Now the work is
split in two:

- `keystroke_sync`, on the keystroke's path: at most KEYSTROKE_ROWS new rows (the commands the
  shells recorded since the last keystroke: one or two), none when more than BURST_ROWS came (an
  import, a sync), and never a start over because an import added more than the index holds (the
  old index serves until the new one is complete); an index
  nothing catches up in the background (`calm replay`, the benches: an engine in process) reads
  up to ALONE_ROWS a keystroke, as before;
- `IndexCatchUp.step`, the rest, in slices the daemon runs between keystrokes
  (calmd/daemon/catch_up.py: each slice a background job on the thread the index is confined to,
  stopped by the next keystroke and taken up after it). When more rows came than the index holds,
  the new index is built aside, from the newest INDEX_LIMIT, and takes the old one's place in one
  step once complete.

Rows deleted from the store (a new generation: `calm forget`) still start the index over at once,
on the keystroke's path as before (HistoryIndex.sync): what was forgotten is never proposed
again, not even for the seconds a rebuild aside would take; the slices then fill it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from calmd.history.store import HistoryRow, HistoryStore
from calmd.suggest.ranking import INDEX_LIMIT, HistoryIndex

KEYSTROKE_ROWS = 64  # new rows a keystroke reads at most (0.5-3 ms); the slices read the rest
BURST_ROWS = 1_000  # more new rows than this came from an import or a sync: none read by a keystroke
SLICE_ROWS = 64  # rows between two looks at the clock and at the next keystroke
ALONE_ROWS = 5_000  # a keystroke's rows when nothing catches up between keystrokes (issue 30's bound)
# the indexes a daemon catches up between keystrokes, and by what (`IndexCatchUp.step` registers them)
_IN_BACKGROUND: weakref.WeakKeyDictionary[HistoryIndex, IndexCatchUp] = weakref.WeakKeyDictionary()


def keystroke_sync(index: HistoryIndex, store: HistoryStore) -> int:
    """A keystroke's share of the catch-up: the store's new rows, at most KEYSTROKE_ROWS, in
    order; none when more than BURST_ROWS came (the slices read them; when more than the index
    holds, the index built aside replaces it). Caught up, it costs two indexed lookups (the
    generation, the newest row). Without a catch-up in the background, up to ALONE_ROWS
    (HistoryIndex.sync, as before)."""
    catch_up = _IN_BACKGROUND.get(index)
    if catch_up is None:
        return index.sync(store, budget=ALONE_ROWS)
    if catch_up.aside is not None and store.generation() == getattr(index, "_generation", None):
        return 0  # an import brought more than it holds: the index built aside replaces it
    if not index.last_id or store.generation() != getattr(index, "_generation", None):
        return index.sync(store, budget=KEYSTROKE_ROWS)  # a first read, or rows deleted: it starts over
    newest = store.newest_after(0)
    if newest <= index.last_id:
        return 0
    if newest - index.last_id > BURST_ROWS:
        # More came than the shells record in a burst (an import, a sync: batches of 2,000): the
        # slices read them, oldest first, so the keystroke's share would not reach the newest
        # either; its reads and the count of what came (an OFFSET of INDEX_LIMIT rows, 4-14 ms)
        # cost each key 1.5x while a first-start import ran (bench/heavy_jobs.py). Row ids only
        # grow: the gap in ids bounds the rows. (A burst of the shells' records, a few hundred, is
        # read a share a key as before: the next keystrokes see them.)
        return 0
    added = 0
    for row in store.all_rows(after=index.last_id, until=newest, batch=KEYSTROKE_ROWS):
        add_row(index, row)
        added += 1
        if added == KEYSTROKE_ROWS:
            break
    return added


def warm_sync(index: HistoryIndex, store: HistoryStore) -> int:
    """An engine's warm-up: the whole store's newest rows when nothing catches up in the
    background (a daemon's start, before `ready`); a keystroke's share when something does (a hot
    reload, beside the keystrokes)."""
    if index in _IN_BACKGROUND:
        return keystroke_sync(index, store)
    return index.sync(store)


def add_row(index: HistoryIndex, row: HistoryRow) -> None:
    """One stored row into `index`, as HistoryIndex.sync adds it."""
    index.add(row.cmd, row.session, row.exit, row.ts, row.cwd, row.git, remote=bool(row.host))
    index.last_id = row.id


def adopt(live: HistoryIndex, fresh: HistoryIndex) -> None:
    """`fresh`'s contents into `live`, in one step on the index's thread: the engines that share
    `live` (calmd/suggest/engine.py `history_index`) see the new index at their next keystroke.
    The user's vocabulary's mapping stays the same object, refilled: the engine's COMP followers
    (calmd/suggest/frames.py VocabularyFollowers) hold it."""
    known = live.vocabulary.known
    known.clear()
    known.update(fresh.vocabulary.known)
    fresh.vocabulary.known = known
    live.__dict__.clear()
    live.__dict__.update(fresh.__dict__)


class IndexCatchUp:
    """The catch-up's state between slices: the index being built aside, when there is one. Used
    from the index's thread only."""

    def __init__(self) -> None:
        self.aside: HistoryIndex | None = None
        self._aside_until = 0  # the newest row there was when the build aside began
        self.rebuilt = 0  # indexes built aside and adopted
        self.rows = 0  # rows read by the slices

    def follow(self, index: HistoryIndex) -> None:
        """From now on, `index` is caught up here: a keystroke reads at most KEYSTROKE_ROWS. Said
        before the first keystroke is answered (the daemon's start): until the first step, a
        keystroke read up to ALONE_ROWS while the first-start import wrote, 60-100 ms each."""
        _IN_BACKGROUND[index] = self

    def step(self, index: HistoryIndex, store: HistoryStore, stop: Callable[[], bool]) -> bool:
        """Read on until `stop()` (looked at every SLICE_ROWS rows) says to yield; True when the
        index holds every row the store had when the step began."""
        self.follow(index)
        generation = store.generation()
        if generation != getattr(index, "_generation", None):
            self.aside = None
            self.rows += index.sync(store, budget=SLICE_ROWS)  # rows were deleted: it starts over
            if stop():
                return False
        newest = store.newest_after(0)
        while True:
            if self.aside is None and index.last_id and store.more_after(index.last_id, INDEX_LIMIT):
                fresh = HistoryIndex(index.prior)
                fresh.last_id = store.newest_after(INDEX_LIMIT)
                fresh._generation = generation  # as HistoryIndex.sync sets it
                self.aside, self._aside_until = fresh, max(newest, store.newest_after(0))
            aside = self.aside
            if aside is not None:
                if not self._read(aside, store, self._aside_until, stop):
                    return False
                adopt(index, aside)
                self.aside = None
                self.rebuilt += 1
                continue  # more than the index holds may have come meanwhile
            if not index.last_id and not len(index):  # a first read starts at the newest INDEX_LIMIT
                index.last_id = store.newest_after(INDEX_LIMIT)
            return self._read(index, store, newest, stop)

    def _read(self, index: HistoryIndex, store: HistoryStore, newest: int, stop: Callable[[], bool]) -> bool:
        """The rows after the index's last, up to `newest`; False when `stop()` cut it short."""
        for n, row in enumerate(store.all_rows(after=index.last_id, until=newest, batch=SLICE_ROWS), 1):
            add_row(index, row)
            self.rows += 1
            if n % SLICE_ROWS == 0 and stop():
                return False
        return True


def until(seconds: float, cancelled: Callable[[], bool]) -> Callable[[], bool]:
    """A `stop` for `IndexCatchUp.step`: after `seconds`, or as soon as `cancelled()`."""
    deadline = time.perf_counter() + seconds
    return lambda: cancelled() or time.perf_counter() > deadline
