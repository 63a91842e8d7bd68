"""The scenarios every shell hook must pass, written once and run in a real bash, zsh and fish
inside tmux against a real daemon (the scripted engine of tests/support/scripted_engine.py: history
prefix matches first, then `input + suffix` candidates: mmit, mmand, nfig, py, unt).

What differs between the shells is only how a suggestion is asked for and seen (a `Shell` below):
zsh draws the rest of the line as ghost text while the user types; bash and fish put the
candidate into the line on Shift-Tab. Each shell's own behaviour (zsh's widgets and plugins,
bash's PROMPT_COMMAND and DEBUG trap, fish's events and spool) stays in test_shell_<name>.py.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, Daemon, daemon_env, running_daemon, wait_imported
from tests.support.tmux import (
    SETUP_LINES,
    Terminal,
    assert_quiet,
    bash_terminal,
    calm_cli,
    fish_terminal,
    history_rows,
    record,
    wait_recorded,
    zsh_terminal,
)
from tests.support.tools import need
from tests.support.waiting import HANG_S, wait_until

GHOST = re.escape("\x1b[90m")  # how tmux shows zsh's ghost text (region_highlight fg=8)

pytestmark = [pytest.mark.slow]  # real shells in tmux


@dataclass(frozen=True)
class Shell:
    name: str
    terminal: Callable[..., Terminal]
    ghost: bool  # zsh: the suggestion is drawn while typing; bash, fish: Shift-Tab inserts it
    status: str  # the last command's exit status, as the shell spells it

    def start(self, home: Path, **kwargs: str) -> Terminal:
        term = self.terminal(home, **kwargs)
        term.wait_for("^PROMPT>")
        return term

    def suggests(self, term: Terminal, typed: str, line: str, *, timeout: float = HANG_S) -> None:
        """Type `typed` on an empty prompt and see the shell offer `line` in the user's way."""
        term.type(typed)
        if self.ghost:
            rest = re.escape(line.removeprefix(typed))
            term.wait_line(rf"^PROMPT> {re.escape(typed)}{GHOST}{rest}", escapes=True, timeout=timeout)
        else:
            term.send("BTab")
            term.wait_line(rf"^PROMPT> {re.escape(line)}\s*$", timeout=timeout)
        term.send("C-u")

    def offers_nothing(self, term: Terminal, typed: str) -> None:
        """Type `typed` and ask: the line stays as typed, with no ghost, and the shell goes on."""
        term.type(typed)
        if not self.ghost:
            term.send("BTab")
            term.keys_handled()  # the key waited for its answer
        else:
            # (zsh draws an answer when it comes, not on a key: this is as long as a test waits
            # for something that should not happen; a busy machine can only make it miss one)
            time.sleep(1.0)
        if self.ghost:
            assert "\x1b[90m" not in term.line(escapes=True), term.line(escapes=True)
        else:
            assert term.line().rstrip() == f"PROMPT> {typed}", term.line()
        term.send("C-u")

    def run(self, term: Terminal, cmd: str) -> None:
        term.type(cmd)
        term.send("Enter")


SHELLS = [
    pytest.param(Shell("bash", bash_terminal, False, "$?"), marks=pytest.mark.needs("bash", "tmux"),
                 id="bash"),
    pytest.param(Shell("zsh", zsh_terminal, True, "$?"), marks=pytest.mark.needs("zsh", "tmux"),
                 id="zsh"),
    pytest.param(Shell("fish", fish_terminal, False, "$status"),
                 marks=pytest.mark.needs("fish", "tmux", "timeout"), id="fish"),
]  # fmt: skip


@pytest.mark.parametrize("shell", SHELLS)
def test_each_command_is_recorded_as_it_was_typed(home: Path, daemon: Daemon, shell: Shell) -> None:
    """Its exit status, and the folder and branch it was typed in (a `cd` line too); a line that
    starts with a space is not kept."""
    need("git")
    proj = home / "proj"
    proj.mkdir()
    for path, branch in ((home, "trunk"), (proj, "feature")):
        subprocess.run(["git", "-c", f"init.defaultBranch={branch}", "init", "-q", str(path)], check=True)
    with shell.start(home) as term:
        for cmd in ("false", "sh -c 'exit 3'", " echo secret-calm", "cd proj", "echo in-proj", "cd .."):
            shell.run(term, cmd)
            if not cmd.startswith(" "):
                wait_recorded(home, cmd)
        rows = {r.cmd: r for r in history_rows(home)}
        assert rows["false"].exit == 1
        assert rows["sh -c 'exit 3'"].exit == 3
        assert (rows["cd proj"].cwd, rows["cd proj"].git) == (str(home), "trunk")
        assert (rows["echo in-proj"].cwd, rows["echo in-proj"].git) == (str(proj), "feature")
        assert (rows["cd .."].cwd, rows["cd .."].exit) == (str(proj), 0)
        assert not [cmd for cmd in rows if "secret" in cmd]  # recorded in order: it would be there
        assert_quiet(term.screen())


