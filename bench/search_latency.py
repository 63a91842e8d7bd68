"""The history search on a 100,000-command history (issue 26: at most 20 ms per keystroke): the
search index in process, the daemon's `search` op over its socket, and what the shell waits for
when Ctrl-R opens `calm search`, all in one run.

The history is the newest --commands commands of the public histories of ../shared/data/histories
(or a synthetic one), with synthetic context: 13 folders, a session every 200 commands, one
command in 7 failing. It is written to a fresh store, which a real `calmd serve` (the packaged
model) reads. Each of --lines lines from the newest part is searched the way a user types in the
search: its first word, then the rest of the line, one character at a time, each prefix one
search (the UI asks at every key), in the global and in the folder mode.

    python bench/search_latency.py [--commands 100000] [--lines 40] [--starts 10]
"""

from __future__ import annotations

import os
import pty
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import harness
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.history import query
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from calmd.suggest.search import Context, SearchIndex
from tests.support.daemon import daemon_env
from tests.support.waiting import wait_until

HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories" / "users"
MODES = ("global", "folder")


def history(limit: int) -> list[str]:
    from calmd.training.corpus import read_history

    files = sorted(HISTORIES.glob("*.txt")) if HISTORIES.is_dir() else []
    commands = [c for f in files for c in read_history(f)]
    i = 0
    while len(commands) < limit:  # synthetic: habits with changing arguments
        commands += [f"mkdir dir{i % 500}", f"cd dir{i % 500}", "git status", f"vim file{i % 97}.py"]
        i += 1
    return commands[-limit:]


def fill(path: Path, commands: list[str]) -> None:
    store = HistoryStore(path)
    start = time.time() - 60 * len(commands)
    with store._write_transaction():  # one transaction: the bench's set-up, not what it measures
        for i, cmd in enumerate(commands):
            verdict = store.check(cmd)
            store._store(verdict, cmd, 1 if i % 7 == 0 else 0, f"/home/user/p{i % 13}", "", f"s{i // 200}",
                         start + 60 * i, "shell")  # fmt: skip
    store.close()


def typed(lines: list[str]) -> list[str]:
    """The queries a user types to find each line: its first word, then on character by character."""
    out = []
    for line in lines:
        words = line.split()
        start = len(words[0]) if words else 1
        out += [line[:k] for k in range(1, min(len(line), start + 12) + 1)]
    return out


def in_process(db: Path, queries: list[str], context: tuple[str, ...]) -> list[tuple[str, list[float]]]:
    conn = query.open_read_only(db)
    started = time.perf_counter()
    index = SearchIndex()
    index.sync(conn)
    index.prepare()
    print(
        f"index of {len(index):,} commands ({len(index.texts):,} distinct) built in "
        f"{time.perf_counter() - started:.2f} s (the daemon does it at start, on a thread of its own)"
    )
    out = []
    for mode in MODES:
        ctx = Context("/home/user/p3", "s1", context)
        ms = []
        for q in queries:
            t = time.perf_counter()
            index.search(q, mode, ctx, 30)
            ms.append((time.perf_counter() - t) * 1e3)
        out.append((f"in process, {mode}", ms))
    conn.close()
    return out


def through_the_socket(
    home: Path, queries: list[str], runs: int
) -> tuple[list[tuple[str, list[float]]], list[float], list[float]]:
    """The daemon's `search` op on the store in `home`, and `calm search`'s first frame."""
    with harness.daemon(home=home) as d, CalmClient(d.socket, timeout=60) as c:
        # the search index is built in the background after `ready`: measured once it is
        wait_until(lambda: c.status()["status"]["search"]["ready"], "the daemon's search index")
        out = []
        for mode in MODES:
            ms, inside = [], []
            for q in queries:
                t = time.perf_counter()
                reply = c.search(q, mode=mode, n=30, session="s1", cwd="/home/user/p3")
                ms.append((time.perf_counter() - t) * 1e3)
                inside.append(float(reply["ms"]))
            out.append((f"through the socket, {mode}", ms))
            out.append((f"  of which in the daemon's search, {mode}", inside))
        ui, bare = starts(daemon_env(home), d.socket, runs)
        return out, ui, bare


def starts(env: dict[str, str], sock: Path, runs: int) -> tuple[list[float], list[float]]:
    """Ctrl-R to the first frame: `calm search` on a pseudo-terminal, until its header is drawn
    (it has connected and has the daemon's first answer); beside it, a bare Python start."""
    argv = [sys.executable, "-m", "calmd.shell.search_ui", "--socket", str(sock), "git"]
    ui, bare = [], []
    for _ in range(runs):
        ui.append(first_frame(argv, env))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append((time.perf_counter() - t) * 1e3)
    return ui, bare


def first_frame(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal, as a shell's
        os.execve(argv[0], argv, env)
    seen = b""
    try:
        while b"calm search" not in seen:
            ready, _, _ = select.select([fd], [], [], 10)
            if not ready:
                raise SystemExit("calm search drew nothing")
            seen += os.read(fd, 65536)
        elapsed = (time.perf_counter() - started) * 1e3
        os.write(fd, b"\x1b")  # Esc: leave
        while True:
            ready, _, _ = select.select([fd], [], [], 5)
            if not ready:
                break
            try:
                if not os.read(fd, 65536):
                    break
            except OSError:
                break
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return elapsed


PROG = "bench/search_latency.py"


def main() -> dict[str, object]:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=100_000, help="commands in the history")
    parser.add_argument("--lines", type=int, default=40, help="lines searched for, typed key by key")
    parser.add_argument("--starts", type=int, default=10, help="calm search starts timed")
    args = parser.parse_args()
    commands = history(args.commands)
    lines = commands[-args.lines * 50 :: 50][: args.lines]
    queries = typed(lines)
    report = harness.Report("the history search, per keystroke")
    with harness.scratch("calm-search-bench-") as home:
        (home / "data").mkdir(mode=0o700)
        db = home / "data" / paths.HISTORY
        fill(db, commands)
        report.line(f"{len(commands):,} commands, {len(queries)} keystrokes ({len(lines)} lines typed)")
        results = in_process(db, queries, tuple(commands[-5:]))
        remote, ui, bare = through_the_socket(home, queries, args.starts)
    figures = report.table("per keystroke", dict(results + remote), stats=("p50", "p90", "p99", "max"),
                           ratios=False)  # fmt: skip
    first, python = statistics.median(ui), statistics.median(bare)
    report.line(f"\nCtrl-R to the first frame (ms), median of {len(ui)}: calm search {first:.0f}, "
                f"a bare `python -c pass` {python:.0f} (ratio {first / python:.1f})")  # fmt: skip
    worst = max(harness.pct(ms, 0.9) for name, ms in remote if name.startswith("through"))
    verdict = "met" if worst <= 20 else "NOT met"
    report.line(f"budget: 20 ms per keystroke; through the socket p90 {worst:.1f} ms: {verdict}")
    report.machine()
    return {"per keystroke": figures, "first frame ms": first}


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
