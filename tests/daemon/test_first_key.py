"""The first key of a line answered at once from the empty prompt's answer (issue 42,
calmd/daemon/answers.py): the daemon's `key` replies and its early line from the event loop, and zsh
drawing a first key's line itself, with the daemon stopped (scripted engine: its empty-prompt
answer is `after <last command>`, then `input + suffix` lines: mmit, mmand, nfig, py)."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import pytest

from calmd.shell.client import CalmClient
from tests.support.daemon import Daemon, running_daemon
from tests.support.tmux import record, zsh_terminal

GHOST = re.escape("\x1b[90m")


def ask(
    client: CalmClient, typed: str, session: str = "z", ctx: dict[str, Any] | None = None, **fields: Any
) -> list[dict[str, Any]]:
    """A `complete` as zsh's helper sends it (session, early, its threshold), every reply."""
    rid = client.send("complete", n=5, session=session, ctx={**(ctx or {}), "input": typed}, early=True,
                      min_confidence=0.5, **fields)  # fmt: skip
    return list(client.replies(rid))


def test_the_first_key_is_answered_from_the_empty_prompts_answer_before_the_engine(home: Path) -> None:
    # each candidate takes the scripted engine 50 ms: its own answer comes late
    with running_daemon(home, env={"CALMD_TEST_DELAY": "0.05"}) as d, CalmClient(d.socket) as c:
        c.record("git status", exit=0, session="z")
        replies = ask(c, "", keys=True)
        keys = {m["key"]: m["line"] for m in replies if "key" in m}
        assert keys["n"] == "nfig" and keys["m"] == "mmit" and keys["a"] == "after git status"
        assert list(replies[-1]) == ["id", "protocol", "done", "ms"]  # after the keys: not cancelled
        assert all("key" not in m for m in ask(c, "g"))  # only the empty prompt's answer has them
        first, *rest = ask(c, "n")
        # the engine's own early line would be `nmmit`: this one came from the empty prompt's answer
        assert first.get("early") == "nfig" and first.get("ghost") is True
        assert next(m["candidate"] for m in rest if "candidate" in m) == "nmmit"  # the engine's answer
        assert "cancelled" not in rest[-1]
        assert c.status()["status"]["prefetch"]["first_keys"] == 1
        c.record("make", exit=0, session="z")  # another history: the answer kept is not this context's
        first, *_ = ask(c, "n")
        assert first.get("early") == "nmmit"
        assert c.status()["status"]["prefetch"]["first_keys"] == 1


def test_a_new_shells_first_key_is_answered_from_another_sessions_answer_in_the_same_context(
    home: Path,
) -> None:
    with running_daemon(home, env={"CALMD_TEST_DELAY": "0.05"}) as d, CalmClient(d.socket) as c:
        c.record("git status", exit=0, session="z")
        ask(c, "", keys=True)  # z's empty prompt, answered and kept
        # a shell just opened: its frames are the user's latest commands, z's context; its own
        # empty prompt's answer is not there yet
        first, *rest = ask(c, "n", session="new")
        assert first.get("early") == "nfig" and first.get("ghost") is True
        assert next(m["candidate"] for m in rest if "candidate" in m) == "nmmit"  # then the engine's own
        assert c.status()["status"]["prefetch"]["first_keys"] == 1
        # another folder is another context: nothing prepared for it
        first, *_ = ask(c, "n", session="elsewhere", ctx={"cwd": str(home)})
        assert first.get("early") == "nmmit"  # the engine's own early line
        c.record("make", exit=0, session="z")  # another history: no answer kept counts
        first, *_ = ask(c, "n", session="later")
        assert first.get("early") == "nmmit"
        assert c.status()["status"]["prefetch"]["first_keys"] == 1


@pytest.mark.needs("zsh", "tmux")
@pytest.mark.slow
def test_zsh_draws_a_first_key_itself_from_the_empty_prompts_answer(home: Path, daemon: Daemon) -> None:
    record(daemon, "git status")
    # the right prompt shows how many first keys zsh holds, once the empty prompt's answer is in
    shows_keys = (
        "setopt prompt_subst\nRPS1='keys:${#_CALM_KEYS}'\n"
        "functions -c _calm_on_reply _test_on_reply\n"
        '_calm_on_reply() { _test_on_reply "$@"; zle reset-prompt }\n'
    )
    with zsh_terminal(home, after=shows_keys) as term:
        term.wait_for(r"keys:[1-9]")
        daemon.proc.send_signal(signal.SIGSTOP)  # nothing more comes from the daemon
        try:
            term.type("n")
            term.wait_line(rf"^PROMPT> n{GHOST}fig", escapes=True)  # drawn by zsh alone
            term.send("BSpace")
            term.type("p")
            term.wait_line(rf"^PROMPT> p{GHOST}y", escapes=True)
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        term.type("x")  # two characters: not a first key; the daemon's answer for `px` comes
        term.wait_line(rf"^PROMPT> px{GHOST}mmit", escapes=True)
