"""Issue 22's new user: `git commit -m wip` typed in a real folder, asked as the zsh hook asks,
against this tree's daemon and a previous release's, keystroke by keystroke in the same run.

    python bench/new_user.py [--baseline REV] [--rounds 10]

REV (default 6ebedc4: main before the trust, context and typing-through work) is taken out of
this repository with `git archive` into a scratch folder; each daemon runs from its own tree with
the model that tree packaged (`calmd serve --no-import`, an empty history, a scratch HOME), both
on the same machine at the same moments: every keystroke goes to one daemon and then the other,
alternating which is first. The folder typed in exists and holds what bench/latency.py's
`real_cwd` puts there (about 200 entries), so a daemon that fills COMP lists it.

Each round is a new session typing the line one character at a time; every request is the zsh
hook's (`"early": true`, the shell's PATH with the first one, the line drawn so far as `drawn`
while it extends the buffer, which an older daemon ignores). Client side, request -> `done`. A
keystroke is "search-answered" when the daemon's status says it searched for it (typing
through, issue 16, answers the others from the previous answer); a daemon whose status has no
such counts searched at every keystroke. Goal (issue 22): search-answered keystrokes <= 15 ms
at the median and <= 25 ms at p90, at a load under 1.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import pct, real_cwd, wait_ready

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient

HERE = Path(__file__).resolve().parent.parent
LINE = "git commit -m wip"
BASELINE = "6ebedc4"
CACHE = Path.home() / ".cache" / "calm"  # the compiled kernels: a user's own, built once


class Daemon:
    """`calmd serve` from `tree` in a scratch HOME, with the client the zsh hook's helper would hold;
    it serves `weights` (copied in as the user's weights), else the model `tree` packaged."""

    def __init__(self, tree: Path, weights: Path | None = None) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="calmd-newuser-"))
        run = self.home / "run"
        run.mkdir(mode=0o700)
        (self.home / "data").mkdir(mode=0o700)
        if weights is not None:
            shutil.copy(weights, self.home / "data" / paths.WEIGHTS)
        self.socket = run / paths.APP / paths.SOCKET
        env = {**os.environ, "HOME": str(self.home), "CALM_HOME": str(self.home / "data"),
               "XDG_RUNTIME_DIR": str(run), "CALMD_SOCKET": str(self.socket),
               "PYTHONPATH": str(tree), "CALM_CACHE": os.environ.get("CALM_CACHE", str(CACHE))}  # fmt: skip
        argv = [sys.executable, "-c", "from calmd.cli import calmd_main; raise SystemExit(calmd_main())",
                "serve", "--no-import"]  # fmt: skip
        # cwd: `python -c` puts the current folder first on sys.path, before PYTHONPATH
        self.proc = subprocess.Popen(
            argv, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_ready(self.proc, self.socket, timeout=180)
        self.client = CalmClient(self.socket, timeout=30)
        self.drawn = ""

    def searches(self) -> int | None:
        answers = self.client.status()["status"].get("model", {}).get("answers")
        return None if answers is None else int(answers["searched"])

    def keystroke(self, typed: str, session: str, cwd: str, first: bool) -> tuple[float, bool]:
        """(ms to done, whether the daemon searched for it)."""
        before = self.searches()
        extra: dict[str, Any] = {"early": True}
        if first:
            extra["path"] = os.environ.get("PATH", "")[:8192]
        if len(self.drawn) > len(typed) and self.drawn.startswith(typed):
            extra["drawn"] = self.drawn
        t0 = time.perf_counter()
        rid = self.client.send("complete", n=5, session=session, ctx={"input": typed, "cwd": cwd}, **extra)
        drawn = ""
        for message in self.client.replies(rid):
            if message.get("ghost") and not drawn:
                drawn = str(message.get("candidate") or message.get("early") or "")
            elif "ghost" not in message and "candidate" in message and not drawn:
                drawn = str(message["candidate"])  # an older daemon: the helper drew its best line
        ms = (time.perf_counter() - t0) * 1e3
        self.drawn = drawn
        after = self.searches()
        return ms, before is None or after is None or after > before

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


def checkout(rev: str) -> Path:
    """`rev` of this repository in a scratch folder (its packaged model included)."""
    folder = Path(tempfile.mkdtemp(prefix=f"calmd-{rev}-"))
    archive = subprocess.run(["git", "-C", str(HERE), "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def report(name: str, values: list[tuple[float, bool]]) -> tuple[float, float]:
    searched = [ms for ms, s in values if s]
    every = [ms for ms, _ in values]
    print(f"{name:<16}{statistics.median(searched):>9.1f}{pct(searched, 0.9):>9.1f}{len(searched):>6}"
          f"{statistics.median(every):>11.1f}{pct(every, 0.9):>9.1f}{len(every):>6}")  # fmt: skip
    return statistics.median(searched), pct(searched, 0.9)


PROG = "bench/new_user.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE, help=f"the release beside (default {BASELINE})")
    parser.add_argument("--rounds", type=int, default=10, help="times the line is typed, each a new session")
    args = parser.parse_args()
    old_tree = checkout(args.baseline)
    load = os.getloadavg()[0]
    daemons = {"this tree": Daemon(HERE), args.baseline: Daemon(old_tree)}
    cwd = str(real_cwd(daemons["this tree"].home))
    times: dict[str, list[tuple[float, bool]]] = {name: [] for name in daemons}
    try:
        order = list(daemons)
        for r in range(args.rounds):
            for d in daemons.values():
                d.drawn = ""
            for i in range(len(LINE) + 1):
                order.reverse()
                for name in order:
                    times[name].append(daemons[name].keystroke(LINE[:i], f"new{r}", cwd, first=i == 0))
    finally:
        for d in daemons.values():
            d.stop()
        shutil.rmtree(old_tree, ignore_errors=True)
    load = max(load, os.getloadavg()[0])
    print(
        f"`{LINE}` typed {args.rounds} times in a real folder, each a new session; request -> done, "
        f"ms; load average up to {load:.2f} on {os.cpu_count()} cores\n"
    )
    print(f"{'':<16}{'search-answered':>24}{'every keystroke':>26}")
    print(f"{'':<16}{'p50':>9}{'p90':>9}{'n':>6}{'p50':>11}{'p90':>9}{'n':>6}")
    new = report("this tree", times["this tree"])
    old = report(args.baseline, times[args.baseline])
    print(f"\nsearch-answered, this tree / {args.baseline}: p50 {new[0] / old[0]:.2f}x, "
          f"p90 {new[1] / old[1]:.2f}x  (goal: p50 <= 15 ms, p90 <= 25 ms at a load under 1)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
