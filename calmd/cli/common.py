"""What every command group shares: the console, one-line errors and exit codes, argparse types."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from calmd import paths
from calmd.errors import CalmError
from calmd.visible import visible

if TYPE_CHECKING:
    from rich.console import Console

    from calmd.shell.client import CalmClient


def new_console(no_color: bool = False) -> Console:
    from rich.console import Console

    return Console(highlight=False, no_color=no_color, soft_wrap=True)


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):
        return False


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    paths.set_private_umask()  # what calm and calmd write holds history: 0600 files, 0700 folders
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError as exc:
        if _stdout_closed():  # `calm ... | head`: the reader of our output left; say no more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        print(f"{parser.prog}: error: {visible(str(exc))}", file=sys.stderr)  # a socket, not our stdout
        return 1
    except (CalmError, OSError) as exc:
        print(f"{parser.prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{parser.prog}: error: out of memory; give smaller counts or files", file=sys.stderr)
        return 1
    except Exception as exc:
        # A bug, not the user's input (every input has its own message): still one line, and
        # CALM_DEBUG=1 shows where.
        if os.environ.get("CALM_DEBUG"):
            raise
        print(f"{parser.prog}: error: unexpected {type(exc).__name__}: {one_line(exc)} (a bug in calm; "
              "run again with CALM_DEBUG=1 and report what it prints)", file=sys.stderr)  # fmt: skip
        return 1


def one_line(exc: BaseException) -> str:
    """The error as one line; an OSError as `FILE: what` (its text would be `[Errno 21] ...`).
    What it quotes (a file name, a value) is `visible`: an error never drives the terminal."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, CalmError):
        where = exc.filename2 if isinstance(exc, IsADirectoryError) and exc.filename2 else exc.filename
        text = f"{where}: {exc.strerror}" if where else exc.strerror
        return visible(" ".join(text.split()))
    return visible(" ".join(str(exc).split())) or type(exc).__name__


def probability(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def connect(args: argparse.Namespace) -> CalmClient:
    from calmd.shell.client import CalmClient

    return CalmClient(Path(args.socket) if args.socket else None, timeout=args.timeout)
