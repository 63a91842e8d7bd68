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
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Report, alternate, daemon
from bench.latency import COMMANDS, HISTORY
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient

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


def served(model: Path, searching: bool = False) -> contextlib.AbstractContextManager[Any]:
    """`calmd serve` of `model` (bench/harness.py); `searching`: with `search_engine`."""
    return daemon(weights=model, command=(sys.executable, __file__, "serve") if searching else None)


def client(stack: contextlib.ExitStack, model: Path, searching: bool) -> CalmClient:
    """A client of a daemon of `model` that lives as long as `stack`."""
    d = stack.enter_context(served(model, searching))
    return stack.enter_context(CalmClient(d.socket, timeout=60))


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


def main() -> dict[str, Any]:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.packaged_weights())
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    report = Report("typing through a suggestion: continuing the previous answer, and a search at every key")
    names = {"continuing the previous answer": False, "a search at every key (before)": True}
    with contextlib.ExitStack() as stack:
        clients = {name: client(stack, args.model, searching) for name, searching in names.items()}
        for c in clients.values():
            for h in HISTORY:
                c.record(h, exit=0, cwd="/home/user/project", session="bench")
        steps: list[str] = []
        for cmd in COMMANDS:
            top = [ask(c, cmd[:1], "bench")[0] for c in clients.values()][0]  # noqa: RUF015 (asks both)
            if top:
                steps += [top[0][:i] for i in range(2, len(top[0]))]
        # the daemon's own time (`done`'s ms) per keystroke typed along the top line
        along = {name: (lambda typed, c=c: ask(c, typed, "bench")[2]) for name, c in clients.items()}
        through = alternate(along, steps)
        stats_through = next(iter(clients.values())).status()["status"]["model"]["answers"]
    report.line(f"typing through the top suggestion: {len(steps)} keystrokes (answered from the previous "
                f"answer: {stats_through['typed_through']}, searched: "
                f"{stats_through['searched']})")  # fmt: skip
    typed_along = report.table("daemon-side, typing along", through, stats=("p50", "p99"))
    report.line("(goal: <= 2 ms p50)")
    with contextlib.ExitStack() as stack:
        clients = {name: client(stack, args.model, searching) for name, searching in names.items()}
        # a session per round: no round answers from the one before (a backspace would)
        keys = [(r, NEW_USER_LINE[:i]) for r in range(args.rounds) for i in range(len(NEW_USER_LINE) + 1)]
        fresh = alternate({name: (lambda key, c=c: ask(c, key[1], f"new-user-{key[0]}")[1:])
                           for name, c in clients.items()}, keys)  # fmt: skip
        stats_new_user = next(iter(clients.values())).status()["status"]["model"]["answers"]
    report.line(f"\na new user, empty history, `{NEW_USER_LINE}` x {args.rounds} (from the previous answer: "
                f"{stats_new_user['typed_through']} of "
                f"{stats_new_user['typed_through'] + stats_new_user['searched']})")  # fmt: skip
    done = report.table(
        "request -> done", {n: [w for w, _ in v] for n, v in fresh.items()}, stats=("p50", "p99")
    )
    own = report.table(
        "daemon-side", {n: [ms for _, ms in v] for n, v in fresh.items()}, stats=("p50", "p99")
    )
    for name, values in fresh.items():
        slowest = sorted(range(len(values)), key=lambda i: values[i][0], reverse=True)[:5]
        where = ", ".join(
            f"{values[i][0]:.1f} ms at {keys[i][1]!r} (round {keys[i][0] + 1})" for i in slowest
        )
        report.line(f"slowest 5, {name}: {where}")
    report.line("(goal: done p99 <= 30 ms)")
    report.machine()
    return {"along": typed_along, "new user done": done, "new user daemon-side": own}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve_searching())
    raise SystemExit(run_tool(PROG, main))
