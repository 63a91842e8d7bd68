"""`calmd init`, `calmd shell-helper`, `calm enable` and `calm disable`: the shell hooks."""

from __future__ import annotations

import argparse

from calmd.arguments import Parser, whole
from calmd.shell import helper as shell_helper  # imports nothing heavy: the parsers name its commands
from calmd.shell import hooks


def cmd_shell_helper(args: argparse.Namespace) -> int:
    """The per-shell helper: fish's (request files, `--spool`) or bash's and zsh's (pipes)."""
    if args.spool:
        from calmd.shell import spool

        return spool.cmd_fish_helper(args)
    return shell_helper.cmd_shell_helper(args)


def add_calm_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """enable, disable (calm)"""
    p = sub.add_parser(
        "enable", help="turn shell suggestions back on in every shell",
        description="Turn suggestions back on after `calm disable`, in every shell with the hook, from "
        "its next prompt (removes the flag file in the data dir). Recording is not affected.",
    )  # fmt: skip
    p.set_defaults(func=hooks.cmd_enable)
    p = sub.add_parser(
        "disable", help="turn shell suggestions off in every shell",
        description="Turn suggestions off in every shell with the hook, from its next prompt, until "
        "`calm enable` (a flag file in the data dir). The shells still record what you run (CALM_RECORD=0 "
        "stops that in one shell) and the daemon keeps running (`calmd stop`).",
    )  # fmt: skip
    p.set_defaults(func=hooks.cmd_disable)


def add_calmd_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """init, shell-helper (calmd)"""
    p = sub.add_parser(
        "init", help="print the shell hook (for ~/.zshrc, ~/.bashrc, fish's config.fish)",
        description="Print the hook for SHELL and keep it in the data dir (calm.zsh, calm.bash, "
        "calm.fish), where the setup line of README.md sources it without starting Python. In the rc "
        'file: eval "$(calmd init zsh)", eval "$(calmd init bash)", or calmd init fish | source.',
    )  # fmt: skip
    p.add_argument("shell", choices=hooks.SHELLS, metavar="SHELL", help="zsh, bash or fish")
    p.set_defaults(func=hooks.cmd_init)
    p = sub.add_parser("shell-helper", help="the per-shell helper the hooks start (line protocol)")
    p.add_argument("--session", default="", help="session id (default: from the parent pid)")
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="socket path")
    p.add_argument("--autostart", action="store_true", help="start `calmd serve` once when no daemon answers")
    p.add_argument("--format", type=int, choices=(1, 2, 3), default=1,
                   help="line format (zsh's hook uses 3, bash's and fish's 2)")  # fmt: skip
    p.add_argument("--shell", choices=hooks.SHELLS, help="the hook file to rewrite when calmd changes")
    p.add_argument(
        "--shell-pid",
        type=whole(1, 1 << 22),
        metavar="PID",
        help="the shell's pid: the helper goes when it ends (default: the helper's parent)",
    )
    p.add_argument("--spool", metavar="DIR",
                   help="read requests from files in DIR and answer through DIR/reply (fish, which "
                   "cannot keep a pipe open: calmd/shell/spool.py)")  # fmt: skip
    p.set_defaults(func=cmd_shell_helper)