@pytest.mark.parametrize("shell", SHELLS)
def test_without_a_daemon_the_shell_works_and_says_nothing(home: Path, shell: Shell) -> None:
    with shell.start(home) as term:
        shell.run(term, "echo hello-calm")
        term.wait_for("^hello-calm$")
        shell.offers_nothing(term, "zz-calm")  # in no history: fish suggests nothing either
        started = time.monotonic()
        shell.run(term, "false")
        shell.run(term, f"echo ok-{shell.status}")
        term.wait_for("^ok-1$")  # the hook kept the status for the user's next command
        assert time.monotonic() - started < 3
        assert_quiet(term.screen())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_daemon_restarted_mid_session_is_found_again(home: Path, shell: Shell) -> None:
    """The shell outlives its daemon: nothing is shown while it is away, the command run then is
    recorded once it is back, and the suggestions come again without a new shell."""
    with running_daemon(home) as daemon:
        record(daemon, "make test")
        term = shell.start(home)
        shell.run(term, "true")  # the helper is up and talking (fish starts it on the first record)
        wait_recorded(home, "true")
    try:
        shell.run(term, "echo during-outage")
        term.wait_for("^during-outage$")
        shell.offers_nothing(term, "make t")
        with running_daemon(home):
            shell.suggests(term, "make t", "make test")
            assert wait_recorded(home, "echo during-outage").exit == 0
        assert_quiet(term.screen())
    finally:
        term.close()


@pytest.mark.parametrize("shell", SHELLS)
def test_calm_disable_and_enable_need_no_rc_edit(home: Path, daemon: Daemon, shell: Shell) -> None:
    """Off in every running shell from the next prompt on, commands still recorded; on again."""
    with shell.start(home) as term:
        shell.run(term, "true")
        wait_recorded(home, "true")
        calm_cli(home, "disable")
        term.send("Enter")  # the next prompt sees the flag
        shell.offers_nothing(term, "xyz")
        shell.run(term, "echo while-disabled")
        wait_recorded(home, "echo while-disabled")
        calm_cli(home, "enable")
        term.send("Enter")
        shell.suggests(term, "xyz", "xyzmmit")


@pytest.mark.parametrize("shell", SHELLS)
def test_calm_record_0_pauses_recording_in_this_shell(home: Path, daemon: Daemon, shell: Shell) -> None:
    """README, "Turn it off": `CALM_RECORD=0` typed at a prompt (fish: `set CALM_RECORD 0`), and
    nothing this shell runs is recorded until `CALM_RECORD=1`; suggestions go on meanwhile."""
    pause, resume = (
        ("set CALM_RECORD 0", "set CALM_RECORD 1")
        if shell.name == "fish"
        else ("CALM_RECORD=0", "CALM_RECORD=1")
    )
    with shell.start(home) as term:
        shell.run(term, "echo before-pause")
        wait_recorded(home, "echo before-pause")
        shell.run(term, pause)
        shell.run(term, "echo while-paused")
        term.wait_for("^while-paused$")
        shell.suggests(term, "echo be", "echo before-pause")
        shell.run(term, resume)
        shell.run(term, "echo after-pause")
        wait_recorded(home, "echo after-pause")  # recorded in order: what came before is there now
        recorded = [row.cmd for row in history_rows(home)]
        assert "echo while-paused" not in recorded and pause not in recorded, recorded
        assert_quiet(term.screen())


# The rc lines that make each shell write its own history file as it goes, each entry with its
# time (an entry without one is never matched against the hooks': docs/history.md).
WRITES_HISTORY = {
    "zsh": "HISTFILE=~/.zsh_history SAVEHIST=1000 HISTSIZE=1000; setopt INC_APPEND_HISTORY EXTENDED_HISTORY",
    "bash": "HISTFILE=~/.bash_history HISTTIMEFORMAT='%F %T '",
}


