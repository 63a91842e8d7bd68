"""Command-line arguments that cannot take the tools down: argparse with one-line errors, and
number types with their ranges (`calm`, `calmd`, `python -m calmd.training.recipe`).

A count of -3 sampled nothing and exited 0, a count of 100,000 made a beam search of 100,000
rows (16 GB): every number a command line takes has a range, checked before anything runs, and
a value outside it is one line that says what to give instead. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from calmd.errors import CalmError
from calmd.visible import visible

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


def whole(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
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
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < low or value > high or (above and value == low):
            lower = f"more than {low:g}" if above else f"{low:g} or more"
            span = lower if high == math.inf else f"{lower}, at most {high:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {span}")
        return value

    parse.__name__ = "number"
    return parse


def run_tool(prog: str, main: Callable[[], int]) -> int:
    """`python -m calmd....`'s entry: an error the user can fix (a missing data folder, a bad
    file) is one line on stderr and exit 1, never a traceback."""
    try:
        return main()
    except (CalmError, OSError) as exc:
        print(f"{prog}: error: {visible(' '.join(str(exc).split()))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


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
