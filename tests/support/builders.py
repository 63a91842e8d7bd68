"""Builders shared by the test modules: tiny models and datasets, scan inputs, histories.

Test modules import from here (and from daemon.py, tmux.py, tiny_model.py), never from each other.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calmd.formats.ctds import write_ctds
from calmd.formats.cwgt import Metadata
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, build_sequence
from calmd.model.checkpoint import GenerationDefaults, save_model
from calmd.model.mamba import CalmModel, ModelConfig

# --------------------------------------------------------------------------- tiny models and datasets

TINY = ModelConfig(d_model=32, n_layers=1, expand=2, d_state=4, d_conv=4, l_max=256)

# Two disjoint tasks: different directories, different commands.
TASK_A = [("/srv/alpha", "git status"), ("/srv/alpha", "git log --oneline"), ("/srv/alpha", "ls -la")]
TASK_B = [("/opt/beta", "docker ps"), ("/opt/beta", "cargo build"), ("/opt/beta", "npm test")]


def sequences(task: list[tuple[str, str]], n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.integers(0, len(task), size=n):
        cwd, cmd = task[int(i)]
        out.append(build_sequence(DEFAULT_SHELL_TEMPLATE, {"cwd": cwd, "input": cmd}, training=True))
    return out


def dataset(path: Path, task: list[tuple[str, str]], n: int = 48, seed: int = 0) -> Path:
    return write_ctds(path, sequences(task, n, seed))


def tiny_model_file(path: Path, seed: int = 0, cfg: ModelConfig = TINY, meta: Metadata | None = None) -> Path:
    model = CalmModel(cfg)
    model.init_weights(seed)
    save_model(path, model, meta or Metadata(), defaults=GenerationDefaults())
    return path


# --------------------------------------------------------------------------- selective scan inputs


def scan_inputs(
    batch: int, channels: int, length: int, n: int, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, channels, length, generator=g, dtype=dtype)
    delta = torch.nn.functional.softplus(torch.randn(batch, channels, length, generator=g, dtype=dtype))
    A = -torch.rand(channels, n, generator=g, dtype=dtype) - 0.5
    B = torch.randn(batch, n, length, generator=g, dtype=dtype)
    C = torch.randn(batch, n, length, generator=g, dtype=dtype)
    D = torch.randn(channels, generator=g, dtype=dtype)
    z = torch.randn(batch, channels, length, generator=g, dtype=dtype)
    h0 = torch.randn(batch, channels, n, generator=g, dtype=dtype)
    return [u, delta, A, B, C, D, z, h0]


# --------------------------------------------------------------------------- histories


def month_old_history() -> str:
    """A zsh history file with timestamps a month old: 300 commands, `ssh oldhost` 20 times."""
    month_ago = int(time.time()) - 30 * 86400
    lines = []
    for i in range(300):
        if i % 15 == 0:
            cmd = "ssh oldhost"
        elif i % 40 == 7:
            cmd = "ssh build01"
        else:
            cmd = ["ls", "git status", "cd ~/src", "vim notes.md", "make", "git pull", "htop", "docker ps"][
                i % 8
            ]
        lines.append(f": {month_ago + 60 * i}:0;{cmd}")
    return "\n".join(lines) + "\n"


# Commands a shell session records, and `calmd serve` options for a quick background run.
WORK = ["git status", "make build", "make test", "git commit -am wip", "ls", "cd ..", "false cmd"]
TRAIN_ARGS = ("--train-arg=--min-examples=10", "--train-arg=--holdout=10", "--train-arg=--epochs=3")


def record_work(client: Any, rounds: int = 30) -> None:
    """WORK's commands `rounds` times over one session, each commit with its own message: enough
    new history for a background run (TRAIN_ARGS)."""
    for i in range(rounds):
        for cmd in WORK:
            client.record(f"{cmd} {i}" if cmd.startswith("git commit") else cmd, exit=0, session="s")


# --------------------------------------------------------------------------- hostile histories

# What a recorded command or a folder may hold that a terminal would act on, or that changes what
# the eye reads (issue 30): each form shown by every view as its escape (calmd/visible.py).
HOSTILE_FORMS = {
    "osc0-title": "\x1b]0;PWNED-TITLE\x07",  # sets the window (pane) title
    "osc52-clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07",  # writes "echo pwned" to the clipboard
    "csi-clear": "\x1b[2J\x1b[H",  # clears the screen
    "csi-conceal": "\x1b[8mHIDDEN",  # draws what follows invisibly
    "bel": "\x07",
    "cr": "\rOVER",  # CR: what follows is drawn over the start of the line
    "bs": "\x08\x08\x08",
    "del": "\x7f",
    "c1-nel": "\x85",
    "c1-csi": "\x9b2J",  # U+009B: an 8-bit CSI
    "c1-st": "\x9c",
    "c1-osc": "\x9d0;PWNED-C1\x9c",
    "bidi-rlo": "\u202eevil",  # right-to-left override: the rest reads backwards
    "zero-width": "\u200b",
}
HOSTILE_GROUPS = 5  # folders: `calm stats` shows the five busiest, so the forms share five


def hostile_folder(group: int) -> str:
    """The folder of HOSTILE_FORMS' group `group`: every form of the group in its name."""
    forms = list(HOSTILE_FORMS.items())[group::HOSTILE_GROUPS]
    return f"/tmp/g{group}-" + "-".join(f"{name}{payload}" for name, payload in forms)


def hostile_rows(ts: float) -> list[dict[str, Any]]:
    """Rows of a hostile history: per form, a command holding it in its first word (`tool3<form>
    name`: `calm stats` counts it by that word) and a plain `echo name` (the search shows a line
    with a control character in it nowhere, but draws its folder), both run in the form's group's
    folder; `git` and `git` + U+200B beside them."""
    rows: list[dict[str, Any]] = []
    for k, (name, payload) in enumerate(HOSTILE_FORMS.items()):
        folder = hostile_folder(k % HOSTILE_GROUPS)
        rows.append({"cmd": f"tool{k}{payload} {name}", "cwd": folder, "exit": 0, "ts": ts + 2 * k})
        rows.append({"cmd": f"echo {name}", "cwd": folder, "exit": 0, "ts": ts + 2 * k + 1})
    rows.append({"cmd": "git status", "cwd": "/tmp", "exit": 0, "ts": ts + 100})
    rows.append({"cmd": "git\u200b status", "cwd": "/tmp", "exit": 0, "ts": ts + 101})
    return rows


def write_rows(db: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` written straight into the store at `db` (made by HistoryStore when missing), as an
    older calmd or an import could have left them: no check, no cleaning, any value in any column."""
    import sqlite3

    from calmd.history.store import HistoryStore

    if not db.exists():
        HistoryStore(db).close()
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        for row in rows:
            fields = {"session": "s", "source": "shell", **row}
            names = ", ".join(fields)
            conn.execute(f"INSERT INTO commands ({names}) VALUES ({', '.join('?' * len(fields))})",
                         list(fields.values()))  # fmt: skip
    return db
