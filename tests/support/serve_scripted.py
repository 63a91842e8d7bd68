"""`calmd serve` with the scripted engine of tests/support/scripted_engine.py in place of the model.

    python -m tests.support.serve_scripted serve [calmd serve's options]

The same parser, server and socket as the installed `calmd`; only the engine loader differs, so
tests of the protocol, the scheduler and the shells run without a model's latency.
"""

from __future__ import annotations

import sys

from calmd import cli, paths
from tests.support.scripted_engine import load


def main() -> int:
    paths.set_private_umask()
    args = cli.calmd_parser().parse_args(sys.argv[1:])
    assert args.func is cli.cmd_serve, "tests.support.serve_scripted only serves"
    return cli.cmd_serve(args, engine_loader=load)


if __name__ == "__main__":
    sys.exit(main())
