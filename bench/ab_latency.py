"""Keystroke latency of this tree's daemon against another checkout's: folded into
bench/keystrokes.py, which this command runs (`--typing commands`).

    python bench/ab_latency.py --baseline DIR [--rounds 2] [--store-history] [--real-cwd]

DIR: a checkout of another commit (`git archive <commit> | tar -x -C DIR`), or a commit.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import keystrokes
from calmd.arguments import Parser, run_tool

PROG = "bench/ab_latency.py"


def main() -> object:
    parser = Parser(prog=PROG, description=__doc__)
    parser.add_argument("--baseline", required=True, help="the other checkout")
    parser.add_argument("--real-cwd", action="store_true", help="type in a folder that exists (COMP)")
    parser.add_argument("--rounds", type=int, default=2, help="times the commands are typed (default 2)")
    parser.add_argument(
        "--store-history", action="store_true", help="record the history instead of sending it"
    )
    args = parser.parse_args()
    argv = ["--typing", "commands", "--baseline", args.baseline, "--rounds", str(args.rounds)]
    argv += ["--real-cwd"] * args.real_cwd + ["--store-history"] * args.store_history
    return keystrokes.main(argv, prog=PROG)


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
