"""Drive real interactive shells inside tmux (like zsh-autosuggestions' spec/terminal_session.rb).

Each Terminal runs its own tmux server (`-L <unique name>`, so tests never touch the user's
tmux), one window of a fixed size, and polls `capture-pane` until the screen shows what the test
waits for: no fixed sleeps, and a ceiling only a hang reaches (tests/support/waiting.py).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from calmd import paths
from calmd.history.store import HistoryRow, HistoryStore
from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, Daemon, daemon_env
from tests.support.tools import need
from tests.support.waiting import HANG_S, wait_until

ROOT = Path(__file__).resolve().parents[2]
AUTOSUGGEST_PATHS = (
    Path("/usr/share/zsh-autosuggestions/zsh-autosuggestions.zsh"),
    Path("/usr/share/zsh/plugins/zsh-autosuggestions/zsh-autosuggestions.zsh"),
    Path("/usr/local/share/zsh-autosuggestions/zsh-autosuggestions.zsh"),
)
_names = itertools.count()


def autosuggestions() -> Path | None:
    return next((p for p in AUTOSUGGEST_PATHS if p.is_file()), None)


def init_script(shell: str, home: Path) -> Path:
    """`calmd init SHELL` output written to a file in `home` (what an rc file would eval)."""
    env = shell_env(home)
    out = subprocess.run(
        [sys.executable, "-m", "calmd", "init", shell],
        env=env, check=True, capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    path = home / f"calm-init.{shell}"
    path.write_text(out.stdout)
    return path


def shell_env(home: Path, **extra: str) -> dict[str, str]:
    env = daemon_env(home, **extra)
    env["PYTHONPATH"] = str(ROOT)
    env["TERM"] = "xterm-256color"
    env.pop("TMUX", None)
    if os.environ.get("CALM_DEBUG"):  # the shell helper logs every line it passes on
        env["CALM_DEBUG"] = os.environ["CALM_DEBUG"]
    return env


class Terminal:
    """One tmux window running `argv` with `env`; `screen()` is what a user would see."""

    def __init__(
        self, argv: list[str], env: dict[str, str], *, cwd: Path, width: int = 100, height: int = 30
    ) -> None:
        self.name = f"calm-test-{os.getpid()}-{next(_names)}"
        self.env = env
        self.marks: Path | None = None  # where the shell's MARK_KEY appends a mark (keys_handled)
        self.tmux(
            "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "t", "-c", str(cwd),
            "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv,
        )  # fmt: skip
        self.tmux("set-option", "-g", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.name, "-f", "/dev/null", *args],
            capture_output=True, text=True, timeout=HANG_S,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"tmux {shlex.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def send(self, *keys: str) -> None:
        """tmux key names (Enter, Right, C-g, M-f, BTab...)."""
        self.tmux("send-keys", "-t", "t", *keys)

    def type(self, text: str) -> None:
        """Literal text, as if typed."""
        self.tmux("send-keys", "-t", "t", "-l", text)

    def screen(self, *, escapes: bool = False) -> str:
        args = ["capture-pane", "-p", "-t", "t"] + (["-e"] if escapes else [])
        return self.tmux(*args)

    def keys_handled(self) -> None:
        """Wait until the shell has handled every key sent before this call: MARK_KEY, bound in the
        test's rc file, appends a mark to a file, and a shell handles its keys in order (bash's and
        fish's Shift-Tab waits for its answer, so the line it leaves is there once this returns)."""
        marks = self.marks
        assert marks is not None, "a shell started by zsh_terminal, bash_terminal or fish_terminal"
        before = marks.stat().st_size if marks.exists() else 0
        self.send(*MARK_KEY)
        wait_until(lambda: marks.exists() and marks.stat().st_size > before,
                   "the shell to handle the keys sent", report=self.screen)  # fmt: skip

    def cursor(self) -> tuple[int, int]:
        """(column, row) of the cursor, 0-based."""
        x, y = self.tmux("display-message", "-p", "-t", "t", "#{cursor_x} #{cursor_y}").split()
        return int(x), int(y)

    def wait_cursor(self, x: int, *, timeout: float = HANG_S) -> None:
        """Wait until the cursor is in column `x` (a redraw after a key that moves it happened)."""
        wait_until(lambda: self.cursor()[0] == x, f"the cursor in column {x}", ceiling=timeout,
                   report=lambda: f"cursor at {self.cursor()}; screen:\n{self.screen()}")  # fmt: skip

    def line(self, *, escapes: bool = False) -> str:
        """The line the cursor is on."""
        y = int(self.tmux("display-message", "-p", "-t", "t", "#{cursor_y}").strip())
        lines = self.screen(escapes=escapes).split("\n")
        return lines[y] if y < len(lines) else ""

    def wait(
        self, check: Callable[[str], bool], *, timeout: float = HANG_S, what: str = "", escapes: bool = False
    ) -> str:
        """The screen, once `check` accepts it (polled: tmux has no event for a redraw)."""
        seen = [""]

        def shows() -> bool:
            seen[0] = self.screen(escapes=escapes)
            return check(seen[0])

        wait_until(shows, what or str(check), ceiling=timeout,
                   report=lambda: f"screen:\n{seen[0]}\n{self.processes()}")  # fmt: skip
        return seen[0]

    def wait_for(self, pattern: str, *, timeout: float = HANG_S, escapes: bool = False) -> str:
        """Wait until the screen matches the regular expression `pattern`."""
        rx = re.compile(pattern, re.M)
        return self.wait(lambda s: rx.search(s) is not None, timeout=timeout, what=repr(pattern),
                         escapes=escapes)  # fmt: skip

    def wait_line(self, pattern: str, *, timeout: float = HANG_S, escapes: bool = False) -> str:
        """Wait until the cursor's line matches `pattern` (re.search); return the line."""
        rx = re.compile(pattern)
        seen = [""]

        def matches() -> bool:
            seen[0] = self.line(escapes=escapes)
            return rx.search(seen[0]) is not None

        wait_until(matches, f"line {pattern!r}", ceiling=timeout,
                   report=lambda: f"last line {seen[0]!r}; screen:\n{self.screen()}")  # fmt: skip
        return seen[0]

    def record_output(self, path: Path) -> None:
        """From now on, append every byte the program writes to the terminal to `path` (what a
        screen capture cannot show: text drawn and overwritten between two captures)."""
        self.tmux("pipe-pane", "-t", "t", f"cat >> {shlex.quote(str(path))}")

    def processes(self) -> str:
        """The pane's process and its children, with what they wait in (for a timeout's report)."""
        try:
            pid = self.tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip()
            out = subprocess.run(
                ["ps", "-o", "pid,ppid,stat,wchan:24,args", "--ppid", pid, "-p", pid],
                capture_output=True, text=True, timeout=HANG_S,
            )  # fmt: skip
            return out.stdout
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            return f"(no process list: {exc})"

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True, timeout=HANG_S)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PROMPT = "PROMPT> "
MARK_KEY = ("C-x", "q")  # bound by each shell's test rc to append a mark (Terminal.keys_handled)
MARKS_FILE = "keys-handled"
# bash's and fish's Shift-Tab: the key waits for the daemon's answer as long
# as a hang takes, not CALM_TIMEOUT's default of 1 s (tests of CALM_TIMEOUT set their own).
KEY_WAIT_S = str(int(HANG_S))


