"""The bash hook in a real interactive bash inside tmux, against a real daemon (scripted engine:
history prefix matches first, then `input + suffix` candidates: mmit, mmand, nfig, py, unt).

bash has no ghost text (docs/shells.md says why): CALM_KEY (Shift-Tab, tmux `BTab`) puts the best
candidate into the line and cycles on repeat."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calmd.shell.client import CalmClient
from tests.support.daemon import Daemon, running_daemon
from tests.support.fake_daemon import SURE, UNSURE, FakeDaemon, candidates
from tests.support.tmux import (
    assert_quiet,
    bash_terminal,
    history_rows,
    record,
    wait_recorded,
)
from tests.support.tools import need
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.needs("bash", "tmux"), pytest.mark.slow]  # real shells in tmux


def test_key_accepts_top_candidate_then_run_and_record(home: Path, daemon: Daemon) -> None:
    need("git")
    subprocess.run(["git", "-c", "init.defaultBranch=trunk", "init", "-q", str(home)], check=True)
    record(daemon, "git status")
    with bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("git st")
        term.send("BTab")
        term.wait_line(r"^PROMPT> git status\s*$")
        term.send("Enter")
        row = wait_recorded(home, "git status")
        assert row.exit == 0
        assert row.cwd == str(home)
        assert row.git == "trunk"
        assert row.session.startswith("bash-")
        assert_quiet(term.screen())


def test_repeated_key_cycles_and_comes_back(home: Path, daemon: Daemon) -> None:
    with bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("xyz")
        expected = ["xyzmmit", "xyzmmand", "xyznfig", "xyzpy", "xyzunt", "xyz", "xyzmmit"]
        for text in expected:
            term.send("BTab")
            term.wait_line(rf"^PROMPT> {text}\s*$")


def test_prediction_on_empty_line(home: Path, daemon: Daemon) -> None:
    with bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("true")
        term.send("Enter")
        term.wait_for("^PROMPT> true\nPROMPT>")
        term.send("BTab")
        term.wait_line(r"^PROMPT> after true\s*$")


def test_the_environment_is_recorded_as_the_line_was_typed(home: Path, daemon: Daemon) -> None:
    """$VIRTUAL_ENV / $CONDA_DEFAULT_ENV reach the store in short form, from the prompt hook."""
    with bash_terminal(home, before="export CONDA_DEFAULT_ENV=ml") as term:
        term.wait_for("^PROMPT>")
        for cmd in ("echo before", "export VIRTUAL_ENV=/srv/proj/.venv", "echo after", "unset VIRTUAL_ENV",
                    "echo again"):  # fmt: skip
            term.type(cmd)
            term.send("Enter")
            wait_recorded(home, cmd)
        envs = {r.cmd: r.env for r in history_rows(home)}
        assert envs["echo before"] == "conda:ml" and envs["export VIRTUAL_ENV=/srv/proj/.venv"] == "conda:ml"
        assert envs["echo after"] == "venv:proj conda:ml" and envs["echo again"] == "conda:ml"


def test_key_on_a_line_emptied_with_ctrl_u(home: Path, daemon: Daemon) -> None:
    """The prediction asked for at the prompt is superseded by the first press on a typed line;
    on the line emptied again, the key asks for it anew."""
    with bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("true")
        term.send("Enter")
        term.wait_for("^PROMPT> true\nPROMPT>")
        term.type("xyz")
        term.send("BTab")
        term.wait_line(r"^PROMPT> xyzmmit\s*$")
        term.send("C-u")
        term.wait_line(r"^PROMPT>\s*$")
        term.send("BTab")
        term.wait_line(r"^PROMPT> after true\s*$")


def test_failing_command_and_existing_hooks_kept(home: Path, daemon: Daemon) -> None:
    before = "PROMPT_COMMAND='echo pc-$?'\ntrap 'echo trap >> \"$HOME/debug-trap.log\"' DEBUG"
    with bash_terminal(home, before=before) as term:
        term.wait_for("^PROMPT>")
        term.type("false")
        term.send("Enter")
        term.wait_for("^pc-1$")  # the user's PROMPT_COMMAND still runs and still sees $?
        term.type("(exit 3)")
        term.send("Enter")
        term.wait_for("^pc-3$")
        term.type("echo 'a|b' | cat")
        term.send("Enter")
        assert wait_recorded(home, "false").exit == 1
        assert wait_recorded(home, "(exit 3)").exit == 3
        assert wait_recorded(home, "echo 'a|b' | cat").exit == 0
        assert (home / "debug-trap.log").read_text().count("trap") >= 3  # the user's trap too
        assert not [r for r in history_rows(home) if r.cmd.startswith("echo pc")]


# The interface of bash-preexec (arrays preexec_functions and precmd_functions, run from its own
# DEBUG trap and PROMPT_COMMAND), in a few lines: the real script is not packaged (Debian, npm).
PREEXEC_STANDIN = r"""
bash_preexec_imported=defined
preexec_functions=() precmd_functions=()
__bp_ready=0
__bp_status() { return "$1"; }
__bp_precmd() {
  local s=$? f
  for f in "${precmd_functions[@]}"; do __bp_status "$s"; "$f"; done  # each sees $?
  __bp_ready=1
}
__bp_debug() {
  (( __bp_ready )) || return 0
  [[ $BASH_COMMAND == __bp_* ]] && return 0
  __bp_ready=0
  local f line; line=$(HISTTIMEFORMAT= builtin history 1); line=${line#*[0-9]  }
  for f in "${preexec_functions[@]}"; do "$f" "$line"; done
}
PROMPT_COMMAND=__bp_precmd
trap __bp_debug DEBUG
"""


@pytest.mark.parametrize(
    "hooks",
    [
        "",
        "PROMPT_COMMAND='echo pc-$?'",
        "PROMPT_COMMAND=('echo pc-$?')",
        "trap 'echo trap >> \"$HOME/debug-trap.log\"' DEBUG",
        PREEXEC_STANDIN,
    ],
    ids=["none", "string", "array", "debug-trap", "bash-preexec"],
)
def test_set_u_before_the_hook(home: Path, daemon: Daemon, hooks: str) -> None:
    """`set -u` in ~/.bashrc before calm's line: no "unbound variable", everything installed."""
    with bash_terminal(home, before=f"set -u\n{hooks}") as term:
        term.wait_for("^PROMPT>")
        for cmd in ("false", "(exit 3)", "echo recorded-$?"):  # one at a time: no typeahead echo
            prompts = term.screen().count("PROMPT>")
            term.type(cmd)
            term.send("Enter")
            term.wait(lambda screen, n=prompts: screen.count("PROMPT>") > n, what="the next prompt")
        term.wait_for("^recorded-3$")
        assert wait_recorded(home, "false").exit == 1
        assert wait_recorded(home, "(exit 3)").exit == 3
        assert wait_recorded(home, "echo recorded-$?").exit == 0
        term.type("xyz")
        term.send("BTab")
        term.wait_line(r"^PROMPT> xyzmmit\s*$")
        term.send("C-u")
        term.type("echo ok")
        term.send("Enter")
        term.wait_for("^ok$")
        if "pc-" in hooks:
            term.wait_for("^pc-1$")  # the user's PROMPT_COMMAND still runs and sees $?
        if "debug-trap" in hooks:
            assert (home / "debug-trap.log").read_text().count("trap") >= 3
        assert "unbound variable" not in term.screen()
        assert_quiet(term.screen())


def test_leading_space_command_not_recorded_with_histcontrol(home: Path, daemon: Daemon) -> None:
    """HISTCONTROL=ignoreboth drops repeats and space-led lines from bash's own history, which the
    hook reads: a repeat is still recorded, a space-led line still not (without HISTCONTROL in
    every shell: test_shell_scenarios.py)."""
    with bash_terminal(home, before="HISTCONTROL=ignoreboth") as term:
        term.wait_for("^PROMPT>")
        for cmd in (" echo secret-calm", "echo visible-calm", "echo visible-calm"):
            term.type(cmd)
            term.send("Enter")
        # Records travel in order: once both visible ones are stored, the secret's would be too.
        commands = lambda: [r.cmd for r in history_rows(home)]  # noqa: E731
        wait_until(lambda: commands().count("echo visible-calm") == 2, "both visible lines recorded",
                   report=lambda: str(commands()))  # fmt: skip
        assert not [r for r in history_rows(home) if "secret" in r.cmd]


def test_key_inserts_first_only_a_sure_candidate(home: Path) -> None:
    """Below CALM_MIN_CONFIDENCE the first press leaves the line as typed; pressing again goes
    through every candidate, the unsure ones too (tests/support/fake_daemon.py sends the confidences)."""

    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        if typed == "":
            yield from candidates(("predicted-unsure", UNSURE))
        elif typed == "abc":
            yield from candidates(("abc-sure", SURE), ("abc-unsure", UNSURE))
        elif typed == "xyz":
            yield {"early": "xyz-early", "confidence": SURE}  # the key waits for the full list
            yield from candidates(("xyz-low", UNSURE), ("xyz-lower", UNSURE))

    with FakeDaemon.at_home(home, script), bash_terminal(home, CALM_MIN_CONFIDENCE="") as term:
        term.wait_for("^PROMPT>")
        term.type("abc")
        term.send("BTab")
        term.wait_line(r"^PROMPT> abc-sure\s*$")
        term.send("BTab")
        term.wait_line(r"^PROMPT> abc-unsure\s*$")
        term.send("C-u")
        term.type("xyz")
        term.send("BTab", "BTab")  # the first leaves `xyz`, the second brings the first candidate
        term.wait_line(r"^PROMPT> xyz-low\s*$")
        for text in ("xyz-lower", "xyz", "xyz-low"):
            term.send("BTab")
            term.wait_line(rf"^PROMPT> {text}\s*$")
        term.send("C-u")
        term.send("BTab", "BTab")  # the unsure prediction, on the second press only
        term.wait_line(r"^PROMPT> predicted-unsure\s*$")


def cycle_all(term: Any, typed: str, *, limit: int = 8) -> list[str]:
    """Every line Shift-Tab puts in for `typed`, pressing it until the line is back as typed."""
    seen: list[str] = []
    for _ in range(limit):
        term.send("BTab")
        term.keys_handled()  # the key waited for its answer
        line = term.line().removeprefix("PROMPT> ").rstrip()
        if line == typed:
            return seen
        seen.append(line)
    return seen


def test_shift_tab_offers_only_what_the_ghost_would(home: Path) -> None:
    """With the packaged model: lines that failed every time they ran, or name a path that is not
    there (`cd ~/src/website/`, removed since; `cd ~/src/info.txt`, a file), are never put in
    the line, however often the key is pressed; lines that belong here are."""
    from calmd import paths

    (home / "data").mkdir()
    (home / "data" / paths.WEIGHTS).write_bytes(paths.packaged_weights().read_bytes())
    (home / "src" / "app").mkdir(parents=True)
    (home / "src" / "info.txt").write_text("x")
    with running_daemon(home, engine="model", args=("--no-import",)) as daemon:
        with CalmClient(daemon.socket) as client:
            for cmd, code in [("cd ~/src/website/", 0), ("cd ~/src/info.txt", 1), ("cd ~/src/app", 0),
                              ("git pull", 0), *[("git push origin feature/login", 128)] * 5]:  # fmt: skip
                client.record(cmd, exit=code, cwd=str(home), session="elsewhere")

            # A keystroke waits 2 ms for a folder's listing it does not have (and lets the line
            # through, unknown): on a loaded machine the first request can pass that. The daemon
            # has listed ~/src once a request from home sees the missing folder as missing.
            def listed() -> bool:
                replies = client.complete("cd ~/src/", cwd=str(home))
                return not any("website" in m.get("candidate", "") for m in replies)

            wait_until(listed, "the daemon to list ~/src")
        with bash_terminal(home) as term:
            term.wait_for("^PROMPT>")
            term.type("cd ~/src/")
            offered = cycle_all(term, "cd ~/src/")
            assert "cd ~/src/app" in offered, offered
            assert not any(o.startswith(("cd ~/src/website", "cd ~/src/info")) for o in offered), offered
            term.send("C-u")
            term.type("git pu")
            offered = cycle_all(term, "git pu")
            assert "git pull" in offered and "git push origin feature/login" not in offered, offered
