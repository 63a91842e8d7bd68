"""The history index caught up with the store in slices between keystrokes (issue 42,
calmd/suggest/index_catch_up.py): what a keystroke reads, what a slice reads, the index built aside
when an import brought more than it holds, and a forget."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace

import pytest

from calmd.daemon.catch_up import CatchUp
from calmd.daemon.scheduler import FairScheduler
from calmd.history.store import HistoryStore
from calmd.suggest import index_catch_up
from calmd.suggest.index_catch_up import BURST_ROWS, KEYSTROKE_ROWS, IndexCatchUp, keystroke_sync
from calmd.suggest.ranking import HistoryIndex


def bulk(store: HistoryStore, commands: list[str], session: str = "s") -> None:
    """Rows as an import or a sync writes them: many at once, behind the index's back."""
    with store.writing() as db:
        db.executemany("INSERT INTO commands (ts, session, cmd, exit) VALUES (?, ?, ?, 0)",
                       [(1000.0 + i, session, cmd) for i, cmd in enumerate(commands)])  # fmt: skip


def fresh(store: HistoryStore) -> HistoryIndex:
    index = HistoryIndex()
    index.sync(store)
    return index


def never() -> bool:
    return False


def test_a_keystroke_reads_a_bounded_share_once_the_catch_up_runs(store: HistoryStore) -> None:
    index = HistoryIndex()
    assert keystroke_sync(index, store) == 0
    bulk(store, [f"make target{i}" for i in range(1000)])
    # an index nothing catches up (an engine in process: `calm replay`, the benches) reads as before
    assert keystroke_sync(index, store) == 1000
    bulk(store, [f"echo {i}" for i in range(1000)])
    catch_up = IndexCatchUp()
    assert catch_up.step(index, store, lambda: True) is False  # one slice: it registers the index
    read = [keystroke_sync(index, store) for _ in range(3)]
    assert read == [KEYSTROKE_ROWS] * 3  # a burst of the shells' records: a share a key, the rest the slices'
    bulk(store, [f"echo {i}" for i in range(BURST_ROWS + 1)], session="import")
    assert keystroke_sync(index, store) == 0  # an import's rows: the slices' alone
    while not catch_up.step(index, store, never):
        pass
    store.record("git push", session="s")
    store.record("git pull", session="t")
    assert keystroke_sync(index, store) == 2  # what the shells recorded since the last key
    assert index.commands[-2:] == ["git push", "git pull"] and len(index) == 3003


def test_slices_stop_when_told_and_end_where_a_full_read_ends(store: HistoryStore) -> None:
    bulk(store, [f"make target{i % 37}" for i in range(500)])
    index = fresh(store)
    bulk(store, [f"kubectl get pods -n ns{i % 11}" for i in range(3000)], session="other")
    catch_up = IndexCatchUp()
    looks = iter(range(10**6))
    slices = 0
    while not catch_up.step(index, store, lambda: next(looks) % 5 == 4):  # yields every 5th look
        slices += 1
    assert slices > 5
    whole = fresh(store)
    assert index.commands == whole.commands and index.last_id == whole.last_id
    assert index.count == whole.count and index.follows == whole.follows


def test_an_import_larger_than_the_index_is_built_aside_and_adopted_at_once(
    store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_catch_up, "INDEX_LIMIT", 300)
    bulk(store, ["git status", "git commit -m wip", "make test"] * 20)
    index = HistoryIndex()
    index.sync(store, limit=300)
    known = index.vocabulary.known  # what the engine's COMP followers hold
    before = list(index.commands)
    bulk(store, [f"docker run image{i}" for i in range(1000)])
    catch_up = IndexCatchUp()
    assert catch_up.step(index, store, lambda: True) is False  # a slice of the build aside
    assert catch_up.aside is not None and index.commands == before  # the old index serves meanwhile
    assert keystroke_sync(index, store) == 0  # nor does a keystroke start it over
    while not catch_up.step(index, store, never):
        pass
    assert catch_up.rebuilt == 1 and catch_up.aside is None
    assert len(index) == 300 and index.commands[-1] == "docker run image999"
    assert "git status" not in index.count  # the newest 300 only
    assert index.vocabulary.known is known and "docker" in known


def test_a_forget_starts_the_index_over_at_once(store: HistoryStore) -> None:
    bulk(store, ["git status", "curl http://intranet/secret-page"] * 50)
    index = fresh(store)
    IndexCatchUp().step(index, store, never)
    store.forget_command("curl http://intranet/secret-page")
    keystroke_sync(index, store)  # the keystroke after the forget
    assert "curl http://intranet/secret-page" not in index.count
    assert IndexCatchUp().step(index, store, never)
    assert index.count["git status"] == 50


def test_the_daemons_catch_up_follows_the_index_before_the_first_keystroke(store: HistoryStore) -> None:
    """From the daemon's start on (CatchUp.start, before `ready`), not from the first slice: a
    keystroke answered before it read up to ALONE_ROWS while the first-start import wrote."""
    bulk(store, ["git status", "make test"])
    index = fresh(store)
    bulk(store, [f"echo {i}" for i in range(BURST_ROWS + 1)])  # an import's first batch

    async def started() -> int:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            engine = SimpleNamespace(index=index, history=store)
            catch_up = CatchUp(FairScheduler(pool), SimpleNamespace(engine=engine, search=None))
            catch_up.start()  # no slice has run: the scheduler does not even run
            try:
                return keystroke_sync(index, store)
            finally:
                catch_up.stop()

    assert asyncio.run(started()) == 0  # the slices', not the keystroke's
