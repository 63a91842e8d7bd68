"""Where a search-answered keystroke's time goes, in-process: issue 22's new user (`git commit -m
wip` typed in a real folder, COMP filled as the daemon fills it, an empty history).

    python bench/where_time_goes.py [--rounds 20]

Each stage of `ModelEngine.complete` is timed by a wrapper around the function that does it (the
model's passes: the context's prefill, the end-of-line probability, the history's and COMP's lines
scored in one batch, the beam search's steps split into the kernel and the Python around it; the
judging of beam lines; the history's proposals); what is left is the ranking, the calibration and
the rest. Only keystrokes that searched count (typing through answers the others). Medians and
means per keystroke, in ms, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import real_cwd

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.daemon.comp_state import SessionComp
from calmd.history.store import HistoryStore
from calmd.model import generate, mamba
from calmd.suggest.disk import Disk
from calmd.suggest.engine import ModelEngine

LINE = "git commit -m wip"
spent: dict[str, float] = defaultdict(float)


def timed(owner: Any, name: str, stage: str) -> None:
    """Wrap `owner.name` to add its wall time to `spent[stage]` (outermost call only)."""
    inner: Callable[..., Any] = getattr(owner, name)
    active = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if active[0]:
            return inner(*args, **kwargs)
        active[0] += 1
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            active[0] -= 1
            spent[stage] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


PROG = "bench/where_time_goes.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="calm-where-"))
    cwd = str(real_cwd(tmp))
    store = HistoryStore(tmp / paths.HISTORY)
    engine = ModelEngine(paths.packaged_weights())
    engine.attach_history(store)
    disk = Disk()
    engine.attach_disk(disk)
    frames = SessionComp(disk)
    engine.warm_up(cwd)
    timed(generate.Generator, "prepare", "prefill (context + input)")
    timed(generate.Generator, "end_probability", "end-of-line probability")
    timed(generate.Generator, "score_many", "history/COMP lines scored")
    timed(generate.Generator, "continuation_logprob", "typing through: rescoring")
    timed(mamba.CalmModel, "step", "beam: model steps (kernel)")
    timed(generate.BeamSearch, "step", "beam: steps (kernel + Python)")
    timed(ModelEngine, "_history_side", "history proposals")
    timed(ModelEngine, "_judge", "judge (built)")
    timed(frames, "fill", "COMP frame")
    per_key: list[dict[str, float]] = []
    totals: list[float] = []
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        session = f"new{r}"
        frames.set_path(session, os.environ.get("PATH", ""))
        for i in range(len(LINE) + 1):
            ctx: dict[str, Any] = {"input": LINE[:i], "cwd": cwd}
            spent.clear()
            searches = engine.searches
            t0 = time.perf_counter()
            frames.fill(ctx, session, engine.followers)
            for _ in engine.complete(ctx, 5, session, threading.Event(), lambda *_: None):
                pass
            total = time.perf_counter() - t0
            if engine.searches > searches:
                per_key.append(dict(spent))
                totals.append(total)
    load = max(load, os.getloadavg()[0])
    stages = sorted({k for d in per_key for k in d}, key=lambda k: -sum(d.get(k, 0) for d in per_key))
    print(
        f"{len(totals)} search-answered keystrokes of `{LINE}` in a real folder; load average up to "
        f"{load:.2f}\n"
    )
    print(f"{'stage':<36}{'mean ms':>9}{'share':>8}")
    mean_total = statistics.mean(totals) * 1e3
    rows = []
    for stage in stages:
        mean = statistics.mean(d.get(stage, 0.0) for d in per_key) * 1e3
        rows.append((stage, mean))
    kernel = next((m for s, m in rows if s.startswith("beam: model")), 0.0)
    for stage, mean in rows:
        if stage == "beam: steps (kernel + Python)":
            python = mean - kernel
            print(f"{'beam: Python around the kernel':<36}{python:>9.2f}{python / mean_total:>8.0%}")
            continue
        print(f"{stage:<36}{mean:>9.2f}{mean / mean_total:>8.0%}")
    accounted = sum(m for s, m in rows if s != "beam: model steps (kernel)")
    rest = mean_total - accounted
    print(f"{'the rest (ranking, calibration, ...)':<36}{rest:>9.2f}{rest / mean_total:>8.0%}")
    print(
        f"{'whole keystroke':<36}{mean_total:>9.2f}   p50 {statistics.median(totals) * 1e3:.2f}, "
        f"p90 {sorted(totals)[int(0.9 * len(totals))] * 1e3:.2f}"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
