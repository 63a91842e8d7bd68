"""The history ranker refitted on the user's own commands (calmd/training/ranker_refit.py)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.suggest.ranker import Ranker, packaged_ranker
from calmd.suggest.ranking import FEATURES
from calmd.training.ranker_refit import (
    Example,
    RankerExamples,
    RefitOptions,
    examples_from_store,
    refit_ranker,
)


def rounds(n: int, seed: int = 0) -> list[str]:
    """A user who works through the same eight commands in every round, in a new order each
    time: the next command is one not run yet this round, whatever ran before it. The packaged
    ranker, fitted on users for whom the recent and the usual follower come next, gets it wrong."""
    rng = random.Random(seed)
    names = [f"vim notes{i}.txt" for i in range(4)] + ["make", "ls -la", "git status", "cd src"]
    out: list[str] = []
    for _ in range(n):
        order = names[:]
        rng.shuffle(order)
        out += order
    return out


def top1(ranker: Ranker, examples: list[Example]) -> float:
    return float(np.mean([int(np.argmax(ranker.scores(e.rows))) == e.target for e in examples]))


def examples_of(commands: list[str]) -> list[Example]:
    gathered = RankerExamples(packaged_ranker(), ks=(0,))
    gathered.extend(commands)
    return list(gathered.examples)


def test_the_refit_learns_a_habit_the_packaged_ranker_misses() -> None:
    commands = rounds(100)
    seen, everything = examples_of(commands[:400]), examples_of(commands)
    later = everything[len(seen) :]  # the commands after the ones it was refitted on
    assert len(later) > 300
    base = packaged_ranker()
    refit = refit_ranker(seen, base)
    assert top1(refit, later) > top1(base, later) + 0.05  # measured 27.3% against 18.8%
    assert refit.info["refit"]["examples"] == len(seen)
    # what the refit keeps of the base: the standardisation and the carry-over prior
    assert refit.mean is base.mean and refit.scale is base.scale and refit.prior is base.prior


def test_the_anchor_holds_the_refit_to_the_packaged_weights() -> None:
    seen = examples_of(rounds(50))
    base = packaged_ranker()

    def moved(anchor: float) -> float:
        r = refit_ranker(seen, base, RefitOptions(anchor=anchor))
        return float(np.abs(r.w1 - base.w1).sum() + np.abs(r.w2 - base.w2).sum())

    assert moved(1000.0) < moved(0.5) / 10 < moved(0.001) / 10


def test_too_few_examples_leave_the_packaged_ranker() -> None:
    base = packaged_ranker()
    few = examples_of(rounds(3))
    assert 0 < len(few) < RefitOptions().min_examples
    assert refit_ranker(few, base) is base


def test_examples_see_only_the_past_and_hold_the_users_command() -> None:
    commands = ["ls", "ls -l", "make", "ls -la", "make", "ls -l", "git status", "ls -la"]
    before = RankerExamples(packaged_ranker())
    before.extend(commands[:-1])
    gathered = RankerExamples(packaged_ranker())
    gathered.extend(commands)
    last = list(gathered.examples)[len(before.examples) :]  # the queries for the last `ls -la`
    # k = 0, 1 (`ls`, `ls -l`, `ls -la`), 2 and 4 (`ls -l`, `ls -la`); not 8 (the line is 6
    # characters long)
    assert len(last) == 4
    count, distance = FEATURES.index("log_count"), FEATURES.index("log_distance")
    for e in last:
        assert 0 <= e.target < len(e.rows)
        # it had run once, four commands before: the features do not count the query's own run
        assert e.rows[e.target, count] == pytest.approx(np.log1p(1))
        assert e.rows[e.target, distance] == pytest.approx(np.log1p(3))


def test_only_the_newest_examples_are_kept() -> None:
    gathered = RankerExamples(packaged_ranker(), ks=(0,), limit=5)
    gathered.extend(rounds(10))
    assert len(gathered.examples) == 5


def test_examples_from_the_store_ask_only_the_newest_commands_but_see_them_all(tmp_path: Path) -> None:
    commands = rounds(40)
    store = HistoryStore(tmp_path / paths.HISTORY)
    for cmd in commands:
        store.record(cmd, exit=0, session="s")
    from_store = list(examples_from_store(store, packaged_ranker(), learn=50).examples)
    store.close()
    everything = RankerExamples(packaged_ranker())
    everything.extend(commands[:-50], "s")
    asked_before = len(everything.examples)
    everything.extend(commands[-50:], "s")
    newest = list(everything.examples)[asked_before:]  # the queries of the last 50 commands
    assert len(from_store) == len(newest) > 50
    for got, want in zip(from_store, newest, strict=True):
        # the same features: the 270 older commands counted, though not asked
        assert got.target == want.target and np.array_equal(got.rows, want.rows)
