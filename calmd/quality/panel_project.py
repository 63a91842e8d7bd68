"""The panel's project and user (calmd/quality/panel.py): a small Python project as a real folder,
the returning user's history typed in it, and what the judges know of both (`Project`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from calmd import paths
from calmd.history.store import HistoryStore

PROJECT = "weather"  # the project's folder and package
BRANCH = "main"
SESSION = "panel-shell"  # the shell session the history was typed in
# What the project holds (relative paths; folders end with "/"), each file with its text
FILES: dict[str, str] = {
    "README.md": "# weather\n\nHourly forecasts from the command line.\n",
    "pyproject.toml": '[project]\nname = "weather"\nversion = "0.1.0"\ndependencies = ["requests"]\n\n'
    '[project.scripts]\nweather = "weather.cli:main"\n',
    "src/weather/__init__.py": '"""Hourly forecasts."""\n',
    "src/weather/forecast.py": "def hourly(city: str) -> list[float]:\n    return []\n",
    "src/weather/cli.py": "def main() -> None:\n    print('weather')\n",
    "tests/test_forecast.py": "from weather.forecast import hourly\n\n\ndef test_hourly() -> None:\n"
    "    assert hourly('Oslo') == []\n",
    "docs/index.md": "# weather\n",
    "docs/usage.md": "Run `weather Oslo`.\n",
    "Makefile": ".PHONY: test lint install docs clean\n\ninstall:\n\tpip install -e .\n\ntest:\n"
    "\tpython3 -m pytest\n\nlint:\n\truff check src tests\n\ndocs:\n\tmkdocs build\n\nclean:\n"
    "\trm -rf build dist\n",
    "Dockerfile": 'FROM python:3.12-slim\nCOPY . /app\nRUN pip install /app\nCMD ["weather"]\n',
    "data.csv": "city,hour,celsius\nOslo,0,-3.5\n",
    "requirements-dev.txt": "pytest\nruff\n",
    ".gitignore": ".venv/\ndist/\n",
    ".venv/bin/activate": "# the virtualenv's activate script\n",
    "dist/weather-0.1.0.tar.gz": "",
}
MAKE_TARGETS = frozenset({"install", "test", "lint", "docs", "clean"})
BRANCHES = frozenset({BRANCH, "hourly"})
# The returning user's commands, typed in the project in this order (all succeeded): what a few
# days of work on it leave in a history.
HISTORY: tuple[str, ...] = (
    "ls",
    "git status",
    "python3 -m venv .venv",
    "source .venv/bin/activate",
    "pip install -e .",
    "pip install -r requirements-dev.txt",
    "python3 -m pytest",
    "vim src/weather/forecast.py",
    "python3 -m pytest tests/test_forecast.py -x",
    "git diff",
    "git add src/weather/forecast.py tests/test_forecast.py",
    'git commit -m "Parse hourly forecasts"',
    "git push origin main",
    "make test",
    "make lint",
    "cat README.md",
    "vim README.md",
    "git add README.md",
    'git commit -m "Document the command line"',
    "git push",
    "git checkout -b hourly",
    "python3 -m weather.cli Oslo",
    "git checkout main",
    "docker build -t weather:dev .",
    "docker run --rm -p 8000:8000 weather:dev",
    "docker ps",
    "ssh build01",
    "scp dist/weather-0.1.0.tar.gz build01:/tmp/",
    "ping build01",
    "kubectl get pods",
    "kubectl logs weather-api-7d9f8c6b5-x2x9z",
    "kubectl get deployments",
    "export PYTHONPATH=src",
    "export WEATHER_UNITS=metric",
    "curl http://localhost:8000/forecast?city=Oslo",
    "tar -czf data.tar.gz data.csv",
    "grep -rn TODO src",
    "find . -name '*.py'",
    "ls -la",
    "git log --oneline",
    "systemctl status docker",
    "journalctl -u docker --since today",
    "sleep 100 &",
    "kill %1",
    "make docs",
    "python3 -m build",
)


@dataclass(frozen=True)
class Project:
    """What the judges know of the project and the user."""

    root: Path
    hosts: frozenset[str] = frozenset()  # hosts the user reached before (single-label names too)
    variables: frozenset[str] = frozenset()

    def exists(self, word: str, *, folder: bool = False) -> bool:
        if word in (".", "..", "./", "../", "/", "~", "~/") or word.startswith("/tmp"):
            return True
        if word.startswith("~/"):
            return word in ("~/.bashrc", "~/.zshrc", "~/.profile", "~/.ssh/config", "~/.ssh/", "~/.ssh")
        path = self.root / word.split("::", 1)[0]
        return path.is_dir() if folder else path.exists()


def build_project(root: Path) -> Path:
    """The project folder (`FILES`) under `root`, a git repository on `BRANCH` with a second branch
    when git is installed. Returns the project's folder."""
    project = root / PROJECT
    for rel, text in FILES.items():
        target = project / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git = shutil.which("git")
    if git is not None:
        env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
        ident = ["-c", "user.name=Panel", "-c", "user.email=panel@localhost", "-c", "commit.gpgsign=false"]
        for args in (["init", "-q", "-b", BRANCH], ["add", "-A"], [*ident, "commit", "-q", "-m", "Start"],
                     ["branch", "hourly"]):  # fmt: skip
            subprocess.run([git, *args], cwd=project, env=env, check=True, capture_output=True)
    return project


HOME = "calm-panel"  # the project is built in TMPDIR/calm-panel/weather (`panel_home`)


@contextmanager
def panel_home() -> Iterator[Path]:
    """The folder the project is built in: TMPDIR/calm-panel, the same on every run, held under a
    lock while a panel uses it. The model reads the shell's cwd (its CWD frame), so a random
    temporary folder's name made the panel's answers differ from run to run. Where that folder is
    another user's, a random temporary one serves."""
    base = Path(tempfile.gettempdir()) / HOME
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
        mine = info.st_uid == os.getuid() and not os.path.islink(base)
    except OSError:
        mine = False
    if not mine:
        with tempfile.TemporaryDirectory(prefix="calm-panel-") as tmp:
            yield Path(tmp)
        return
    with open(base / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another panel (a test beside it) waits for this one
        try:
            shutil.rmtree(base / PROJECT, ignore_errors=True)
            yield base
        finally:
            shutil.rmtree(base / PROJECT, ignore_errors=True)


@contextmanager
def user_history(folder: Path, history: tuple[str, ...], cwd: Path) -> Iterator[HistoryStore]:
    """The store `folder`/history.sqlite3 holding `history`, typed in `cwd` on `BRANCH` in
    `SESSION` over the last three days (also what tests/quality/test_panel_shells.py gives a daemon)."""
    store = HistoryStore(paths.history_path(folder))
    start = time.time() - 3600 * 24 * 3  # typed over the last three days
    for i, cmd in enumerate(history):
        store.record(cmd, exit=0, cwd=str(cwd), git=BRANCH, session=SESSION, ts=start + i * 600)
    try:
        yield store
    finally:
        store.close()


def judged_project(root: Path, history: tuple[str, ...]) -> Project:
    """What the judges know: the folder, and the hosts and variables of the user's history."""
    hosts, variables = set(), set()
    for cmd in history:
        words = cmd.split()
        if words[0] in ("ssh", "ping", "scp") and len(words) > 1:
            hosts |= {w.rsplit("@", 1)[-1].split(":", 1)[0] for w in words[1:] if not w.startswith("-")}
        if words[0] in ("export", "unset"):
            variables |= {w.split("=", 1)[0] for w in words[1:]}
    return Project(root, frozenset(hosts), frozenset(variables))
