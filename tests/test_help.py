"""`calm --help` and `calmd --help` as a newcomer reads them (issue 40): each program says what it is
for and names its commands, every command's `--help` says what it does, every argument has a line,
and what the help says of a flag is what the flag does."""

from __future__ import annotations

import argparse
import re
import subprocess

from calmd.cli import calm_parser, calmd_parser
from calmd.shell.hooks import SHELLS
from tests.support.daemon import BIN

INTERNAL = {"shell-helper"}  # started by the hooks, not by a person


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def every_parser(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{path} {name}", sub), *every_parser(sub, f"{path} {name}")]
    return found


def test_each_program_names_its_commands_and_the_other_program() -> None:
    for parser, other in ((calm_parser(), "calmd"), (calmd_parser(), "calm")):
        description = parser.description or ""
        named = set(re.findall(r"[\w-]+", description))
        missing = set(subcommands(parser)) - INTERNAL - named
        assert not missing, f"{parser.prog} --help does not name {sorted(missing)}: {description}"
        assert f"`{other} --help`" in description, description


def test_every_command_says_what_it_does_and_every_argument_has_a_line() -> None:
    for parser, prog in ((calm_parser(), "calm"), (calmd_parser(), "calmd")):
        for path, sub in every_parser(parser, prog):
            assert sub.description and len(sub.description) > 10, f"{path} --help has no description"
            kinds = (argparse._HelpAction, argparse._SubParsersAction)
            silent = [
                a.option_strings or [a.dest] for a in sub._actions if not a.help and not isinstance(a, kinds)
            ]
            assert not silent, f"{path}: arguments without help: {silent}"


def test_what_the_help_says_of_a_flag_is_what_it_does() -> None:
    serve = subcommands(calmd_parser())["serve"]
    (no_import,) = [a for a in serve._actions if "--no-import" in a.option_strings]
    # the first start imports the history files of all three shells
    assert all(shell in str(no_import.help) for shell in SHELLS), no_import.help
    # calm init cannot run without -o: the usage says so, as the help line does
    init = subprocess.run([str(BIN / "calm"), "init", "--help"], capture_output=True, text=True, check=True)
    usage = init.stdout.split("\n\n", 1)[0]
    assert " -o PATH" in usage and "[-o PATH]" not in usage, usage
    refused = subprocess.run([str(BIN / "calm"), "init"], capture_output=True, text=True)
    assert refused.returncode == 1 and "-o FILE" in refused.stderr and len(refused.stderr.splitlines()) == 1
