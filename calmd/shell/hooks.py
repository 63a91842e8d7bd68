"""The shell hooks' files: `calmd init zsh|bash|fish` (the hook, with the helper's and the
search's command lines baked in), the hook file the setup lines source, and `calm enable|disable`
(a flag file every hook reads)."""

from __future__ import annotations

import argparse
import functools
import logging
import shlex
import subprocess
import sys
from pathlib import Path

from calmd import paths
from calmd.atomic import atomic_write, read_regular_file

SHELLS = ("zsh", "bash", "fish")
HOOK_FILE_LIMIT = 1 << 20  # a hook file is about 25 KiB; anything far larger is not ours

log = logging.getLogger("calmd.shell.helper")


def disabled_flag() -> Path:
    return paths.data_dir() / paths.DISABLED_FLAG


def log_path() -> Path:
    return paths.data_dir() / paths.HELPER_LOG


def script_path(shell: str) -> Path:
    """client/calm.<shell> beside the package (a source or editable install), else inside it."""
    here = paths.PACKAGE_DATA.parent
    for folder in (here.parent / "client", paths.PACKAGE_DATA / "client"):
        candidate = folder / paths.HOOK_FILE.format(shell=shell)
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"calm.{shell} is not installed beside {here}")


@functools.cache
def python_command() -> tuple[str, ...]:
    """How the hooks start this calmd's Python: this interpreter by its path, and never the
    `calmd` folder or `calmd.py` of the shell's current folder, which `python -m` imports first
    (a clone of calmd: the hook did nothing there, silently). `-I` (isolated: no current folder,
    no PYTHON* variables, no user site) when it still finds this calmd, as in a virtual
    environment or a system install; else `-P`, which only leaves the current folder out (a
    `pip install --user` calmd, or one on PYTHONPATH). Asked once, of a child started in /."""
    import calmd

    here = Path(calmd.__file__).resolve()
    try:
        found = subprocess.run(
            [sys.executable, "-I", "-c", "import calmd, sys; sys.stdout.write(calmd.__file__)"],
            cwd="/", capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        isolated = found.returncode == 0 and Path(found.stdout).resolve() == here
    except (OSError, subprocess.SubprocessError):
        isolated = False
    return (sys.executable, "-I" if isolated else "-P")


def init_script(shell: str, socket: str | None = None) -> str:
    """The text to `eval` in the rc file: a few baked-in variables, then the hook file."""
    from calmd import __version__

    helper = [*python_command(), "-m", "calmd", "shell-helper", "--shell", shell]
    search = [*python_command(), "-m", "calmd.shell.search_ui"]  # `calm search`, without the CLI's imports
    if socket:
        helper += ["--socket", socket]
        search += ["--socket", socket]
    comment = f"# calmd {__version__} {shell} integration: `calmd init {shell}` (docs/shells.md, Setup)"
    if shell == "fish":
        head = [
            comment,
            "set -g _CALM_HELPER " + " ".join(fish_quote(w) for w in helper),
            "set -g _CALM_SEARCH " + " ".join(fish_quote(w) for w in search),
            f"set -g _CALM_DISABLED_FILE {fish_quote(str(disabled_flag()))}",
        ]
    else:
        head = [
            comment,
            "_CALM_HELPER=(" + " ".join(shlex.quote(w) for w in helper) + ")",
            "_CALM_SEARCH=(" + " ".join(shlex.quote(w) for w in search) + ")",
            f"_CALM_DISABLED_FILE={shlex.quote(str(disabled_flag()))}",
        ]
    return "\n".join(head) + "\n" + script_path(shell).read_text()


def fish_quote(word: str) -> str:
    """`word` as one fish word: single quotes, in which fish reads only \\ and \' as escapes."""
    return "'" + word.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hook_file(shell: str) -> Path:
    """Where `calmd init` keeps its output, for the setup line that sources it without starting
    Python: calm.zsh or calm.bash in the data dir."""
    return paths.data_dir() / paths.HOOK_FILE.format(shell=shell)


def write_hook_file(shell: str, text: str) -> bool:
    """Put `text` in the hook file (atomically, owner-only) unless it holds it already; True when
    written. Never raises: the shell works without the file (its setup line falls back)."""
    path = hook_file(shell)
    try:
        if path.exists() and bytes(read_regular_file(path, limit=HOOK_FILE_LIMIT)) == text.encode():
            return False
        paths.private_dir(path.parent)
        with atomic_write(path) as out:
            out.write(text.encode())
    except OSError as exc:
        log.info("could not write %s: %s", path, exc)
        return False
    return True


def cmd_init(args: argparse.Namespace) -> int:
    """Print the hook, and keep it in the hook file for the setup line that sources it. A hook for
    another socket (`calmd --socket PATH init`) is printed only: the setup line's file is the
    default one, what its fallback `calmd init SHELL` gives."""
    socket = getattr(args, "socket", None)
    text = init_script(args.shell, socket)
    if socket is None:
        write_hook_file(args.shell, text)
    sys.stdout.write(text)
    return 0


def cmd_enable(args: argparse.Namespace) -> int:
    flag = disabled_flag()
    try:
        flag.unlink()
    except FileNotFoundError:
        print("calm: suggestions are on already (they were not disabled)")
        return 0
    print(f"calm: suggestions enabled (removed {flag})")
    return 0


def cmd_disable(args: argparse.Namespace) -> int:
    flag = disabled_flag()
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.touch()
    print(f"calm: suggestions disabled in every shell until `calm enable` (flag file {flag})")
    return 0
