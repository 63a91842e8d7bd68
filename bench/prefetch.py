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
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from latency import pct  # noqa: E402
from typing_through import daemon  # noqa: E402

from calmd import paths  # noqa: E402
from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.shell.client import CalmClient  # noqa: E402
from calmd.training.corpus import read_history  # noqa: E402

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


def main() -> None:
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
    got: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        name: {case: ([], []) for case in cases} for name in ("prefetch", "none")
    }
    with (
        daemon(args.model) as sock_on, daemon(args.model, extra=("--no-prefetch",)) as sock_off,
        CalmClient(sock_on, timeout=30) as on, CalmClient(sock_off, timeout=30) as off,
    ):  # fmt: skip
        for c in (on, off):
            for cmd in past:
                c.record(cmd, exit=0, cwd=CWD, git="main", session="bench")
            first_and_done(c, "")  # the session's context (cwd, git) is known from here on
        for i, cmd in enumerate(replayed):
            # zsh asks for the empty prompt at once; with CALM_PREDICT=0, or bash, the first key asks
            asked = list(zip(cases[:2], ("", cmd[:1]), strict=True)) if i % 2 == 0 else [(cases[2], cmd[:1])]
            for name, c in (("prefetch", on), ("none", off)):
                c.record(cmd, exit=0, cwd=CWD, git="main", session="bench")
                time.sleep(args.think)
                for case, text in asked:
                    first, done = first_and_done(c, text)
                    got[name][case][0].append(first)
                    got[name][case][1].append(done)
        stats = on.status()["status"]
    load = os.getloadavg()
    print(f"model {args.model}; history {user.name}: 300 lines, then {len(replayed)} replayed; "
          f"think {args.think:g} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print(f"prefetch: {stats['prefetch']}; answers: {stats['model']['answers']}\n")
    print(f"{'ms':<36}{'first p50':>10}{'first p99':>10}{'done p50':>10}{'done p99':>10}")
    for case in cases:
        for name, label in (("prefetch", "prepared at record"), ("none", "--no-prefetch (before)")):
            first, done = got[name][case]
            print(f"{case + ', ' + label:<36}{pct(first, .5):>10.2f}{pct(first, .99):>10.2f}"
                  f"{pct(done, .5):>10.2f}{pct(done, .99):>10.2f}")  # fmt: skip
        ratio = pct(got["prefetch"][case][0], 0.5) / pct(got["none"][case][0], 0.5)
        print(f"{case}: first-candidate p50 ratio {ratio:.2f}x")


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
