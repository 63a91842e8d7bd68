"""Typing through a suggestion: the daemon's cost per keystroke when the user types along the top
line, with and without continuing the previous answer, in the same run.

    python bench/typing_through.py [--model FILE.cwgt] [--rounds 10]

Two `calmd serve` daemons with the same weights in scratch HOMEs, one as shipped and one whose
engine never continues a previous answer (`RankWeights(typing_through=0)`: every keystroke is a
search); every request goes to one and then the other, so both see the same machine state.
- Typing through: five commands recorded; for each line of bench/latency.py's list, the top
  suggestion after its first character is typed out along the ghost, one `complete` per key;
  the daemon-side time (the `done` reply's `ms`) per keystroke, p50 / p99.
- A new user: empty histories, `git commit -m wip` typed `--rounds` times, one character at a
  time, each round in a session of its own; request -> done, client side, p50 / p99 (the first
  round includes the first prefill).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from latency import COMMANDS, HISTORY, pct, wait_ready  # noqa: E402

from calmd import paths  # noqa: E402
from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.shell.client import CalmClient  # noqa: E402

NEW_USER_LINE = "git commit -m wip"


def search_engine(path: Path) -> Any:
    """The engine as shipped, except that it searches at every keystroke (the `before`)."""
    from calmd.suggest.engine import ModelEngine, RankWeights

    return ModelEngine(paths.serving_weights(path), RankWeights(typing_through=0))


def serve_searching() -> int:
    """`calmd serve` (the same parser and server) with `search_engine`: `python
    bench/typing_through.py serve [calmd serve's options]`."""
    from calmd import cli

    paths.set_private_umask()
    args = cli.calmd_parser().parse_args(sys.argv[1:])
    return cli.cmd_serve(args, engine_loader=search_engine)


@contextlib.contextmanager
def daemon(model: Path, searching: bool = False, extra: tuple[str, ...] = ()) -> Iterator[Path]:
    """`calmd serve` in a scratch HOME (`searching`: with `search_engine`); yields its socket."""
    home = Path(tempfile.mkdtemp(prefix="calmd-bench-"))
    run = home / "run"
    run.mkdir(mode=0o700)
    (home / "data").mkdir()
    shutil.copy(model, home / "data" / paths.WEIGHTS)
    sock = run / paths.APP / paths.SOCKET
    env = {**os.environ, "HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(run),
           "CALMD_SOCKET": str(sock), "PYTHONPATH": str(HERE)}  # fmt: skip
    calmd = [sys.executable, __file__] if searching else [str(Path(sys.executable).parent / "calmd")]
    argv = [*calmd, "serve", "--no-import", *extra]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, sock)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(home, ignore_errors=True)


def ask(c: CalmClient, text: str, session: str) -> tuple[list[str], float, float]:
    """One keystroke: (candidates, client-side ms to done, the daemon's ms)."""
    t0 = time.perf_counter()
    got, daemon_ms = [], float("nan")
    for m in c.complete(text, n=5, session=session, cwd="/home/user/project", git="main"):
        if "candidate" in m:
            got.append(m["candidate"])
        if m.get("done"):
            daemon_ms = float(m["ms"])
    return got, (time.perf_counter() - t0) * 1e3, daemon_ms


PROG = "bench/typing_through.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.packaged_weights())
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with (
        daemon(args.model) as sock_new, daemon(args.model, searching=True) as sock_old,
        CalmClient(sock_new, timeout=30) as new, CalmClient(sock_old, timeout=30) as old,
    ):  # fmt: skip
        for c in (new, old):
            for h in HISTORY:
                c.record(h, exit=0, cwd="/home/user/project", session="bench")
        through: dict[str, list[float]] = {"new": [], "old": []}
        typed = 0
        for cmd in COMMANDS:
            top, _, _ = ask(new, cmd[:1], "bench")
            ask(old, cmd[:1], "bench")
            if not top:
                continue
            line = top[0]
            for i in range(2, len(line)):
                for name, c in (("new", new), ("old", old)):
                    _, _, ms = ask(c, line[:i], "bench")
                    through[name].append(ms)
                typed += 1
        stats_through = new.status()["status"]["model"]["answers"]
    with (
        daemon(args.model) as sock_new, daemon(args.model, searching=True) as sock_old,
        CalmClient(sock_new, timeout=30) as new, CalmClient(sock_old, timeout=30) as old,
    ):  # fmt: skip
        fresh: dict[str, list[float]] = {"new": [], "old": []}
        fresh_daemon: dict[str, list[float]] = {"new": [], "old": []}
        for r in range(args.rounds):
            for i in range(len(NEW_USER_LINE) + 1):
                for name, c in (("new", new), ("old", old)):
                    # a session per round: no round answers from the one before (a backspace would)
                    _, wall, ms = ask(c, NEW_USER_LINE[:i], f"new-user-{r}")
                    fresh[name].append(wall)
                    fresh_daemon[name].append(ms)
        stats_new_user = new.status()["status"]["model"]["answers"]
    load = os.getloadavg()
    print(f"model {args.model}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(f"typing through the top suggestion: {typed} keystrokes (answered from the previous answer: "
          f"{stats_through['typed_through']}, searched: {stats_through['searched']})")  # fmt: skip
    print(f"{'daemon-side ms':<40}{'p50':>8}{'p99':>8}")
    for label, name in (("continuing the previous answer", "new"), ("a search at every key (before)", "old")):
        print(f"{label:<40}{pct(through[name], 0.5):>8.2f}{pct(through[name], 0.99):>8.2f}")
    ratio = pct(through["new"], 0.5) / pct(through["old"], 0.5)
    print(f"p50 ratio: {ratio:.2f}x (goal: <= 2 ms p50)\n")
    print(f"a new user, empty history, `{NEW_USER_LINE}` x {args.rounds} "
          f"(from the previous answer: {stats_new_user['typed_through']} of "
          f"{stats_new_user['typed_through'] + stats_new_user['searched']})")  # fmt: skip
    print(f"{'ms':<40}{'done p50':>10}{'done p99':>10}{'daemon p50':>12}{'daemon p99':>12}")
    for label, name in (("continuing the previous answer", "new"), ("a search at every key (before)", "old")):
        print(f"{label:<40}{pct(fresh[name], .5):>10.2f}{pct(fresh[name], .99):>10.2f}"
              f"{pct(fresh_daemon[name], .5):>12.2f}{pct(fresh_daemon[name], .99):>12.2f}")  # fmt: skip
    for label, name in (("continuing", "new"), ("searching", "old")):
        slowest = sorted(range(len(fresh[name])), key=fresh[name].__getitem__, reverse=True)[:5]
        where = ", ".join(f"{fresh[name][i]:.1f} ms at {NEW_USER_LINE[: i % (len(NEW_USER_LINE) + 1)]!r} "
                          f"(round {i // (len(NEW_USER_LINE) + 1) + 1})" for i in slowest)  # fmt: skip
        print(f"slowest 5, {label}: {where}")
    print("(goal: done p99 <= 30 ms)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve_searching())
    raise SystemExit(run_tool(PROG, main))
