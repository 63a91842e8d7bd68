"""The `calm` (your history, its search and sync, the model's tools) and `calmd` (the daemon and
the shell hooks) command lines: one module per command group.

    common.py    the console, one-line errors and exit codes (`run`), argparse types
    formats.py   calm tokenize, detokenize, inspect
    dataset.py   calm dataset (its flags are DatasetOptions' fields)
    model.py     calm init, train, evaluate, generate, rollback
    history.py   calm import, search, history, stats, forget
    sync.py      calm sync (now, key): the history shared between machines (calmd/sync/)
    replay.py    calm replay
    shell.py     calm enable, disable; calmd init, shell-helper
    daemon.py    calmd serve (its flags are ServerConfig's fields), status, stop, complete, install-systemd
    status_view.py, systemd.py: what `calmd status` draws and the user units `install-systemd` writes

Every error a user can cause (a bad file, a bad id) prints one line `calm: error: ...` naming the
file and field, and exits 1; usage errors exit 2 (argparse). Nothing here imports torch: the
handlers import what they need when they run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from calmd import __version__
from calmd.arguments import Parser, number
from calmd.cli import daemon, dataset, formats, history, model, replay, shell, sync
from calmd.cli.common import run
from calmd.cli.daemon import SERVE_FLAGS, cmd_serve
from calmd.cli.dataset import DATASET_FLAGS
from calmd.cli.shell import cmd_shell_helper

__all__ = ["DATASET_FLAGS", "SERVE_FLAGS", "calm_main", "calm_parser", "calmd_main", "calmd_parser",
           "cmd_serve", "cmd_shell_helper"]  # fmt: skip


def calm_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="calm",
        description="calm: your shell history (import, search, history, stats, forget, sync), the "
        "suggestions' switch (enable, disable), and the CALM model's tools (init, train, evaluate, "
        "generate, rollback, replay, dataset, tokenize, detokenize, inspect). The daemon the shells "
        "talk to is `calmd`: see `calmd --help`.",
    )
    parser.add_argument("--version", action="version", version=f"calm {__version__}")
    parser.add_argument("--no-color", action="store_true", help="plain output (NO_COLOR is honoured too)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # a newcomer's order: the history first, then the shells' switch, then the model's tools
    for group in (history.add_parsers, sync.add_parsers, shell.add_calm_parsers, model.add_parsers,
                  replay.add_parsers, dataset.add_parsers, formats.add_parsers):  # fmt: skip
        group(sub)
    return described(parser)


def calmd_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="calmd",
        description="calmd: the daemon that suggests commands to your shells, records what you run "
        "and learns from it (serve, status, stop, train, complete, install-systemd), and the shell "
        "hooks (init). Your history and the model's tools are `calm`: see `calm --help`.",
    )
    parser.add_argument("--version", action="version", version=f"calmd {__version__}")
    parser.add_argument("--no-color", action="store_true", help="plain output (NO_COLOR is honoured too)")
    parser.add_argument(
        "--socket", metavar="PATH", help="socket path (default $CALMD_SOCKET or the runtime dir)"
    )
    parser.add_argument("--timeout", type=number(0, 86400, above=True), default=10.0,
                        help="seconds to wait for the daemon")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    daemon.add_parsers(sub)
    shell.add_calmd_parsers(sub)
    return described(parser)


def described(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every subcommand without a description of its own its help line as one, so that
    `calm COMMAND --help` says what COMMAND does, not only its usage (its subcommands too)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    text = str(helps[name])
                    sub.description = text[0].upper() + text[1:] + "."
                described(sub)
    return parser


def calm_main(argv: Sequence[str] | None = None) -> int:
    return run(calm_parser(), argv)


def calmd_main(argv: Sequence[str] | None = None) -> int:
    return run(calmd_parser(), argv)
