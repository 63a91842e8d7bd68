"""What every bench shares: one daemon starter, one A/B runner, one report format.

- `daemon(...)`: `calmd serve` started by tests/support/daemon.py's `running_daemon` (the tests' own: ready
  on the daemon's `ready` line, stopped with SIGTERM) in a scratch HOME, with the packaged model
  (or the weights given) and `--no-import`; this tree's, or another checkout's (`tree=`).
- `release(rev)`: an older release beside this one: `git archive REV` of this repository in a
  scratch folder, or a folder given (a checkout, `git worktree add`).
- `alternate(systems, steps)`: every step measured on each system in turn, the order reversed at
  every step, so that all see the same machine at the same moments: on a shared machine the
  ratios of one run mean something, the absolute figures less.
- `Report`: one format for what a bench prints: its title, the machine (load average, highest
  seen, and cores; this tree's commit), tables of percentiles per system, the ratios against
  the first system, and free lines for the rest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/NAME.py`: tests/ and bench/ as packages
    sys.path.insert(0, str(ROOT))

from calmd import paths  # noqa: E402
from tests.support.daemon import Daemon, running_daemon  # noqa: E402

T = TypeVar("T")


# --------------------------------------------------------------------------- daemons


@contextlib.contextmanager
def scratch(prefix: str = "calmd-bench-") -> Iterator[Path]:
    """A scratch folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def daemon(
    *,
    tree: Path | None = None,
    weights: Path | None = None,
    args: Sequence[str] = ("--no-import",),
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    home: Path | None = None,
    engine: str = "model",
) -> Iterator[Daemon]:
    """`calmd serve` ready in a scratch HOME (or `home`), stopped afterwards. weights: copied in as
    the user's model; none: the model the tree packaged. tree: another checkout's daemon.
    command: a program that serves in its place (a bench's variant of the engine)."""
    with contextlib.ExitStack() as stack:
        if home is None:
            home = stack.enter_context(scratch())
        if weights is not None:
            (home / "data").mkdir(mode=0o700, parents=True, exist_ok=True)
            shutil.copy(weights, home / "data" / paths.WEIGHTS)
        serve = tuple(command) if command else None
        started = running_daemon(home, engine=engine, args=tuple(args), env=env, weights=False, tree=tree,
                                 command=serve)  # fmt: skip
        yield stack.enter_context(started)


@contextlib.contextmanager
def release(rev_or_folder: str | Path) -> Iterator[Path]:
    """An older release's tree: a folder given as it is, else `git archive REV` of this repository
    (its packaged model included) in a scratch folder, removed afterwards."""
    folder = Path(rev_or_folder)
    if folder.is_dir():
        yield folder.resolve()
        return
    with scratch(f"calmd-{rev_or_folder}-") as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", str(rev_or_folder)],
                                 capture_output=True, check=False)  # fmt: skip
        if archive.returncode != 0:
            raise SystemExit(
                f"{rev_or_folder}: neither a folder nor a commit: {archive.stderr.decode().strip()}"
            )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        yield tree


def rss_mb(pid: int) -> float:
    """A process's resident memory now, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --------------------------------------------------------------------------- the A/B runner


def alternate(
    systems: dict[str, Callable[[T], Any]], steps: Iterable[T], *, warm_up: Sequence[T] = ()
) -> dict[str, list[Any]]:
    """Each step to every system in turn, the order reversed at every step (neither is always
    first); what each returned, per system, in the steps' order. `warm_up` steps first, not kept
    (a daemon's first context is a whole prefill)."""
    order = list(systems)
    for step in warm_up:
        for name in order:
            systems[name](step)
    results: dict[str, list[Any]] = {name: [] for name in systems}
    for step in steps:
        order.reverse()
        for name in order:
            results[name].append(systems[name](step))
    return results


def timed(work: Callable[[], object]) -> float:
    """Seconds `work` took."""
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- the report


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0.5: the median, 0.9: p90), nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip() or "?"


class Report:
    """What a bench prints, in one format:

        == TITLE
        this tree at 1a2b3c4 · load average up to 1.23 on 2 cores
        (tables: one row per system, n and the quantiles; the first system over each other)
        (free lines)

    Every table and line keeps the highest load average seen so far (the machine is shared:
    figures taken at a load over 1 say so)."""

    def __init__(self, title: str, *, unit: str = "ms") -> None:
        self.title = title
        self.unit = unit
        self.load = os.getloadavg()[0]
        print(f"== {title}", flush=True)

    def _seen(self) -> None:
        self.load = max(self.load, os.getloadavg()[0])

    def machine(self) -> None:
        """The line that dates the figures: this tree's commit, the load, the cores."""
        self._seen()
        print(f"this tree at {commit()} · load average up to {self.load:.2f} on {os.cpu_count()} cores")

    def table(
        self,
        what: str,
        samples: dict[str, Sequence[float]],
        *,
        stats: Sequence[str] = ("p50", "p90"),
        scale: float = 1.0,
        ratios: bool = True,
        unit: str | None = None,
    ) -> dict[str, dict[str, float]]:
        """One row per system: n and `stats` of its samples (times `scale`: 1e3 for seconds shown
        as ms); then the first system's quantiles over each other's. Returns the figures."""
        self._seen()
        figures = {
            name: {stat: pct(values, QUANTILES[stat]) * scale for stat in stats} | {"n": float(len(values))}
            for name, values in samples.items()
            if values
        }
        width = max([len(what), *(len(name) for name in figures)]) + 2
        print(f"\n{what:<{width}}{'n':>6}" + "".join(f"{s:>9}" for s in stats) + f"  ({unit or self.unit})")
        for name, row in figures.items():
            print(
                f"{name:<{width}}{int(row['n']):>6}"
                + "".join(f"{row[s]:>9.{self._digits(row[s])}f}" for s in stats)
            )
        names = list(figures)
        if ratios and len(names) > 1:
            first = names[0]
            for name in names[1:]:
                parts = ", ".join(
                    f"{s} {figures[first][s] / figures[name][s]:.2f}x" for s in stats if figures[name][s]
                )
                print(f"{first} / {name}: {parts}")
        return figures

    def line(self, text: str) -> None:
        """A figure that is no table (a cold start, a memory peak, a goal)."""
        self._seen()
        print(text, flush=True)

    @staticmethod
    def _digits(value: float) -> int:
        return 1 if abs(value) >= 1 else 3


def with_machine_line(main: Callable[[], T]) -> Callable[[], T]:
    """`main` followed by the report's machine line (this tree's commit, the load, the cores): for
    the benches that print their own tables, so that every bench's figures end the same way."""

    def run() -> T:
        load = os.getloadavg()[0]
        result = main()
        load = max(load, os.getloadavg()[0])
        print(f"this tree at {commit()} · load average up to {load:.2f} on {os.cpu_count()} cores")
        return result

    return run


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def packaged_model() -> Path:
    return paths.packaged_weights()
