"""What every command group shares: the console, `run` (arguments.run_tool: one-line errors and exit
codes), argparse types."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from calmd import paths
from calmd.arguments import run_tool
from calmd.visible import quoted

if TYPE_CHECKING:
    from rich.console import Console

    from calmd.shell.client import CalmClient


def new_console(no_color: bool = False) -> Console:
    from rich.console import Console

    return Console(highlight=False, no_color=no_color, soft_wrap=True)


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    paths.set_private_umask()  # what calm and calmd write holds history: 0600 files, 0700 folders
    args = parser.parse_args(argv)  # a usage error: one line, exit 2 (arguments.Parser)
    return run_tool(parser.prog, lambda: int(args.func(args)))


def probability(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def connect(args: argparse.Namespace) -> CalmClient:
    from calmd.shell.client import CalmClient

    return CalmClient(Path(args.socket) if args.socket else None, timeout=args.timeout)
