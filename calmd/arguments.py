"""Command-line arguments that cannot take the tools down: argparse with one-line errors, number
types with their ranges, and `run_tool`, the one way every tool (`calm`, `calmd`, `python -m
calmd....`, bench/) reports an error: `PROG: error: FILE: what`, one line, exit 1 (2 for usage).

A count of -3 sampled nothing and exited 0, a count of 100,000 made a beam search of 100,000
rows (16 GB): every number a command line takes has a range, checked before anything runs, and
a value outside it is one line that says what to give instead. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from calmd.errors import CalmError, one_line
from calmd.visible import quoted, visible

INT64_MAX = (1 << 63) - 1
# A config dataclass's flags: field -> (the flag's names, argparse's keywords but its default)
Flags = Mapping[str, tuple[tuple[str, ...], dict[str, Any]]]
C = TypeVar("C")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `prog: error: what; see prog --help` (its
    subcommands' parsers too: add_subparsers makes them of the parser's class), what it quotes
    of the command line `visible` (calmd/visible.py)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {visible(message)}; see `{self.prog} --help`\n")

    # argparse quotes the value it refuses with %r (an invalid choice, an `int` that is not one):
    # `'\\udcff'` for the byte 0xff. Each refusal's message has it `quoted` (calmd/visible.py).
    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            raise _requoted(exc, action, arg_string) from None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            raise _requoted(exc, action, value) from None


def _requoted(exc: argparse.ArgumentError, action: argparse.Action, value: object) -> argparse.ArgumentError:
    """`exc` with argparse's `repr` of `value` replaced by `quoted`."""
    if not isinstance(value, str):
        return exc
    return argparse.ArgumentError(action, exc.message.replace(repr(value), quoted(value)))


def whole(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not a whole number") from None
        if not low <= value <= high:
            span = f"{low} or more" if high == INT64_MAX else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {span}")
        return value

    parse.__name__ = "whole number"  # what argparse names in its messages
    return parse


def number(low: float, high: float = math.inf, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high], or in (low, high] with `above`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not a number") from None
        if not math.isfinite(value) or value < low or value > high or (above and value == low):
            lower = f"more than {low:g}" if above else f"{low:g} or more"
            span = lower if high == math.inf else f"{lower}, at most {high:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {span}")
        return value

    parse.__name__ = "number"
    return parse


def run_tool(prog: str, main: Callable[[], object]) -> int:
    """Every tool's entry (`calm`, `calmd`, `python -m calmd....`, bench/): what `main` raises is
    one line on stderr, `PROG: error: FILE: what` (calmd/errors.py's `one_line`), never a
    traceback. The exit status: what `main` returns when it is one (a bench's figures are not:
    0), 1 for an error, 2 for a usage error (`Parser.error`, before `main` runs anything), 130
    for Ctrl-C, 141 when the reader of stdout left (`calm ... | head`)."""
    try:
        status = main()
    except SystemExit as exc:
        if not isinstance(exc.code, str):  # argparse's usage error (2), --help (0), an exit status
            raise
        # a bench's `raise SystemExit("calmd did not start")`: Python would print it bare
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError as exc:
        if _stdout_closed():  # the reader of our output left; say no more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)  # a socket, not our stdout
        return 1
    except (CalmError, OSError) as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{prog}: error: out of memory; give smaller counts or files", file=sys.stderr)
        return 1
    except Exception as exc:
        # A bug, not the user's input (every input has its own message): still one line, and
        # CALM_DEBUG=1 shows where.
        if os.environ.get("CALM_DEBUG"):
            raise
        print(f"{prog}: error: unexpected {type(exc).__name__}: {one_line(exc)} (a bug in calm; "
              "run again with CALM_DEBUG=1 and report what it prints)", file=sys.stderr)  # fmt: skip
        return 1
    return status if isinstance(status, int) else 0


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):
        return False


def add_flags(parser: argparse.ArgumentParser | Any, config: type[Any], flags: Flags) -> None:
    """One flag per field of the frozen dataclass `config`, with the field's default: a default is
    written once, in the dataclass that travels with what it configures, and the help says it."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for name, (names, keywords) in flags.items():
        assert name in defaults and defaults[name] is not dataclasses.MISSING, f"{config.__name__}.{name}"
        kw = {"dest": name, **keywords, "default": defaults[name]}
        if kw.get("action") != "store_true" and "help" in kw:
            kw["help"] = f"{kw['help']} (default {defaults[name]})"
        parser.add_argument(*names, **kw)


def config_from(config: type[C], args: argparse.Namespace, flags: Flags, **more: Any) -> C:
    """The dataclass `config` from the parsed flags of `add_flags` (and fields given in `more`)."""
    return config(**{name: getattr(args, name) for name in flags}, **more)
