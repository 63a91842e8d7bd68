"""`calm history` and `calm stats` on a 100,000-command history (issue 26: at most 1 s each),
end to end as a user runs them (the command line, its start included, output to /dev/null),
beside `calm --version` (the command line's start alone) in the same run.

The history: the newest --commands commands of the public histories of ../shared/data/histories
(or a synthetic one) with synthetic folders (13), sessions (one per 200 commands), statuses (one
in 7 failing) and times (one a minute), in a fresh store.

    python bench/history_query.py [--commands 100000] [--runs 3]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/history_query.py`

from bench.search_latency import fill, history
from calmd import paths
from calmd.arguments import Parser, run_tool

CASES = {
    "calm --version (start only)": ["--version"],
    "calm history": ["history"],
    "calm history --json": ["history", "--json"],
    "calm history --commands": ["history", "--commands"],
    "calm history git --cwd DIR": ["history", "git", "--cwd", "/home/user/p3"],
    "calm history --failed --since 3d": ["history", "--failed", "--since", "3d"],
    "calm history --regex '^git (push|pull)'": ["history", "--regex", "^git (push|pull)"],
    "calm history --limit 50": ["history", "--limit", "50"],
    "calm stats": ["stats"],
    "calm stats --json": ["stats", "--json"],
    "calm stats --cwd DIR": ["stats", "--cwd", "/home/user/p3"],
}


PROG = "bench/history_query.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each command (the median is shown)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="calm-history-bench-"))
    calm = str(Path(sys.executable).parent / "calm")
    try:
        (home / "data").mkdir(mode=0o700)
        db = home / "data" / paths.HISTORY
        fill(db, history(args.commands))
        env = {**os.environ, "HOME": str(home), "CALM_HOME": str(home / "data"), "COLUMNS": "120"}
        print(f"{args.commands:,} commands; load {os.getloadavg()[0]:.1f}\n")
        print(f"{'command':<42}{'median s':>10}{'lines out':>11}")
        medians = {}
        for name, argv in CASES.items():
            times, lines = [], 0
            for _ in range(args.runs):
                t = time.perf_counter()
                out = subprocess.run([calm, *argv], env=env, capture_output=True, check=True)
                times.append(time.perf_counter() - t)
                lines = out.stdout.count(b"\n")
            medians[name] = statistics.median(times)
            print(f"{name:<42}{medians[name]:>10.3f}{lines:>11,}")
        worst = max(v for k, v in medians.items() if not k.startswith("calm --version"))
        start = medians["calm --version (start only)"]
        print(f"\nslowest {worst:.3f} s ({worst / start:.1f}x the command line's start); budget 1 s: "
              f"{'met' if worst <= 1.0 else 'NOT met'}")  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
