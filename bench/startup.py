"""calmd start-up time: `calmd serve` spawned -> `calmd ready` printed -> the socket answers ->
the first keystroke answered.

    python bench/startup.py [--runs 10] [--baseline DIR]

Each run starts `calmd serve --no-import` with the packaged model in a fresh HOME holding a
project folder and a history of five commands, and stops it. The compiled kernels (the fused
scan and step, built with g++ on a user's first start) are kept in one cache for every run, as a
user's are after that first start: the first run of each tree, which builds them, is not counted.
The first keystroke is what a zsh hook sends first after the daemon is ready: `complete` of "g"
with the early line, the cwd and the shell's PATH (request -> done, client side; goal <= 100 ms).
With --baseline DIR (a checkout of another commit, e.g. `git worktree add /tmp/base HEAD~5`, or
`git archive HEAD~5 | tar -x -C /tmp/base`), runs alternate between this tree and DIR (each put
first on PYTHONPATH), so both see the same machine, and the ratio of medians is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient

HERE = Path(__file__).resolve().parent.parent


HISTORY = ["cd ~/project", "git pull", "make", "ls", "git status"]


CACHE = Path(tempfile.mkdtemp(prefix="calmd-startup-cache-"))  # CALM_CACHE of every run


def start_once(tree: Path) -> tuple[float, float, float]:
    """(seconds to the `ready` line, seconds to the first answered status, ms the first keystroke
    took) for one start."""
    home = Path(tempfile.mkdtemp(prefix="calmd-startup-"))
    project = home / "project"
    project.mkdir()
    for name in ("src", "README.md", "Makefile", "setup.py"):
        (project / name).touch()
    from calmd.history.store import HistoryStore

    store = HistoryStore(home / "data" / paths.HISTORY)
    for cmd in HISTORY:
        store.record(cmd, exit=0, cwd=str(project), session="zsh-1")
    store.close()
    run = home / "run"
    run.mkdir(mode=0o700)
    sock = run / paths.APP / paths.SOCKET
    env = {**os.environ, "HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(run),
           "CALMD_SOCKET": str(sock), "PYTHONPATH": str(tree), "CALM_CACHE": str(CACHE)}  # fmt: skip
    argv = [sys.executable, "-c", "from calmd.cli import calmd_main; raise SystemExit(calmd_main())", "serve",
            "--no-import"]  # fmt: skip
    t0 = time.perf_counter()
    # cwd: `python -c` puts the current folder first on sys.path, before PYTHONPATH
    proc = subprocess.Popen(
        argv, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "calmd ready on" in line:
                break
        else:
            raise SystemExit(f"calmd ({tree}) did not start")
        ready = time.perf_counter() - t0
        with CalmClient(sock, timeout=30) as c:
            c.status()
            answered = time.perf_counter() - t0
            sent = time.perf_counter()
            rid = c.send("complete", n=5, session="zsh-2", early=True, path=os.environ.get("PATH", ""),
                         ctx={"input": "g", "cwd": str(project)})  # fmt: skip
            for _ in c.replies(rid):
                pass
            first_keystroke = (time.perf_counter() - sent) * 1e3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    return ready, answered, first_keystroke


def summary(name: str, values: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    ready = [r for r, _, _ in values]
    answered = [a for _, a, _ in values]
    first = [f for _, _, f in values]
    spread = f"min {min(ready):.2f}, max {max(ready):.2f}"
    print(f"{name:<10} ready: median {statistics.median(ready):.2f} s ({spread}); "
          f"first status answered: median {statistics.median(answered):.2f} s; first keystroke: "
          f"median {statistics.median(first):.1f} ms (max {max(first):.1f})")  # fmt: skip
    return statistics.median(ready), statistics.median(answered), statistics.median(first)


PROG = "bench/startup.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--baseline", type=Path, help="another checkout, run alternately for a same-run ratio"
    )
    args = parser.parse_args()
    trees = {"this tree": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
    for tree in trees.values():  # warm the page cache (torch, the model) and build the kernels
        start_once(tree)
    for _ in range(args.runs):
        for name, tree in trees.items():
            results[name].append(start_once(tree))
    medians = {name: summary(name, values) for name, values in results.items()}
    if args.baseline:
        (new_ready, new_answer, new_first), (old_ready, old_answer, old_first) = (
            medians["this tree"],
            medians["baseline"],
        )
        print(f"this tree / baseline, medians: ready {new_ready / old_ready:.3f}x, "
              f"first status {new_answer / old_answer:.3f}x, "
              f"first keystroke {new_first / old_first:.3f}x")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
