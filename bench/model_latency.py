"""Keystroke latency of several weight files through the real daemon, side by side: folded into
bench/keystrokes.py, which this command runs (the new user's typing, this tree's daemons).

    python bench/model_latency.py [--sizes nano,micro,mini] [--model NAME=FILE.cwgt ...] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import keystrokes
from calmd.arguments import Parser, run_tool

PROG = "bench/model_latency.py"


def main() -> object:
    parser = Parser(prog=PROG, description=__doc__)
    parser.add_argument("--sizes", default="", help="comma-separated sizes to add with random weights")
    parser.add_argument("--model", type=keystrokes.named_model, action="append", default=[],
                        metavar="NAME=FILE",
                        help="a weight file to add (repeatable)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="times the line is typed (default 3)")
    args = parser.parse_args()
    argv = ["--sizes", args.sizes, "--rounds", str(args.rounds)]
    for name, file in args.model:
        argv += ["--model", f"{name}={file}"]
    return keystrokes.main(argv, prog=PROG)


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
