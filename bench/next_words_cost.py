"""What the model's word on a drawn head costs a new user's keystroke (issue 41), in process.

    git show main:calmd/data/ghost.json > /tmp/old-ghost.json
    python bench/next_words_cost.py --baseline-rule /tmp/old-ghost.json [--rounds 3]

Two engines of this tree with the packaged model and an empty history each (the newborn rule):
one with the packaged ghost rule, whose young rules weigh a head by the model's probability of
its words (calmd/suggest/next_words.py: a prefill of the drawn line's next bytes), and one with
the rule file given (an older rule that asks the model nothing). bench/latency.py's commands are
typed one character at a time in a git repository (git lines are drawable there), each command
in a session of its own, every keystroke asked of one engine and then the other, alternating
which goes first, so both see the same machine state. Prints p50 / p90 / p99 of each, and how
many keystrokes ran a next-word prefill (the rest asked nothing, or typed along a line scored
already). bench/ab_latency.py measures the same through the socket against another checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from latency import COMMANDS, HISTORY, pct  # noqa: E402

from calmd import paths  # noqa: E402
from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.atomic import parse_json  # noqa: E402

PROG = "bench/next_words_cost.py"
PROJECT_FILES = ("README.md", "Makefile", "src/main.py", "tests/test_main.py")


def project(root: Path) -> Path:
    """A small git repository on `main` (the engine draws no git line outside one)."""
    folder = root / "project"
    for name in PROJECT_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=folder, check=True)
    return folder


def main() -> None:
    import torch

    from calmd.history.store import HistoryStore
    from calmd.suggest.engine import ModelEngine
    from calmd.suggest.ghost import GhostRule

    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rule", type=Path, required=True, help="the ghost rule to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="times the commands are typed (default 3)")
    args = parser.parse_args()
    source = args.baseline_rule
    old = GhostRule.from_json(parse_json(source.read_bytes(), source), str(source))
    torch.set_num_threads(1)  # as the daemon
    with tempfile.TemporaryDirectory(prefix="calm-next-words-") as tmp:
        root = Path(tmp)
        folder = project(root)
        engines = {
            "packaged": ModelEngine(paths.packaged_weights()),
            "baseline": ModelEngine(paths.packaged_weights(), ghost=old),
        }
        stores = {name: HistoryStore(root / f"{name}.sqlite3") for name in engines}
        for name, engine in engines.items():
            engine.attach_history(stores[name])
        times: dict[str, list[float]] = {name: [] for name in engines}
        history = [{"cmd": cmd, "exit": 0} for cmd in HISTORY]
        for r in range(args.rounds):
            for c, cmd in enumerate(COMMANDS):
                for i in range(len(cmd) + 1):
                    order = list(engines) if (r + c + i) % 2 == 0 else list(reversed(engines))
                    for name in order:
                        ctx = {"input": cmd[:i], "cwd": str(folder), "git": "main", "history": history}
                        start = time.perf_counter()
                        for _ in engines[name].complete(ctx, 5, f"s{r}-{c}", threading.Event()):
                            pass
                        times[name].append(time.perf_counter() - start)
        for store in stores.values():
            store.close()
    n = len(times["packaged"])
    print(f"{n} keystrokes per engine, alternated; load average {os.getloadavg()[0]:.2f}; ms\n")
    print(f"{'':<10}{'p50':>8}{'p90':>8}{'p99':>8}")
    for name, values in times.items():
        print(f"{name:<10}{statistics.median(values) * 1e3:>8.2f}{pct(values, 0.9) * 1e3:>8.2f}"
              f"{pct(values, 0.99) * 1e3:>8.2f}")  # fmt: skip
    prefills = engines["packaged"].next_words.prefills
    print(f"\nnext-word prefills: {prefills} of {n} keystrokes (packaged), "
          f"{engines['baseline'].next_words.prefills} (baseline)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
