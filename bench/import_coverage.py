"""What leaving out the runs the hooks recorded costs an import (issue 39, docs/history.md, "What
the hooks recorded"): the seconds `import_fish_history` takes for a fish history of N entries
(one a second, 5,000 distinct commands) into a store that is

- `empty`: no row to look up (the first import of a history older than calm);
- `unrelated`: N hook rows of other commands over the same seconds (every entry looked up, none
  matched: the most the lookups cost);
- `recorded`: N hook rows of the same runs (every entry matched, none stored).

    python bench/import_coverage.py [--entries 256000] [--rounds 1]

Each case in a new store under a temporary folder, the cases alternated round by round.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from calmd.arguments import Parser, run_tool, whole
from calmd.history.fish import import_fish_history
from calmd.history.store import HistoryStore

PROG = "bench/import_coverage.py"
T = 1_700_000_000
CASES = ("empty", "unrelated", "recorded")


def one(folder: Path, case: str, entries: int) -> tuple[float, int, int]:
    """(seconds, imported, recorded already) of one import."""
    fish = folder / "fish_history"
    with open(fish, "w") as f:
        for i in range(entries):
            f.write(f"- cmd: cmd{i % 5000} arg\n  when: {T + i}\n")
    store = HistoryStore(folder / "h.sqlite3")
    try:
        if case != "empty":
            with store.writing() as db:
                rows = ((T + i + 0.3, f"cmd{i % 5000} arg" if case == "recorded" else f"other{i % 5000}")
                        for i in range(entries))  # fmt: skip
                db.executemany(
                    "INSERT INTO commands (ts, session, cmd, source) VALUES (?, 's', ?, 'shell')", rows
                )
        started = time.perf_counter()
        result = import_fish_history(store, fish)
        return time.perf_counter() - started, result.imported, result.recorded
    finally:
        store.close()


def main() -> None:
    p = Parser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--entries", type=whole(1, 10_000_000), default=256_000, help="fish entries (fish keeps 256,000)"
    )
    p.add_argument("--rounds", type=whole(1, 100), default=1)
    args = p.parse_args()
    for _ in range(args.rounds):
        for case in CASES:
            folder = Path(tempfile.mkdtemp(prefix="calm-coverage-"))
            try:
                seconds, imported, recorded = one(folder, case, args.entries)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            print(f"{case:9s} {args.entries:,} entries: {seconds:6.2f} s, {imported:,} imported, "
                  f"{recorded:,} recorded already")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
