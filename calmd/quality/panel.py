"""The panel: no absurd ghost (issue 31). What a person meets in a small Python project.

    python -m calmd.quality.panel [--weights FILE] [--json FILE]

A real project folder is built in a temporary directory (README.md, pyproject.toml, src/weather/,
tests/, docs/, a Makefile, a Dockerfile, data.csv, a virtualenv's activate script, a git
repository with two branches when git is there). Two users type in it: a new user with an empty
history, and the same user after the few dozen ordinary commands of `HISTORY` (tests run, files
edited, commits pushed, an image built, a host reached). For each user calmd's engine (the packaged
model, the packaged ranker, calibration and ghost rule) is asked, as the daemon asks it, for each
of the `PREFIXES` people type every day: the input, the shell's cwd and branch, the history frames
(calmd/suggest/context.py `recent_context`), and the COMP and ENV frames the daemon fills
(calmd/daemon/comp_state.py) from the real folder.

Each prefix is written down with the KIND of a sensible next word (a module after `python3 -m`, an
operation after `tar`, a resource after `kubectl get`, a variable after `export`, an existing path
where a path belongs ...), and the ghost drawn (the candidate flagged `ghost`; its `draw` where the
engine draws only the first words of it) is judged past the typed prefix by that kind's judge:
- `placeholder`: it holds a documentation stand-in (calmd/suggest/filters.py `PLACEHOLDERS`:
  `example.com`, `user@`, `<file>`, `path/to/` ...): never to be drawn;
- `absurd`: its next word is not of the kind (`tar README.md`, `kill -9 Documents`, a folder that
  is not there);
- `sensible`: it is.
The judges are written here from what the project holds and what the commands take, independently
of the engine's filters (calmd/suggest/kinds.py), which they check.

Targets (issue 31): at most 1 drawn ghost in 20 absurd, at least 40% of the (prefix, user) pairs
drawing one, no placeholder drawn. tests/test_panel.py runs it and asserts them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.history.store import HistoryStore
from calmd.suggest.context import HISTORY_FRAMES, recent_context
from calmd.suggest.disk import Disk
from calmd.suggest.filters import placeholder
from calmd.suggest.frames import short_env

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


# --------------------------------------------------------------------------- the judges


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


Judge = Callable[[list[str], Project], str | None]  # the drawn words past the prefix -> why absurd, or None
_FLAG = re.compile(r"--?[A-Za-z0-9][\w-]*(=.*)?\Z")
_FILE_EXT = re.compile(
    r".+\.(md|txt|csv|json|toml|ya?ml|html?|py|cfg|ini|log|sh|lock|gz|tar|zip|whl)\Z", re.I
)


def _flag(word: str) -> bool:
    return bool(_FLAG.match(word))


def _ip(word: str) -> bool:
    try:
        ipaddress.ip_address(word)
        return True
    except ValueError:
        return False


def _host(word: str, project: Project) -> bool:
    host = word.rsplit("@", 1)[-1].split(":", 1)[0]
    if host in project.hosts or host == "localhost" or _ip(host):
        return True
    return "." in host and not _FILE_EXT.match(host) and bool(re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z]", host))


def one_of(names: frozenset[str], what: str, *, flags: bool = True) -> Judge:
    """The next word is one of `names` (or a flag)."""

    def judge(words: list[str], project: Project) -> str | None:
        w = words[0]
        if w in names or (flags and _flag(w)):
            return None
        return f"{w!r} is no {what}"

    return judge


def path(*, folder: bool = False, flags: bool = True, new_ok: bool = False) -> Judge:
    """An existing path of the project (`new_ok`: or a new file's name, as an editor makes one)."""

    def judge(words: list[str], project: Project) -> str | None:
        w = words[0]
        if flags and _flag(w):
            return None
        if project.exists(w, folder=folder) or (folder and w == "-"):
            return None
        if new_ok and "/" not in w.rstrip("/") and _FILE_EXT.match(w):
            return None
        return f"{w!r} is no {'folder' if folder else 'path'} of the project"

    return judge


def module(words: list[str], project: Project) -> str | None:
    top = words[0].split(".", 1)[0]
    if top in STANDARD_MODULES or top in PYTHON_TOOLS or top == PROJECT or project.exists(f"{top}.py"):
        return None
    return f"{words[0]!r} is no module"


def python(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w == "-m":
        return module(words[1:], project) if len(words) > 1 else None
    if _flag(w) or (w.endswith(".py") and project.exists(w)):
        return None
    return f"{w!r} is no Python script nor flag"


def host(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or _host(w, project):
        return None
    return f"{w!r} is no host"


def url(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w):
        return None
    m = re.match(r"(https?|ftp)://([^/:?#]+)", w)
    hostname = m.group(2) if m else w.split("/", 1)[0].split(":", 1)[0]
    if _host(hostname, project):
        return None
    return f"{w!r} is no URL"


def scp(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or project.exists(w) or (":" in w and _host(w.split(":", 1)[0], project)):
        return None
    return f"{w!r} is no local path nor host:path"


def tar(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[vzjJfp]*[ctxru][vzjJfp]*", w):
        return None
    return f"{w!r} is no tar operation"


def find_expression(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w in FIND_TESTS or w in ("(", "!", "\\("):
        return None
    return f"{w!r} is no find expression"


def signal_or_pid(words: list[str], project: Project) -> str | None:
    for w in words:
        if w in ("-s", "-l", "-L", "--") or re.fullmatch(r"-(\d{1,2}|(SIG)?[A-Z]+)", w):
            continue
        if not re.fullmatch(r"\d+|%\d*|\$\S+", w):
            return f"{w!r} is no signal, pid nor job"
    return None


def variable(words: list[str], project: Project) -> str | None:
    for w in words:
        if _flag(w):
            continue
        name, eq, _ = w.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            return f"{w!r} is no variable"
        if not eq and name != name.upper() and name not in project.variables:
            return f"{w!r} is no variable one exports"
    return None


def package(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w in BRANCHES or (w not in (".", "./") and project.exists(w)):
        return f"{w!r} is the project's own branch or file, copied where a package belongs"
    if w in (".", "-e", "-r", "--editable", "--requirement"):
        rest = words[1:2]
        return None if not rest or project.exists(rest[0]) else f"{rest[0]!r} is not in the project"
    if _flag(w):
        return None
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,]+\])?([<>=!~]=?\S+)?", w) and not _FILE_EXT.match(w):
        return None
    return f"{w!r} is no package"


def unit(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[a-z][\w@-]*(\.(service|socket|timer|target|mount|path))?", w):
        return None
    return f"{w!r} is no unit"


def image(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or (re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[\w.-]+)?", w) and not _FILE_EXT.match(w)):
        return None
    return f"{w!r} is no image"


def branch_or_path(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or w in BRANCHES or w == "-" or project.exists(w) or w.startswith("HEAD"):
        return None
    return f"{w!r} is no branch nor path"


def remote(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or w == "origin":
        return None
    return f"{w!r} is no remote"


def pattern(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or not project.exists(w):
        return None  # a pattern is any word; a file name first means the pattern was left out
    return f"{w!r} is a file where grep's pattern belongs"


def mode(words: list[str], project: Project) -> str | None:
    w = words[0]
    if re.fullmatch(r"[ugoa]*[-+=][rwxXst]+|[0-7]{3,4}|-R|--\w[\w-]*", w):
        return None
    return f"{w!r} is no mode"


def script(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[a-z][\w:-]*", w):
        return None
    return f"{w!r} is no script name"


def link_target(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or project.exists(w) or (w.startswith("/") and os.path.exists(w)):
        return None
    return f"{w!r} names nothing to link to"


def sub(*names: str) -> frozenset[str]:
    return frozenset(" ".join(names).split())


STANDARD_MODULES = frozenset(sys.stdlib_module_names)
PYTHON_TOOLS = sub("pip pytest venv black ruff mypy flake8 pylint isort coverage build twine ipykernel",
                   "jupyter notebook uvicorn gunicorn flask django mkdocs sphinx pipx poetry tox nox",
                   "virtualenv pre_commit IPython")  # fmt: skip
FIND_TESTS = sub("-name -iname -type -path -ipath -regex -maxdepth -mindepth -mtime -mmin -atime -size",
                 "-newer -empty -user -group -perm -exec -execdir -delete -print -print0 -ls -prune",
                 "-not -o -a -and -or -L -H -P -xdev -follow -wholename -readable -writable",
                 "-executable")  # fmt: skip
GIT = sub("add am apply archive bisect blame branch checkout cherry-pick clean clone commit config diff",
          "fetch grep init log merge mv pull push rebase reflog remote reset restore revert rm show",
          "stash status switch tag worktree submodule describe shortlog ls-files gc fsck")  # fmt: skip
DOCKER = sub("attach build builder buildx commit compose container context cp create diff events exec",
             "export history image images import info inspect kill load login logout logs network",
             "pause port ps pull push rename restart rm rmi run save search start stats stop system",
             "tag top unpause update version volume wait")  # fmt: skip
KUBECTL = sub("annotate api-resources apply attach auth autoscale cluster-info config cordon cp create",
              "debug delete describe diff drain edit events exec explain expose get label logs patch",
              "port-forward proxy rollout run scale set taint top uncordon version wait")  # fmt: skip
RESOURCES = sub("all pods pod po deployments deployment deploy services service svc nodes node no",
                "namespaces namespace ns configmaps configmap cm secrets secret ingress ingresses ing",
                "jobs job cronjobs cronjob cj pv pvc persistentvolumeclaims persistentvolumes",
                "statefulsets sts daemonsets ds replicasets rs events ev endpoints ep",
                "serviceaccounts sa roles rolebindings clusterroles hpa crd")  # fmt: skip
SYSTEMCTL = sub("status start stop restart reload enable disable is-active is-enabled is-failed",
                "daemon-reload list-units list-unit-files list-timers cat edit mask unmask kill",
                "show reboot poweroff suspend --user --failed")  # fmt: skip
NPM = sub("install i ci run test start build init publish update uninstall ls list audit outdated",
          "exec link pack version view cache config login whoami prune dedupe fund doctor")  # fmt: skip
CARGO = sub("build b check c run r test t bench doc new init add remove update clean fmt clippy",
            "install uninstall publish search tree fix metadata package vendor login")  # fmt: skip
PIP = sub("install uninstall list freeze show download wheel check config cache search hash index")
JOURNALCTL_FLAGS = sub("-u -f -e -x -xe -b -k -n -p -r -o --since --until --unit --user --follow",
                       "--boot --no-pager --disk-usage --vacuum-size --vacuum-time -xeu -fu")  # fmt: skip


@dataclass(frozen=True)
class Prefix:
    typed: str
    kind: str  # the kind of a sensible next word, in words
    judge: Judge


PREFIXES: tuple[Prefix, ...] = tuple(Prefix(t, k, j) for t, k, j in (
    ("python3 -m ", "a module", module),
    ("python3 ", "a script of the project or a flag", python),
    ("pip install ", "a package name, -e ., -r FILE of the project, a flag", package),
    ("pip ", "a pip subcommand", one_of(PIP, "pip subcommand")),
    ("git ", "a git subcommand", one_of(GIT, "git subcommand")),
    ("git checkout ", "a branch, -b NAME, -, a path", branch_or_path),
    ("git add ", "a path of the project or a flag", path()),
    ("git commit ", "a flag (-m, -a, --amend)", one_of(frozenset(), "commit flag")),
    ("git push ", "a remote or a flag", remote),
    ("docker ", "a docker subcommand", one_of(DOCKER, "docker subcommand")),
    ("docker run ", "a flag or an image", image),
    ("docker build ", "a flag or the context folder", path(folder=True)),
    ("kubectl ", "a kubectl subcommand", one_of(KUBECTL, "kubectl subcommand")),
    ("kubectl get ", "a resource type", one_of(RESOURCES, "resource type")),
    ("ssh ", "a host (never a placeholder) or a flag", host),
    ("scp ", "a local path or host:path", scp),
    ("ping ", "a host or a flag", host),
    ("curl ", "a URL or a flag", url),
    ("wget ", "a URL or a flag", url),
    ("tar ", "an operation (-xzf, czf, --extract)", tar),
    ("find . ", "a whole test or option (-name, -type ...)", find_expression),
    ("find ", "a path or an option", path()),
    ("make ", "a target of the Makefile or a flag", one_of(MAKE_TARGETS, "target of the Makefile")),
    ("systemctl ", "a systemctl subcommand", one_of(SYSTEMCTL, "systemctl subcommand")),
    ("systemctl status ", "a unit", unit),
    ("journalctl ", "a flag", one_of(JOURNALCTL_FLAGS, "journalctl flag")),
    ("kill ", "a signal, a pid or %job", signal_or_pid),
    ("kill -9 ", "a pid or %job", signal_or_pid),
    ("export ", "a VARIABLE or NAME=value", variable),
    ("unset ", "a variable", variable),
    ("cd ", "a folder of the project, -, ..", path(folder=True)),
    ("ls ", "a path of the project or a flag", path()),
    ("mv ", "a path of the project or a flag", path()),
    ("cp ", "a path of the project or a flag", path()),
    ("rm ", "a path of the project or a flag", path()),
    ("cat ", "a file of the project", path(flags=False)),
    ("vim ", "a file of the project, or a new file", path(new_ok=True)),
    ("grep ", "a flag or a pattern", pattern),
    ("sudo apt install ", "a package name", package),
    ("npm ", "an npm subcommand", one_of(NPM, "npm subcommand")),
    ("npm run ", "a script name", script),
    ("cargo ", "a cargo subcommand", one_of(CARGO, "cargo subcommand")),
    ("chmod ", "a mode or a flag", mode),
    ("ln -s ", "an existing path to link to", link_target),
    ("source ", "a file to source (the virtualenv's activate)", path(flags=False)),
    ("head ", "a file of the project or a flag", path()),
    ("tail -f ", "a file of the project", path(flags=False)),
    ("python3 -m pytest ", "a test path or a flag", path()),
))  # fmt: skip


def judge(prefix: Prefix, drawn: str, project: Project) -> tuple[str, str]:
    """(verdict, why) of a drawn ghost for the prefix: `placeholder`, `absurd` or `sensible`."""
    name = placeholder(drawn, prefix.typed)
    if name is not None:
        return "placeholder", name
    rest = drawn[len(prefix.typed) :] if drawn.startswith(prefix.typed) else drawn
    words = rest.split()
    if not words:
        return "sensible", "nothing past the prefix"
    why = prefix.judge(words, project)
    return ("absurd", why) if why is not None else ("sensible", "")


# --------------------------------------------------------------------------- the run


@dataclass
class Row:
    prefix: str
    kind: str
    user: str
    drawn: str | None  # the text drawn, None when no ghost
    verdict: str  # sensible / absurd / placeholder / none
    why: str = ""
    top: str | None = None  # the top candidate, drawn or not
    ms: float = 0.0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    weights: str = ""

    def pairs(self, user: str | None = None) -> list[Row]:
        return [r for r in self.rows if user is None or r.user == user]

    def figures(self, user: str | None = None) -> dict[str, Any]:
        rows = self.pairs(user)
        drawn = [r for r in rows if r.drawn is not None]
        absurd = sum(r.verdict == "absurd" for r in drawn)
        return {
            "prefixes": len(rows),
            "drawn": len(drawn),
            "drawn_share": len(drawn) / len(rows) if rows else 0.0,
            "absurd": absurd,
            "absurd_share": absurd / len(drawn) if drawn else 0.0,
            "placeholders": sum(r.verdict == "placeholder" for r in drawn),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "figures": {"all": self.figures(), **{u: self.figures(u) for u in USERS}},
            "rows": [asdict(r) for r in self.rows],
            "seconds": round(self.seconds, 1),
            "weights": self.weights,
        }


USERS = ("new", "returning")


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


@contextmanager
def user_history(folder: Path, history: tuple[str, ...], cwd: Path) -> Iterator[HistoryStore]:
    """The store `folder`/history.sqlite3 holding `history`, typed in `cwd` on `BRANCH` in
    `SESSION` over the last three days (also what tests/test_panel_shells.py gives a daemon)."""
    store = HistoryStore(paths.history_path(folder))
    start = time.time() - 3600 * 24 * 3  # typed over the last three days
    for i, cmd in enumerate(history):
        store.record(cmd, exit=0, cwd=str(cwd), git=BRANCH, session=SESSION, ts=start + i * 600)
    try:
        yield store
    finally:
        store.close()


def run_panel(
    weights: Path | None = None, prefixes: tuple[Prefix, ...] = PREFIXES, min_confidence: float | None = None
) -> Report:
    """The panel (the module docstring) with the model `weights` (default: the packaged one) and
    the packaged ghost rule, or one threshold everywhere (`min_confidence`: CALM_MIN_CONFIDENCE)."""
    from calmd.daemon.comp_state import SessionComp
    from calmd.suggest.engine import ModelEngine

    started = time.monotonic()
    report = Report(weights=str(weights or paths.packaged_weights()))
    engine = ModelEngine(weights or paths.packaged_weights())
    # Listings waited for (the daemon waits 2 ms and uses them from the next keystroke on): the
    # panel judges what a user sees once the folder is known, not the first keystroke's race.
    disk = Disk(budget=1.0)
    engine.attach_disk(disk)
    never = threading.Event()
    with tempfile.TemporaryDirectory(prefix="calm-panel-") as tmp:
        root = build_project(Path(tmp))
        for user in USERS:
            history = HISTORY if user == "returning" else ()
            folder = Path(tmp) / f"data-{user}"
            folder.mkdir()
            with user_history(folder, history, root) as store:
                engine.attach_history(store)
                comp = SessionComp(disk)
                project = judged_project(root, history)
                frames = [
                    {"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, SESSION, HISTORY_FRAMES)
                ]
                env = short_env(str(root / ".venv")) if user == "returning" else ""
                for i, prefix in enumerate(prefixes):
                    ctx: dict[str, Any] = {"input": prefix.typed, "cwd": str(root), "git": BRANCH,
                                           "history": frames, **({"env": env} if env else {})}  # fmt: skip
                    session = f"{user}-{i}"  # each prefix a fresh keystroke (no typing through)
                    comp.fill(ctx, session, engine.followers)
                    t0 = time.perf_counter()
                    got = list(engine.complete(ctx, 5, session, never, lambda *_: None,
                                               min_confidence=min_confidence))  # fmt: skip
                    ms = (time.perf_counter() - t0) * 1e3
                    ghost = next((s for s in got if s.ghost), None)
                    row = Row(prefix.typed, prefix.kind, user, None, "none", top=got[0].text if got else None,
                              ms=round(ms, 1))  # fmt: skip
                    if ghost is not None:
                        row.drawn = getattr(ghost, "draw", None) or ghost.text
                        row.verdict, row.why = judge(prefix, row.drawn, project)
                    report.rows.append(row)
    disk.close()
    report.seconds = time.monotonic() - started
    return report


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


def render(report: Report) -> str:
    """The readable report: one line per prefix with each user's ghost and verdict, then the totals."""
    lines = [f"The panel: no absurd ghost ({report.weights}, {report.seconds:.0f} s)", ""]
    by_prefix: dict[str, dict[str, Row]] = {}
    for row in report.rows:
        by_prefix.setdefault(row.prefix, {})[row.user] = row
    width = max(len(p) for p in by_prefix) + 2
    for typed, users in by_prefix.items():
        kind = next(iter(users.values())).kind
        lines.append(f"{typed!r:<{width}} ({kind})")
        for name in USERS:
            found = users.get(name)
            if found is None:
                continue
            if found.drawn is None:
                lines.append(f"    {name:<10} -  no ghost (top: {found.top!r})")
            else:
                mark = {"sensible": "ok", "absurd": "ABSURD", "placeholder": "PLACEHOLDER"}[found.verdict]
                why = f"  ({found.why})" if found.why and found.verdict != "sensible" else ""
                lines.append(f"    {name:<10} {mark:<11} {found.drawn!r}{why}")
    lines.append("")
    for who in (None, *USERS):
        f = report.figures(who)
        lines.append(
            f"{who or 'both users':<11} ghost drawn for {f['drawn']}/{f['prefixes']} prefixes "
            f"({f['drawn_share']:.0%}); absurd {f['absurd']}/{f['drawn']} drawn ({f['absurd_share']:.1%}); "
            f"placeholders drawn {f['placeholders']}"
        )
    lines.append("targets: absurd <= 5% of drawn, drawn >= 40% of prefixes, no placeholder")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, default=None, help="a model file (default: the packaged one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and figures here")
    parser.add_argument("--min-confidence", type=float, default=None, metavar="P",
                        help="one threshold in place of the rule (CALM_MIN_CONFIDENCE)")  # fmt: skip
    args = parser.parse_args(argv)
    report = run_panel(args.weights, min_confidence=args.min_confidence)
    print(render(report))
    if args.json is not None:
        from calmd.atomic import atomic_write

        with atomic_write(args.json) as f:
            f.write((json.dumps(report.to_json(), indent=1) + "\n").encode())
    return 0


PROG = "python -m calmd.quality.panel"

if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
