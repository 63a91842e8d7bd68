"""Sync of a large history: time and peak memory of the export and of the import (issue 33,
docs/sync.md and docs/performance.md).

    python bench/sync.py [--records 100000]
    python bench/sync.py --junk 10000

Two stores share a folder (as an engine leaves it once it has copied the files). The first
holds --records commands (varied lines, folders, sessions, statuses, as a real history has) and
was never shared: its first `calm sync now` seals them all into segments; the second then
imports them all. Then the first runs `calm sync now` twice more with nothing new: what every
export costs to check the machine's own segments in the folder against what it wrote (each file's
stat), and the same once every file's times changed (each file hashed, as after an engine copied
them again). Each step runs in a process of its own, so that its peak resident memory (ru_maxrss)
is its own; beside it, the same process's memory after importing the modules and opening the
store (the baseline). The records are checked to have arrived, once each, and the checks to have
found nothing to seal again.

Last, a third machine's daemon (`calmd serve`, the packaged model, receive only) imports the same
records at its first sync turn while a completion is asked every 0.2 s (a keystroke: issue 30's
bound on the history index's sync holds for sync's imports too): the slowest and the median of
those; then 20 more once the import is over: the slowest (while the index catches up, 5,000 rows
a keystroke) and the median of the last 5 (caught up).

With --junk N (issue 39): a folder where another machine's sub-folder holds N junk files named like
segments (68 random bytes after the magic); `calm sync now` run as a user runs it, twice (the first
refuses them all, the next finds them refused as they are), and `calm sync`: the seconds of each and
the lines each printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calmd import paths
from calmd.arguments import Parser, run_tool

ROOT = Path(__file__).resolve().parent.parent


def fill(path: Path, n: int) -> None:
    from calmd.history.store import HistoryStore

    store = HistoryStore(path)
    verbs = ["git status", "git commit -m 'fix {i}'", "make test", "cd src/module{m}", "vim notes{m}.md",
             "kubectl get pods -n ns{m}", "python3 -m pytest tests/test_{m}.py -q", "ls -la",
             "docker ps"]  # fmt: skip
    rows = [(1.7e9 + i, f"s{i // 50}", f"/home/u/src/p{i % 37}", "main" if i % 3 else "",
             verbs[i % len(verbs)].format(i=i, m=i % 101), (i % 7 == 0) * 1) for i in range(n)]  # fmt: skip
    sql = "INSERT INTO commands (ts, session, cwd, git, cmd, exit) VALUES (?, ?, ?, ?, ?, ?)"
    with store.writing() as db:
        db.executemany(sql, rows)
    store.close()


def step(data: Path) -> None:
    """One machine's `calm sync now`, in this process: prints its figures as JSON."""
    from calmd.history.store import HistoryStore
    from calmd.sync.machine import Sync

    sync = Sync(HistoryStore(data / paths.HISTORY), data)
    sync.host_id()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    report = sync.run(wait=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert report is not None
    print(json.dumps({"seconds": seconds, "peak_mib": peak / 1024, "base_mib": base / 1024,
                      "exported": report.exported, "imported": report.imported,
                      "healed": report.healed}))  # fmt: skip


def daemon_import(data: Path, records: int) -> dict[str, float]:
    """`calmd serve` on `data` (HOME/data, set up to receive from the folder): seconds until it
    holds all `records`, and the completions asked every 0.2 s meanwhile and 20 asked after (ms)."""
    from bench.harness import daemon
    from calmd.shell.client import CalmClient

    def keystroke(client: CalmClient) -> float:
        asked = time.perf_counter()
        list(client.complete("git st", n=3, session="bench"))
        return (time.perf_counter() - asked) * 1e3

    with daemon(home=data.parent, args=("--train-threshold", "0", "--no-import")) as d:
        t0 = time.perf_counter()
        during: list[float] = []
        with CalmClient(d.socket, timeout=120) as client:
            while client.status()["status"]["history"]["commands"] < records:
                during.append(keystroke(client))
                time.sleep(0.2)  # the pace of what is measured: a keystroke every 0.2 s
                if time.perf_counter() - t0 > 600:
                    raise SystemExit("the daemon did not import the records in 10 minutes")
            seconds = time.perf_counter() - t0
            after = []
            for _ in range(20):
                after.append(keystroke(client))
                time.sleep(0.2)
    return {"seconds": seconds, "asked": len(during), "slowest": max(during),
            "median": statistics.median(during), "after_slowest": max(after),
            "caught_up": statistics.median(after[-5:])}  # fmt: skip


def junk(n: int) -> None:
    """`calm sync now` (twice) and `calm sync` beside `n` junk files named like segments."""
    sys.path.insert(0, str(ROOT))
    from bench.harness import Report

    report = Report(f"calm sync beside {n:,} junk files named like segments", unit="s")
    calm = str(Path(sys.executable).parent / "calm")
    with tempfile.TemporaryDirectory() as tmp:
        home, folder = Path(tmp) / "home", Path(tmp) / "folder"
        home.mkdir(mode=0o700)
        folder.mkdir(mode=0o700)
        env = {**os.environ, "HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(home),
               "CALMD_SOCKET": str(home / "none.sock")}  # fmt: skip

        def run(*args: str) -> tuple[float, int]:
            started = time.perf_counter()
            done = subprocess.run([calm, *args], env=env, capture_output=True, text=True, timeout=600)
            return time.perf_counter() - started, len((done.stdout + done.stderr).splitlines())

        run("sync", "--folder", str(folder))
        other = folder / "0123456789abcdef"
        other.mkdir()
        for i in range(1, n + 1):
            (other / f"{i:08d}.calm").write_bytes(b"CALMSYN2" + os.urandom(60))
        first, again, status = run("sync", "now"), run("sync", "now"), run("sync")
        report.line(f"{n:,} junk files: the first `calm sync now` {first[0]:.2f} s, {first[1]:,} lines; the "
                    f"next {again[0]:.2f} s, {again[1]:,} lines; `calm sync` {status[0]:.2f} s, "
                    f"{status[1]:,} lines")  # fmt: skip
    report.machine()


PROG = "bench/sync.py"


def main() -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--junk", type=int, metavar="N", help="time `calm sync now` beside N junk files")
    parser.add_argument("--step", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        step(args.step)
        return 0
    if args.junk:
        junk(args.junk)
        return 0
    sys.path.insert(0, str(ROOT))
    from bench.harness import Report
    from calmd.sync.config import SyncConfig, write_config
    from calmd.sync.seal import new_key, write_key

    report = Report("sync of a large history: the export, the import, a daemon's import")
    with tempfile.TemporaryDirectory() as tmp:
        folder, one, two = Path(tmp) / "folder", Path(tmp) / "one", Path(tmp) / "two"
        three = Path(tmp) / "three" / "data"  # a daemon's CALM_HOME, in its HOME
        key = new_key()
        for d in (folder, one, two, three):
            d.mkdir(mode=0o700, parents=True)
        for d in (one, two):
            write_config(paths.sync_config_path(d), SyncConfig(str(folder)))
            write_key(paths.sync_key_path(d), key)
        write_config(paths.sync_config_path(three), SyncConfig(str(folder), "receive"))
        write_key(paths.sync_key_path(three), key)
        fill(one / paths.HISTORY, args.records)
        figures = {}
        for name, data in (("export", one), ("import", two), ("check", one), ("rehash", one)):
            if name == "rehash":  # new times on every file: the check hashes each
                for path in folder.rglob("*.calm"):
                    os.utime(path)
            out = subprocess.run([sys.executable, __file__, "--step", str(data)], capture_output=True,
                                 text=True, check=True)  # fmt: skip
            figures[name] = json.loads(out.stdout.strip().splitlines()[-1])
        assert figures["check"]["exported"] == figures["rehash"]["exported"] == 0
        assert figures["check"]["healed"] == figures["rehash"]["healed"] == 0
        size = sum(p.stat().st_size for p in folder.rglob("*.calm"))
        with sqlite3.connect(two / paths.HISTORY) as db:
            sql = "SELECT COUNT(*), COUNT(DISTINCT origin_id) FROM commands WHERE host != ''"
            arrived = db.execute(sql).fetchone()
        assert arrived == (args.records, args.records), arrived
        segments = len(list(folder.rglob("*.calm")))
        print(f"{args.records:,} records: {size / 2**20:.1f} MiB sealed in {segments} segments")
        for name in ("export", "import"):
            f = figures[name]
            print(
                f"{name}: {f['seconds']:.2f} s, peak {f['peak_mib']:.0f} MiB resident "
                f"({f['peak_mib'] - f['base_mib']:.0f} MiB over the process after opening the store)"
            )
        total = figures["export"]["seconds"] + figures["import"]["seconds"]
        print(f"sync + import: {total:.2f} s, {args.records / total:,.0f} records/s")
        for name, what in (("check", "stat"), ("rehash", "hash")):
            print(f"a later `calm sync now` with nothing new ({what} each own segment): "
                  f"{figures[name]['seconds'] * 1000:.0f} ms")  # fmt: skip
        d = daemon_import(three, args.records)
        print(f"a daemon's sync imports them in {d['seconds']:.1f} s; the {d['asked']:.0f} completions asked "
              f"meanwhile: slowest {d['slowest']:.0f} ms, median {d['median']:.0f} ms; after it, while "
              f"the index catches up: slowest {d['after_slowest']:.0f} ms, then "
              f"{d['caught_up']:.0f} ms")  # fmt: skip
    report.machine()
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
