"""The history ranker's cost per keystroke, with and without carry-over candidates, in one run.

What the daemon does for each keystroke before the model runs (calmd/suggest/engine.py): the pool of
history commands extending the input, their features and the network's scores. The index holds
the newest --commands commands of the public histories of ../shared/data/histories (or a
synthetic history when absent); each query replays a real "previous command, next command" pair
from the newest part, typed to k = 0, 1, 2, 4, 8 characters.

    python bench/ranker_cost.py [--commands 50000] [--queries 300]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from calmd.arguments import Parser, run_tool
from calmd.suggest.ranker import packaged_ranker
from calmd.suggest.ranking import HistoryIndex

HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories" / "users"
KS = (0, 1, 2, 4, 8)


def history(limit: int) -> list[str]:
    from calmd.training.corpus import read_history

    files = sorted(HISTORIES.glob("*.txt")) if HISTORIES.is_dir() else []
    commands = [c for f in files for c in read_history(f)]
    if not commands:  # synthetic: a few habits with changing arguments
        for i in range(limit // 4):
            commands += [f"mkdir dir{i % 500}", f"cd dir{i % 500}", "git status", f"vim file{i % 97}.py"]
    return commands[-limit:]


PROG = "bench/ranker_cost.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=50_000, help="commands in the index")
    parser.add_argument("--queries", type=int, default=300, help="(previous, next) pairs timed per k")
    args = parser.parse_args()
    commands = history(args.commands)
    started = time.perf_counter()
    index = HistoryIndex()
    for cmd in commands:
        index.add(cmd)
    print(f"index of {len(index):,} commands built in {time.perf_counter() - started:.2f} s")
    ranker = packaged_ranker()
    pairs = list(zip(commands[-args.queries - 1 : -1], commands[-args.queries :], strict=True))
    header = f"{'k':>3} {'pool':>6} {'carry-overs':>12} {'no carry p50':>13} {'with p50':>9}"
    print(header + f" {'with p99':>9} {'ratio':>6}")
    for k in KS:
        plain: list[float] = []
        full: list[float] = []
        sizes: list[int] = []
        carried: list[int] = []
        for prev, cmd in pairs:
            prefix = cmd[:k]
            # without carry-overs: what the ranker cost before they were added (same index)
            t = time.perf_counter()
            pool = index.pool(prefix, prev, carry=False)
            if pool:
                ranker.scores(index.features(prefix, pool, [prev]))
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            pool = index.pool(prefix, prev)
            if pool:
                ranker.scores(index.features(prefix, pool, [prev]))
            full.append(time.perf_counter() - t)
            sizes.append(len(pool))
            carried.append(sum(1 for c in pool if c not in index.count))
        p50, p50_full = statistics.median(plain) * 1e3, statistics.median(full) * 1e3
        p99 = sorted(full)[int(0.99 * (len(full) - 1))] * 1e3
        print(f"{k:>3} {statistics.median(sizes):>6.0f} {statistics.mean(carried):>12.1f} {p50:>10.3f} ms "
              f"{p50_full:>6.3f} ms {p99:>6.3f} ms {p50_full / p50:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