def mark_binding(shell: str, home: Path) -> str:
    """The rc line that binds MARK_KEY to append a mark to home/MARKS_FILE."""
    marks = shlex.quote(str(home / MARKS_FILE))
    if shell == "zsh":
        return f"_calm_mark() {{ print -n x >> {marks} }}; zle -N _calm_mark; bindkey '^Xq' _calm_mark"
    if shell == "bash":  # a _calm_ function: the hook's DEBUG trap takes no `_calm_*` for the user's
        return f"_calm_mark() {{ printf x >> {marks}; }}; bind -x '\"\\C-xq\": _calm_mark'"
    return f"bind \\cxq 'printf x >> {marks}'"


# The shell tests that drive the scripted engine are about mechanics, not about which candidate is
# sure enough: they show every candidate, whatever confidence the daemon gives it. The tests of
# the threshold set CALM_MIN_CONFIDENCE themselves ("": the default).
TEST_MIN_CONFIDENCE = "0"


def zsh_terminal(
    home: Path, *, before: str = "", after: str = "", setup: str | None = None, **env: str
) -> Terminal:
    """An interactive zsh that reads no global rc file (`zsh -d`, like `zsh -f`) and only our
    $ZDOTDIR/.zshrc: the prompt, `before`, the calm hook, `after`. The hook comes from `calmd init`
    run beforehand, or from the rc line `setup`."""
    need("zsh", "tmux")
    env.setdefault("CALM_MIN_CONFIDENCE", TEST_MIN_CONFIDENCE)
    if setup is None:
        setup = f'eval "$(< {shlex.quote(str(init_script("zsh", home)))})"'
    zdot = home / "zdot"
    zdot.mkdir(exist_ok=True)
    (zdot / ".zshrc").write_text(
        f"PS1={shlex.quote(PROMPT)}\nRPS1=\nHISTFILE=\nunsetopt PROMPT_SP\n{mark_binding('zsh', home)}\n"
        f"{before}\n{setup}\n{after}\n"
    )
    term = Terminal(["zsh", "-d", "-i"], shell_env(home, ZDOTDIR=str(zdot), **env), cwd=home)
    term.marks = home / MARKS_FILE
    return term


def bash_terminal(
    home: Path, *, before: str = "", after: str = "", setup: str | None = None, **env: str
) -> Terminal:
    need("bash", "tmux")
    env.setdefault("CALM_MIN_CONFIDENCE", TEST_MIN_CONFIDENCE)
    env.setdefault("CALM_TIMEOUT", KEY_WAIT_S)
    if setup is None:
        # eval, as in ~/.bashrc: a sourced file would not see the DEBUG trap set before it
        setup = f'eval "$(< {shlex.quote(str(init_script("bash", home)))})"'
    rc = home / ".bashrc-test"
    rc.write_text(
        f"PS1={shlex.quote(PROMPT)}\nHISTFILE=\n{mark_binding('bash', home)}\n{before}\n{setup}\n{after}\n"
    )
    term = Terminal(["bash", "--noprofile", "--rcfile", str(rc), "-i"], shell_env(home, **env), cwd=home)
    term.marks = home / MARKS_FILE
    return term


