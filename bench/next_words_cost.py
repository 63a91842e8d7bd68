"""What the model's word on a drawn head costs a new user's keystroke (issue 41), in process.

    git show main:calmd/data/ghost.json > /tmp/old-ghost.json
    python bench/next_words_cost.py --baseline-rule /tmp/old-ghost.json [--rounds 3]

Two engines of this tree with the packaged model and an empty history each (the newborn rule):
one with the packaged ghost rule, whose young rules weigh a head by the model's probability of
its words (calmd/suggest/next_words.py: a prefill of the drawn line's next bytes), and one with
the rule file given (an older rule that asks the model nothing). bench/latency.py's commands are
typed one character at a time in a git repository (git lines are drawable there), each command
in a session of its own, every keystroke asked of both engines, the order reversed at every step
(bench/harness.py `alternate`), so both see the same machine state. Prints p50 / p90 / p99 of each, and how
many keystrokes ran a next-word prefill (the rest asked nothing, or typed along a line scored
already). bench/ab_latency.py measures the same through the socket against another checkout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Report, alternate, timed
from bench.latency import COMMANDS, HISTORY
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.atomic import parse_json

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
    report = Report("a new user's keystroke: the packaged ghost rule against an older one, in process")
    history = [{"cmd": cmd, "exit": 0} for cmd in HISTORY]
    with tempfile.TemporaryDirectory(prefix="calm-next-words-") as tmp:
        root = Path(tmp)
        folder = project(root)
        engines = {"packaged": ModelEngine(paths.packaged_weights()),
                   "baseline": ModelEngine(paths.packaged_weights(), ghost=old)}  # fmt: skip
        stores = {name: HistoryStore(root / f"{name}.sqlite3") for name in engines}
        for name, engine in engines.items():
            engine.attach_history(stores[name])

        def keystroke(engine: ModelEngine) -> Callable[[tuple[str, str]], float]:
            def run(step: tuple[str, str]) -> float:
                session, typed = step
                ctx = {"input": typed, "cwd": str(folder), "git": "main", "history": history}
                return timed(lambda: list(engine.complete(ctx, 5, session, threading.Event())))

            return run

        steps = [(f"s{r}-{c}", cmd[:i]) for r in range(args.rounds) for c, cmd in enumerate(COMMANDS)
                 for i in range(len(cmd) + 1)]  # fmt: skip
        found = alternate({name: keystroke(engine) for name, engine in engines.items()}, steps)
        times: dict[str, Sequence[float]] = {name: [float(t) for t in ts] for name, ts in found.items()}
        for store in stores.values():
            store.close()
    report.table("complete()", times, stats=("p50", "p90", "p99"), scale=1e3)
    report.line(f"next-word prefills: {engines['packaged'].next_words.prefills} of {len(steps)} keystrokes "
                f"(packaged), {engines['baseline'].next_words.prefills} (baseline)")  # fmt: skip
    report.machine()


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
