"""calmd start-up time: `calmd serve` spawned -> `calmd ready` printed -> the socket answers.

    python bench/startup.py [--runs 10] [--baseline DIR]

Each run starts `calmd serve --no-import` with the packaged model in a fresh HOME and stops it.
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

from calmd.shell.client import CalmClient

HERE = Path(__file__).resolve().parent.parent


def start_once(tree: Path) -> tuple[float, float]:
    """(seconds to the `ready` line, seconds to the first answered status) for one start."""
    home = Path(tempfile.mkdtemp(prefix="calmd-startup-"))
    run = home / "run"
    run.mkdir(mode=0o700)
    sock = run / "calm" / "calmd.sock"
    env = {**os.environ, "HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(run),
           "CALMD_SOCKET": str(sock), "PYTHONPATH": str(tree)}  # fmt: skip
    argv = [sys.executable, "-c", "from calmd.cli import calmd_main; raise SystemExit(calmd_main())", "serve",
            "--no-import"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    return ready, answered


def summary(name: str, values: list[tuple[float, float]]) -> tuple[float, float]:
    ready = [r for r, _ in values]
    answered = [a for _, a in values]
    spread = f"min {min(ready):.2f}, max {max(ready):.2f}"
    print(f"{name:<10} ready: median {statistics.median(ready):.2f} s ({spread}); "
          f"first status answered: median {statistics.median(answered):.2f} s")  # fmt: skip
    return statistics.median(ready), statistics.median(answered)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--baseline", type=Path, help="another checkout, run alternately for a same-run ratio"
    )
    args = parser.parse_args()
    trees = {"this tree": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    start_once(HERE)  # warm the page cache (torch, the model) for both
    for _ in range(args.runs):
        for name, tree in trees.items():
            results[name].append(start_once(tree))
    medians = {name: summary(name, values) for name, values in results.items()}
    if args.baseline:
        (new_ready, new_answer), (old_ready, old_answer) = medians["this tree"], medians["baseline"]
        print(f"this tree / baseline, medians: ready {new_ready / old_ready:.3f}x, "
              f"first status {new_answer / old_answer:.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
