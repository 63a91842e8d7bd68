"""The first request after a command, with and without the daemon preparing it at `record`.

    python bench/prefetch.py [--model FILE.cwgt] [--user FILE.txt] [--lines 40] [--think 0.3]

Two `calmd serve` daemons with the same weights in scratch HOMEs, one as shipped and one started
with `--no-prefetch`; both get the same real-sized history (the first 300 lines of a public
history, default one the packaged model never saw), then the next `--lines` lines of it are
replayed: `record`, a pause of `--think` seconds (the prompt coming back, the user reading it),
then, on even lines, the empty-prompt request and the request for the line's first character,
as zsh sends them; on odd lines the first character's request alone (zsh with CALM_PREDICT=0, or
bash, which asks only when its key is pressed). Requests alternate between the daemons line by
line, so both see the same machine state.
Measured client side: request -> first candidate and -> done, p50 / p99, per case; and with
`--think 0`, the empty-prompt request sent right after the record's reply (zsh's order: the
prefetch is still running and the request waits for it, when its context is the one prepared).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Report, alternate, daemon
from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient
from calmd.training.corpus import read_history

DEFAULT_USER = Path("/work/shared/data/histories/users")
CWD = "/home/user/project"


def first_and_done(c: CalmClient, text: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    for m in c.complete(text, n=5, session="bench", cwd=CWD, git="main"):
        if first is None and "candidate" in m:
            first = time.perf_counter() - t0
    done = time.perf_counter() - t0
    return (first if first is not None else done) * 1e3, done * 1e3


def default_user() -> Path:
    from calmd.training.corpus import held_out

    files = sorted(DEFAULT_USER.glob("*.txt"))
    return next(f for f in files if held_out(f.stem) and len(read_history(f)) > 400)


PROG = "bench/prefetch.py"


def main() -> dict[str, object]:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=paths.packaged_weights())
    parser.add_argument("--user", type=Path, help="a history file (default: a held-out public one)")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--think", type=float, default=0.3, help="seconds between a record and the next key")
    args = parser.parse_args()
    user = args.user or default_user()
    lines = read_history(user)
    past, replayed = lines[:300], lines[300 : 300 + args.lines]
    cases = ("empty prompt", "first character", "first character alone")
    report = Report("the first request after a command, prepared at `record` or not")
    with contextlib.ExitStack() as stack:
        variants = {"prepared at record": (), "--no-prefetch (before)": ("--no-prefetch",)}
        clients = {}
        for name, extra in variants.items():
            d = stack.enter_context(daemon(weights=args.model, args=("--no-import", *extra)))
            clients[name] = stack.enter_context(CalmClient(d.socket, timeout=60))
        for c in clients.values():
            for cmd in past:
                c.record(cmd, exit=0, cwd=CWD, git="main", session="bench")
            first_and_done(c, "")  # the session's context (cwd, git) is known from here on

        def replay(c: CalmClient) -> Callable[[tuple[int, str]], dict[str, tuple[float, float]]]:
            def line(at: tuple[int, str]) -> dict[str, tuple[float, float]]:
                i, cmd = at
                # zsh asks for the empty prompt at once; with CALM_PREDICT=0, or bash, the first key asks
                asked = (
                    list(zip(cases[:2], ("", cmd[:1]), strict=True)) if i % 2 == 0 else [(cases[2], cmd[:1])]
                )
                c.record(cmd, exit=0, cwd=CWD, git="main", session="bench")
                time.sleep(args.think)  # the prompt coming back, the user reading it: what is measured
                return {case: first_and_done(c, text) for case, text in asked}

            return line

        got = alternate({name: replay(c) for name, c in clients.items()}, list(enumerate(replayed)))
        stats = clients["prepared at record"].status()["status"]
    report.line(f"model {args.model}; history {user.name}: 300 lines, then {len(replayed)} replayed; "
                f"think {args.think:g} s")  # fmt: skip
    report.line(f"prefetch: {stats['prefetch']}; answers: {stats['model']['answers']}")
    figures = {}
    for case in cases:
        for k, what in ((0, "first candidate"), (1, "done")):
            samples = {
                name: [keys[case][k] for keys in values if case in keys] for name, values in got.items()
            }
            figures[f"{case}, {what}"] = report.table(
                f"{case}, request -> {what}", samples, stats=("p50", "p99")
            )
    report.machine()
    return figures


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
