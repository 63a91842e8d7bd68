"""calmd start-up time: `calmd serve` spawned -> `calmd ready` printed -> the socket answers ->
the first keystroke answered.

    python bench/startup.py [--runs 10] [--baseline REV|DIR]

Each run starts `calmd serve --no-import` with the packaged model in a fresh HOME holding a
project folder and a history of five commands, and stops it. The compiled kernels (the fused
scan and step, built with g++ on a user's first start) are kept in one cache for every run, as a
user's are after that first start: the first run of each tree, which builds them, is not counted.
The first keystroke is what a zsh hook sends first after the daemon is ready: `complete` of "g"
with the early line, the cwd and the shell's PATH (request -> done, client side; goal <= 100 ms).
With --baseline REV|DIR (a commit, taken out with `git archive`, or a checkout of one), runs
alternate between this tree and it (each started the same way, its tree first on PYTHONPATH), so
both see the same machine, and the ratio of medians is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, Report, alternate, daemon, release, scratch
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient

HISTORY = ["cd ~/project", "git pull", "make", "ls", "git status"]
CACHE = Path(tempfile.mkdtemp(prefix="calmd-startup-cache-"))  # CALM_CACHE of every run
PROG = "bench/startup.py"


def start_once(tree: Path) -> tuple[float, float, float]:
    """(seconds to the `ready` line, seconds to the first answered status, ms the first keystroke
    took) for one start of `tree`'s daemon."""
    with scratch("calmd-startup-") as home:
        project = home / "project"
        project.mkdir()
        for name in ("src", "README.md", "Makefile", "setup.py"):
            (project / name).touch()
        store = HistoryStore(home / "data" / paths.HISTORY)
        for cmd in HISTORY:
            store.record(cmd, exit=0, cwd=str(project), session="zsh-1")
        store.close()
        with (
            daemon(tree=tree, home=home, env={"CALM_CACHE": str(CACHE)}) as d,
            CalmClient(d.socket, timeout=60) as c,
        ):
            c.status()
            answered = time.monotonic() - d.started_at
            sent = time.perf_counter()
            rid = c.send("complete", n=5, session="zsh-2", early=True, path=os.environ.get("PATH", ""),
                         ctx={"input": "g", "cwd": str(project)})  # fmt: skip
            for _ in c.replies(rid):
                pass
            first_keystroke = (time.perf_counter() - sent) * 1e3
            return d.start_s, answered, first_keystroke


def main() -> dict[str, object]:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--baseline", help="another commit or checkout, run alternately for a same-run ratio")
    args = parser.parse_args()
    report = Report("calmd start-up: spawned -> ready, -> first status answered, -> first keystroke done")
    with contextlib.ExitStack() as stack:
        trees = {"this tree": ROOT}
        if args.baseline:
            trees[args.baseline] = stack.enter_context(release(args.baseline))
        for tree in trees.values():  # warm the page cache (torch, the model) and build the kernels
            start_once(tree)
        runs = alternate({name: (lambda _, tree=tree: start_once(tree)) for name, tree in trees.items()},
                         range(args.runs))  # fmt: skip
    figures = {}
    for k, what, unit in ((0, "spawned -> ready", "s"), (1, "-> first status answered", "s"),
                          (2, "first keystroke: request -> done", "ms")):  # fmt: skip
        samples = {name: [run[k] for run in values] for name, values in runs.items()}
        figures[what] = report.table(what, samples, stats=("p50", "max"), unit=unit)
    report.line("(goal: the first keystroke <= 100 ms)")
    report.machine()
    return figures


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