@pytest.mark.parametrize("shell", [s for s in SHELLS if s.id != "fish"])  # fish's: test_shell_fish.py
def test_a_history_file_is_imported_once_and_never_what_was_paused(home: Path, shell: Shell) -> None:
    """Issue 39's scenario in zsh and bash: on a fresh home, the daemon started, then `echo one;
    CALM_RECORD=0; echo paused; CALM_RECORD=1; echo two` (a command a prompt), the shell's own
    history file written (zsh as it goes, bash by `history -a`), and the daemon restarted: its
    first-start import of that file (which holds every line) must neither repeat what the hook
    recorded nor bring back what was paused (the hooks send the paused moments, `p`); nor must a
    `calm import` of the same file after more commands."""
    hist = home / (".zsh_history" if shell.name == "zsh" else ".bash_history")
    flush = [] if shell.name == "zsh" else ["history -a"]  # zsh writes each line as it starts

    def run_all(term: Terminal, lines: list[str]) -> None:
        for line in lines:
            shell.run(term, line)
            term.wait_for(rf"^PROMPT> {re.escape(line)}\n(.*\n)?PROMPT>\s*$")

    typed = ["echo one", "CALM_RECORD=0", "echo paused", "CALM_RECORD=1", "echo two", *flush]
    with shell.start(home, before=WRITES_HISTORY[shell.name], CALM_PREDICT="0") as term:
        # --no-import: the first start's import is left to the restart, after the hook recorded
        with running_daemon(home, args=("--no-import",)):
            run_all(term, typed)
            wait_recorded(home, typed[-1])  # the pauses were sent before it, in order
        assert b"echo paused" in hist.read_bytes()
        with running_daemon(home) as daemon, CalmClient(daemon.socket) as client:
            wait_imported(client)
            logged = daemon.wait_for("recorded already by the shell's hook")
            assert f"{3 + len(flush)} recorded already by the shell's hook" in logged
            assert "2 typed while recording was paused" in logged
            expected = ["echo one", "CALM_RECORD=1", "echo two", *flush]
            assert history_commands(home) == expected
            # more commands, one of them paused, then `calm import` of the file by hand
            more = ["echo three", "CALM_RECORD=0", "echo paused-again", "CALM_RECORD=1", *flush]
            run_all(term, more)
            expected += ["echo three", "CALM_RECORD=1", *flush]
            wait_until(lambda: history_commands(home) == expected, "the last one recorded",
                       report=lambda: str(history_commands(home)))  # fmt: skip
            out = subprocess.run([str(BIN / "calm"), "import", str(hist)], env=daemon_env(home),
                                 capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
            assert out.returncode == 0, out
            assert f"0 commands imported ({shell.name} format)" in out.stdout, out.stdout
            assert "2 typed while recording was paused" in out.stdout, out.stdout
    assert history_commands(home) == expected
    raw = b"".join(p.read_bytes() for p in (home / "data").glob(f"{paths.HISTORY}*"))
    assert b"paused" not in raw and b"CALM_RECORD=0" not in raw


def history_commands(home: Path) -> list[str]:
    """`calm history --commands`, as the user reads it."""
    out = subprocess.run([str(BIN / "calm"), "history", "--commands"], env=daemon_env(home),
                         capture_output=True, text=True, check=True, timeout=HANG_S)  # fmt: skip
    return out.stdout.splitlines()


@pytest.mark.parametrize("shell", SHELLS)
def test_the_setup_line_of_the_docs(home: Path, daemon: Daemon, shell: Shell) -> None:
    """The first start has no hook file: docs/shells.md's line runs `calmd init`, which leaves one
    (owner-only). Later starts source it and start no Python: calmd is not even on the PATH then.
    A hook file from an older calmd is loaded, and the helper rewrites it for the next start."""
    record(daemon, "git status")
    hook = home / "data" / f"calm.{shell.name}"
    assert not hook.exists()
    bin_dir = str(Path(sys.executable).parent)
    with_calmd = f"{bin_dir}:{os.environ['PATH']}"
    without_calmd = ":".join(d for d in os.environ["PATH"].split(":") if d and d != bin_dir)
    assert shutil.which("calmd", path=without_calmd) is None
    with shell.start(home, setup=SETUP_LINES[shell.name], PATH=with_calmd) as term:
        shell.run(term, "true")
        wait_recorded(home, "true")
        shell.suggests(term, "git st", "git status")
    text = hook.read_text()
    assert stat.S_IMODE(hook.stat().st_mode) == 0o600
    hook.write_text(text.replace("# calmd ", "# calmd (an older one) ", 1))
    with shell.start(home, setup=SETUP_LINES[shell.name], PATH=without_calmd) as term:
        shell.run(term, "echo second-start")
        wait_recorded(home, "echo second-start")
        shell.suggests(term, "git st", "git status")
        # the helper rewrites it once it has a moment
        wait_until(
            lambda: hook.read_text() == text, "the hook file rewritten", report=lambda: hook.read_text()[:200]
        )
        assert stat.S_IMODE(hook.stat().st_mode) == 0o600
        assert_quiet(term.screen())


# The folder a clone of calmd leaves: `python -m calmd` run there imports this, not calmd.
SHADOW = 'raise SystemExit("the calmd of the current folder was imported")\n'


@pytest.mark.parametrize("shell", SHELLS)
def test_a_folder_holding_calmd_or_calmd_py_does_not_shadow_the_hook(
    home: Path, daemon: Daemon, shell: Shell
) -> None:
    """The shell starts in a folder with a `calmd/` package and a `calmd.py` that would break:
    commands are recorded, suggestions come, and Ctrl-R opens calm search (the hooks run calmd's
    Python isolated from the current folder, `-I`)."""
    (home / "calmd").mkdir()
    (home / "calmd" / "__init__.py").write_text(SHADOW)
    (home / "calmd.py").write_text(SHADOW)
    record(daemon, "git status")
    with shell.start(home) as term:
        shell.run(term, "echo in-a-clone")
        assert wait_recorded(home, "echo in-a-clone").cwd == str(home)
        shell.suggests(term, "git st", "git status")
        term.send("C-r")
        term.wait_for(r"^ calm search · all")
        term.send("Escape")
        term.wait(lambda screen: "calm search" not in screen, what="the search to close")
        shell.run(term, "echo still-calm")
        wait_recorded(home, "echo still-calm")
        assert_quiet(term.screen())


SAID = "calm: no suggestions or recording in this shell"


def broken_hook(shell: str, home: Path, old: str, new: str) -> str:
    """The shell's rc line: `calmd init`'s hook with `old` replaced by `new` in the commands
    it starts (the helper's, the search's)."""
    from tests.support.tmux import init_script

    path = init_script(shell, home)
    text = path.read_text()
    head, sep, rest = text.partition("\n# calm.")
    assert old in head, head
    path.write_text(head.replace(old, new) + sep + rest)
    if shell == "fish":
        return f"source {path}"
    return f'eval "$(< {path})"'


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("cause", ["the interpreter is gone", "calmd is not importable"])
def test_a_helper_that_cannot_run_is_said_once_and_the_shell_works(
    home: Path, shell: Shell, cause: str
) -> None:
    """A venv deleted or moved (the baked interpreter is missing), or a calmd uninstalled from
    it: one line says so, once, however many prompts and restarts follow; commands run as
    without calm, Ctrl-R is the shell's own search."""
    if cause == "the interpreter is gone":
        setup = broken_hook(shell.name, home, sys.executable, str(home / "gone" / "bin" / "python3"))
    elif shell.name == "fish":
        setup = broken_hook(shell.name, home, "'-m' 'calmd' ", "'-m' 'calmd_not_installed' ")
    else:
        setup = broken_hook(shell.name, home, " -m calmd ", " -m calmd_not_installed ")
    with shell.start(home, setup=setup) as term:
        # A helper that exits is seen at a prompt (bash, fish) or when its pipe ends (zsh);
        # then zsh and bash start one again after 10 s, fish after ten prompts: still one line.
        n, said_at = 0, 0.0
        while not said_at or time.monotonic() < said_at + 11 or n < 15:
            shell.run(term, f"echo run-{n}")
            term.wait_for(f"^run-{n}$")
            n += 1
            if not said_at and SAID in term.tmux("capture-pane", "-p", "-J", "-t", "t", "-S", "-200"):
                said_at = time.monotonic()
            assert said_at or n < 40, "nothing said"
            time.sleep(0.5)
        shell.run(term, "echo after")
        term.wait_for("^after$")
        history = term.tmux("capture-pane", "-p", "-J", "-t", "t", "-S", "-200")  # -J: wrapped lines joined
        assert history.count(SAID) == 1, history
        said = next(line for line in history.splitlines() if SAID in line)
        assert ("is not there" in said) == (cause == "the interpreter is gone"), said
        if shell.name != "fish":
            term.send("C-r")  # no calm search to open: the shell's own
            term.wait_for(r"bck-i-search|reverse-i-search")
            term.send("C-g")