def fish_terminal(
    home: Path, *, before: str = "", after: str = "", setup: str | None = None, **env: str
) -> Terminal:
    """An interactive fish that reads only our config (`XDG_CONFIG_HOME` in `home`, no system
    config: `--no-config` would skip ours too): the prompt, `before`, the calm hook, `after`."""
    need("fish", "tmux")
    env.setdefault("CALM_MIN_CONFIDENCE", TEST_MIN_CONFIDENCE)
    env.setdefault("CALM_TIMEOUT", KEY_WAIT_S)
    if setup is None:
        setup = f"source {shlex.quote(str(init_script('fish', home)))}"
    config = home / "config" / "fish"
    config.mkdir(parents=True, exist_ok=True)
    prompt = "function fish_prompt; printf '%s' " + shlex.quote(PROMPT) + "; end"
    greeting = "set -g fish_greeting ''"
    mark = mark_binding("fish", home)
    (config / "config.fish").write_text(f"{prompt}\n{greeting}\nfunction fish_right_prompt; end\n"
                                        f"{mark}\n{before}\n{setup}\n{after}\n")  # fmt: skip
    # fish's first start would otherwise parse every man page in the background (its completions)
    (home / "fish-data" / "fish" / "generated_completions").mkdir(parents=True, exist_ok=True)
    fish_env = {"XDG_CONFIG_HOME": str(home / "config"), "XDG_DATA_HOME": str(home / "fish-data"),
                "fish_history": "calm_test", **env}  # fmt: skip
    term = Terminal(["fish", "-i"], shell_env(home, **fish_env), cwd=home)
    term.marks = home / MARKS_FILE
    return term


# The setup lines of docs/shells.md: source the hook file `calmd init` leaves in the data dir,
# and run `calmd init` only when it is not there.
DATA_DIR = "${CALM_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/calm}"
SETUP_LINES = {
    "zsh": f'source {DATA_DIR}/calm.zsh 2>/dev/null || eval "$(calmd init zsh)"',
    "bash": f'eval "$(cat "{DATA_DIR}/calm.bash" 2>/dev/null || calmd init bash)"',
    "fish": "source (set -q CALM_HOME; and echo $CALM_HOME; or echo (set -q XDG_DATA_HOME;"
    " and echo $XDG_DATA_HOME; or echo ~/.local/share)/calm)/calm.fish 2>/dev/null;"
    " or calmd init fish | source",
}


# --------------------------------------------------------------------------- the history store


def history_rows(home: Path) -> list[HistoryRow]:
    """What the daemon stored, read from the SQLite store in the test's data dir."""
    path = home / "data" / paths.HISTORY
    if not path.exists():
        return []
    store = HistoryStore(path)
    try:
        return list(store.all_rows())
    finally:
        store.close()


ELSEWHERE = "elsewhere"  # the session of commands a test stores directly


def wait_recorded(home: Path, cmd: str, *, timeout: float = HANG_S) -> HistoryRow:
    """The row a shell recorded for `cmd` (not one stored by `record`), once it is there."""

    def recorded() -> HistoryRow | None:
        rows = [r for r in history_rows(home) if r.cmd == cmd and r.session != ELSEWHERE]
        return rows[-1] if rows else None

    return wait_until(recorded, f"{cmd!r} recorded", ceiling=timeout,
                      report=lambda: f"stored: {[r.cmd for r in history_rows(home)]}")  # fmt: skip


def wait_helper_read(home: Path, typed: str, *, timeout: float = HANG_S) -> None:
    """Wait until the shell's helper has read a completion request for `typed` (its debug log,
    with CALM_DEBUG=1 in the shell's environment): the positive event after which an absence
    (no ghost text) means something, since nothing else could still be on its way."""
    needle = f"input={typed!r}"
    wait_until(
        lambda: needle in helper_log(home), f"the helper reading a request for {typed!r}", ceiling=timeout
    )


def helper_log(home: Path) -> str:
    log = home / "data" / paths.HELPER_LOG
    return log.read_text(errors="replace") if log.exists() else ""


def record(daemon: Daemon, *cmds: str) -> None:
    """Store commands as if another shell had run them."""
    with CalmClient(daemon.socket) as client:
        for cmd in cmds:
            client.record(cmd, exit=0, session=ELSEWHERE)


def calm_cli(home: Path, *args: str) -> str:
    """`calm ARGS` (enable/disable) as the user runs it."""
    out = subprocess.run(
        [str(BIN / "calm"), *args],
        env=shell_env(home), check=True, capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    return out.stdout


NOISE = ("Traceback", "calmd", "broken pipe", "command not found", "Error", "error", "no such")


def assert_quiet(screen: str) -> None:
    """Nothing the hook printed disturbs the terminal."""
    for word in NOISE:
        assert word not in screen, f"{word!r} on the terminal:\n{screen}"
