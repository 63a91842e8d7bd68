"""What COMP, ENV and the disk check cost a keystroke, end to end in the engine (issue 15).

    .venv/bin/python bench/comp_latency.py [--model FILE.cwgt] [--commands 20]

The same engine (the packaged model, five history commands recorded) answers the keystrokes of
bench/latency.py's commands twice, alternating request by request so that both see the same
machine state:
- "without": what the daemon did before issue 15 (no COMP, no disk check);
- "with": the daemon's path now: `SessionComp.fill` (COMP from the real folder) and the
  engine's disk check and COMP proposals (calmd/suggest/disk.py). No ENV: an ENV frame changes
  what the model predicts, and so how long its beams run, which is not what this measures.
Both in a folder that exists (with the files the commands name and 200 others: COMP changes at
each keystroke of a file name) and in one that does not (no COMP: the cost of the checks alone).
Prints p50 / p99 of each and the ratio of medians (same run, same load).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latency import COMMANDS, HISTORY, pct, real_cwd

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.daemon.comp_state import SessionComp
from calmd.history.store import HistoryStore
from calmd.suggest.disk import Disk
from calmd.suggest.engine import ModelEngine

PROG = "bench/comp_latency.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.packaged_weights())
    parser.add_argument("--commands", type=int, default=len(COMMANDS))
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="calmd-comp-latency-"))
    try:
        folder = real_cwd(home)
        store = HistoryStore(home / paths.HISTORY)
        for h in HISTORY:
            store.record(h, exit=0, cwd=str(folder), session="bench")
        # one engine for both (two copies of the model measured 10-20% apart on this machine,
        # whichever did what): the disk is attached for "with" and detached for "without"
        engine = ModelEngine(args.model)
        engine.attach_history(store)
        disk = Disk()
        frames = SessionComp(disk)
        never = threading.Event()
        times: dict[tuple[str, bool], list[float]] = {}
        for cwd, name in ((str(folder), "real folder"), ("/home/user/project", "missing folder")):
            disk.listing(cwd)
            for _ in range(2):  # warm-up: the listing, the caches
                for variant in (False, True):
                    engine.disk = disk if variant else None
                    list(engine.complete({"input": "vim R", "cwd": cwd}, 5, f"w{variant}", never))
            for cmd in COMMANDS[: args.commands]:
                for i in range(len(cmd) + 1):
                    for variant in (False, True) if i % 2 else (True, False):  # either goes first
                        ctx: dict[str, Any] = {"input": cmd[:i], "cwd": cwd, "git": "main"}
                        engine.disk = disk if variant else None
                        t0 = time.perf_counter()
                        if variant:
                            frames.fill(ctx, "with", engine.followers)
                            list(engine.complete(ctx, 5, "with", never))
                        else:
                            list(engine.complete(ctx, 5, "without", never))
                        times.setdefault((name, variant), []).append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    ms = 1000.0
    load = os.getloadavg()
    print(f"keystrokes through the engine, interleaved; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'case':<34}{'p50 ms':>9}{'p99 ms':>9}")
    for name in ("real folder", "missing folder"):
        for variant in (False, True):
            t = times[name, variant]
            label = f"{name}, {'with COMP + disk check' if variant else 'without'}"
            print(f"{label:<34}{pct(t, 0.5) * ms:>9.2f}{pct(t, 0.99) * ms:>9.2f}")
        ratio = pct(times[name, True], 0.5) / pct(times[name, False], 0.5)
        ratio99 = pct(times[name, True], 0.99) / pct(times[name, False], 0.99)
        print(f"  {name}: with / without, median {ratio:.2f}x, p99 {ratio99:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
