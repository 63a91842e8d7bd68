"""Keystroke latency of this tree's daemon against another checkout's, request by request.

    python bench/ab_latency.py --baseline DIR [--rounds 2] [--store-history]

Starts two `calmd serve` daemons with the packaged model, one from this tree and one from DIR (a
checkout of another commit: `git archive <commit> | tar -x -C DIR`), each first on PYTHONPATH
and in its own scratch HOME. Then types bench/latency.py's commands one character at a time
(5 history frames, one `complete` per keystroke, as the shell client does), sending each
keystroke to both daemons in turn, alternating which goes first. Both see the same machine state
at every moment, so a busy machine moves both alike; the ratios of their medians and p99 are
what this prints. bench/latency.py gives the absolute figures of one tree. With --store-history
the five history commands are recorded in each daemon's store instead of sent with every request,
as the shells do: the history side then has something to propose (without it, it has nothing).
With --real-cwd the keystrokes are typed in a folder that exists (bench/latency.py `real_cwd`), so
a daemon that fills COMP (issue 15) lists it; without, in one that does not exist.
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
from latency import COMMANDS, HISTORY, pct, real_cwd

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient

HERE = Path(__file__).resolve().parent.parent


class Daemon:
    def __init__(self, tree: Path) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="calmd-ab-"))
        run = self.home / "run"
        run.mkdir(mode=0o700)
        (self.home / "data").mkdir(mode=0o700)
        shutil.copy(paths.packaged_weights(), self.home / "data" / paths.WEIGHTS)
        self.socket = run / paths.APP / paths.SOCKET
        env = {**os.environ, "HOME": str(self.home), "CALM_HOME": str(self.home / "data"),
               "XDG_RUNTIME_DIR": str(run), "CALMD_SOCKET": str(self.socket),
               "PYTHONPATH": str(tree)}  # fmt: skip
        argv = [sys.executable, "-c", "from calmd.cli import calmd_main; raise SystemExit(calmd_main())",
                "serve", "--no-import"]  # fmt: skip
        # cwd: `python -c` puts the current folder first on sys.path, before PYTHONPATH
        self.proc = subprocess.Popen(
            argv, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client = CalmClient(self.socket, timeout=30)
                self.client.status()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"calmd from {tree} did not start") from None
                time.sleep(0.05)

    def keystroke(self, text: str, ctx: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        for _ in self.client.complete(text, n=5, session="ab", **ctx):
            pass
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


PROG = "bench/ab_latency.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--real-cwd", action="store_true",
                        help="type in a folder that exists: the daemon fills COMP from it")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="times the commands are typed (default 2)")
    parser.add_argument(
        "--store-history", action="store_true", help="record the history instead of sending it"
    )
    args = parser.parse_args()
    daemons = {"this tree": Daemon(HERE), "baseline": Daemon(args.baseline.resolve())}
    done: dict[str, list[float]] = {name: [] for name in daemons}
    cwd = str(real_cwd(daemons["this tree"].home)) if args.real_cwd else "/home/user/project"
    ctx: dict[str, Any] = {"cwd": cwd, "git": "main"}
    if args.store_history:
        for daemon in daemons.values():
            for h in HISTORY:
                daemon.client.record(h, exit=0, cwd=cwd, session="ab")
    else:
        ctx["history"] = [{"cmd": h, "exit": 0} for h in HISTORY]
    try:
        order = list(daemons)
        for name in order:  # warm up: the first context of each daemon is a full prefill
            daemons[name].keystroke("git st", ctx)
        for _ in range(args.rounds):
            for cmd in COMMANDS:
                for i in range(len(cmd) + 1):
                    order.reverse()
                    for name in order:
                        done[name].append(daemons[name].keystroke(cmd[:i], ctx))
    finally:
        for daemon in daemons.values():
            daemon.stop()
    print(f"{len(done['this tree'])} keystrokes per daemon, interleaved; request -> done (ms)\n")
    print(f"{'':<10}{'p50':>8}{'p90':>8}{'p99':>8}")
    for name, values in done.items():
        print(f"{name:<10}{statistics.median(values) * 1e3:>8.1f}{pct(values, 0.9) * 1e3:>8.1f}"
              f"{pct(values, 0.99) * 1e3:>8.1f}")  # fmt: skip
    new, old = done["this tree"], done["baseline"]
    ratios = [f"{name} {pct(new, q) / pct(old, q):.3f}x" for name, q in (("p90", 0.9), ("p99", 0.99))]
    print(
        f"\nthis tree / baseline: p50 {statistics.median(new) / statistics.median(old):.3f}x, "
        + ", ".join(ratios)
    )


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
