"""Issue 22's new user against a previous release: folded into bench/keystrokes.py, which this
command runs (`--typing new-user`, the default, beside `--baseline`).

    python bench/new_user.py [--baseline REV] [--rounds 10]

REV (default 6ebedc4: main before the trust, context and typing-through work) is taken out of this
repository with `git archive`; bench/keystrokes.py says what is typed and measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import keystrokes
from calmd.arguments import Parser, run_tool

PROG = "bench/new_user.py"


def main() -> object:
    parser = Parser(prog=PROG, description=__doc__)
    parser.add_argument(
        "--baseline", default=keystrokes.BASELINE, help="the release beside (default %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="times the line is typed, each a new session")
    args = parser.parse_args()
    return keystrokes.main(["--baseline", args.baseline, "--rounds", str(args.rounds)], prog=PROG)


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
