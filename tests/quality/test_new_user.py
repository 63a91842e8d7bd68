"""A new user meets the model (issue 41): `calmd serve` with the packaged model and no history at
all, asked over its socket as the zsh hook asks (the cwd, the branch, `early`) in the panel's
project folder (calmd/quality/panel.py), draws ghosts on the panel's prefixes: heads of the lines
its model is sure of the next words of, where no whole line is sure, that the panel's judges do
not call absurd; and what it draws is what the panel measured for its new user."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.quality.panel import BRANCH, PREFIXES, judge, judged_project, run_panel
from calmd.quality.panel_project import build_project, panel_home
from calmd.shell.client import CalmClient
from tests.support.daemon import running_daemon

pytestmark = pytest.mark.slow  # a daemon with the packaged model

LISTED_TIMEOUT = 60.0  # a loaded 2-core machine: the folder's listing may take seconds


def drawn_by(messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(what is drawn, its whole line) of the candidate an answer draws; (None, None) for none."""
    for message in messages:
        if "candidate" in message and message.get("ghost") is True:
            return message.get("draw") or message["candidate"], message["candidate"]
    return None, None


def wait_listed(client: CalmClient, root: Path) -> None:
    """Ask once in the project and wait until the daemon has listed it (it waits 2 ms for a listing
    and uses it from the next keystroke on; the panel waits for it too)."""
    list(client.complete("ls ", session="warm-up", cwd=str(root), git=BRANCH))
    deadline = time.monotonic() + LISTED_TIMEOUT
    while client.status()["status"]["context"]["folders_listed"] < 1:
        assert time.monotonic() < deadline, "the daemon never listed the project"
        time.sleep(0.05)


def test_a_daemon_with_no_history_draws_the_heads_its_model_is_sure_of(tmp_path: Path) -> None:
    panel = {r.prefix: r for r in run_panel().rows if r.user == "new"}
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    shutil.copyfile(paths.packaged_weights(), home / "data" / "shell.cwgt")
    answers: dict[str, tuple[str | None, str | None]] = {}
    with (
        panel_home() as where,
        running_daemon(home, engine="model", args=("--no-import",)) as daemon,
        CalmClient(daemon.socket, timeout=LISTED_TIMEOUT) as client,
    ):
        root = build_project(where)
        wait_listed(client, root)
        for i, prefix in enumerate(PREFIXES):  # each a fresh keystroke of a shell of its own
            messages = list(
                client.complete(prefix.typed, session=f"new-{i}", early=True, cwd=str(root), git=BRANCH)
            )
            answers[prefix.typed] = drawn_by(messages)
        assert client.status()["status"]["model"]["indexed_commands"] == 0  # no history at all
        project = judged_project(root, ())
        verdicts = {p.typed: judge(p, drawn, project)[0] for p in PREFIXES if (drawn := answers[p.typed][0])}
    shown = "\n".join(f"{typed!r}: {answers[typed]} {verdicts.get(typed, '')}" for typed in answers)
    # what the panel measured for its new user is what the daemon draws
    assert {t: a[0] for t, a in answers.items()} == {t: r.drawn for t, r in panel.items()}, shown
    # (the goal, a ghost on 40% of the prefixes, is not reached: docs/quality.md has the figures)
    assert list(verdicts.values()).count("absurd") * 20 <= len(verdicts), shown  # at most 1 in 20 absurd
    assert "placeholder" not in verdicts.values(), shown
    # heads: the next words of a line drawn without the rest of it
    heads = [typed for typed, (drawn, line) in answers.items() if drawn and line and drawn != line]
    assert heads, shown
    assert all(answers[t][0].endswith(" ") for t in heads), shown  # type: ignore[union-attr]
