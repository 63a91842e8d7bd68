"""No absurd ghost (issue 31): the panel as a user meets it, and each filter that keeps it clean."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.quality.panel import PREFIXES, Project, build_project, judge, render, run_panel
from calmd.quality.panel_project import PROJECT, panel_home
from calmd.suggest.disk import Disk
from calmd.suggest.engine import ModelEngine
from calmd.suggest.filters import packaged_vocabulary, placeholder
from calmd.suggest.kinds import UserArguments, wrong_kind

# --------------------------------------------------------------------------- the panel


def test_the_panel_meets_the_targets() -> None:
    """The packaged model in a real project folder, a new user and a returning one, with the rule
    as shipped: at most 1 drawn ghost in 20 absurd, no placeholder ever drawn, and the returning
    user drawn a ghost at 40% of the prefixes or more (a user with no history at all is drawn
    almost none: docs/quality.md, "The panel")."""
    report = run_panel()
    figures = report.figures()
    shown = render(report)
    assert len({r.prefix for r in report.rows}) >= 40
    assert figures["prefixes"] == 2 * len(PREFIXES)
    assert figures["placeholders"] == 0, shown
    assert report.figures("returning")["drawn_share"] >= 0.40, shown
    assert figures["absurd"] * 20 <= figures["drawn"], shown
    # the returning user's own lines are drawn for what they typed before
    returning = {r.prefix: r for r in report.rows if r.user == "returning"}
    assert returning["ssh "].drawn == "ssh build01"


def test_drawing_every_top_line_the_filters_keep_the_ghosts_sensible() -> None:
    """CALM_MIN_CONFIDENCE=0 draws (the head of) every top line: the filters alone keep the
    absurd ones out, for both users, while most prefixes draw a ghost."""
    report = run_panel(min_confidence=0.0)
    figures, shown = report.figures(), render(report)
    assert figures["drawn_share"] >= 0.40, shown
    assert figures["placeholders"] == 0, shown
    assert figures["absurd"] * 20 <= figures["drawn"], shown
    returning = {r.prefix: r for r in report.rows if r.user == "returning"}
    assert returning["python3 -m "].verdict == "sensible", shown


def test_the_panel_builds_its_project_in_the_same_folder_one_run_at_a_time() -> None:
    """The model reads the shell's cwd: the project's folder has the same name every run (a random
    temporary one made the answers differ run to run), and a second panel waits for the first."""
    with panel_home() as first:
        build_project(first)
        assert (first / PROJECT / "Makefile").exists()
        entered = threading.Event()

        def second() -> None:
            with panel_home() as again:
                assert again == first
                entered.set()

        waiting = threading.Thread(target=second)
        waiting.start()
        assert not entered.wait(0.3)  # held by the first (a hang would show as the join below)
    waiting.join(timeout=60)
    assert entered.is_set()
    assert not (first / PROJECT).exists()  # each run builds it afresh


def test_the_judges_call_absurd_what_the_issue_saw(tmp_path: Path) -> None:
    """The lines issue 31 found drawn are judged absurd or placeholders by the panel's judges."""
    project = Project(build_project(tmp_path))
    by_typed = {p.typed: p for p in PREFIXES}
    seen = {
        "python3 -m README.md": "absurd",
        "python3 -m photos": "absurd",
        "python3 -m pytest": "sensible",
        "tar README.md": "absurd",
        "tar docker": "absurd",
        "tar -xzf data.tar.gz": "sensible",
        "kubectl get index.html": "absurd",
        "kubectl get pods": "sensible",
        "ssh user@example.com": "placeholder",
        "wget https://example.com": "placeholder",
        "ping docker": "absurd",
        "kill docker": "absurd",
        "kill -9 Documents": "absurd",
        "export docker": "absurd",
        "export PATH": "sensible",
        "find . -": "absurd",
        "find . -name": "sensible",
        "mv Downloads": "absurd",
        "mv README.md": "sensible",
    }
    for line, verdict in seen.items():
        prefix = next(by_typed[t] for t in sorted(by_typed, key=len, reverse=True) if line.startswith(t))
        assert judge(prefix, line, project)[0] == verdict, line


# --------------------------------------------------------------------------- placeholders


@pytest.mark.parametrize(
    "line",
    [
        "ssh user@example.com",
        "wget https://example.com/file.zip",
        "ssh admin@server.example.org",
        "cp <file> backup/",
        "kubectl logs <pod-name>",
        "cat path/to/file",
        "export API_KEY=your_api_key",
        "git clone https://github.com/username/repo.git",
        "echo {{name}}",
        "ping foo.bar",
    ],
)
def test_placeholders_are_found(line: str) -> None:
    assert placeholder(line) is not None


@pytest.mark.parametrize(
    "line",
    [
        "ssh deploy@build01.lab.internal",
        "curl http://localhost:8000/forecast?city=Oslo",
        "sort <in.txt >out.txt",
        "docker ps --format '{{.Names}}'",
        "git clone https://github.com/torvalds/linux.git",
        "echo $((1<2))",
    ],
)
def test_real_values_are_no_placeholders(line: str) -> None:
    assert placeholder(line) is None


def test_a_placeholder_the_user_typed_is_theirs() -> None:
    assert placeholder("curl https://example.com/api", typed="curl https://example.com/") is None
    assert placeholder("curl https://example.com/api", typed="curl https://exa") is not None


# --------------------------------------------------------------------------- argument kinds


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel in ("README.md", "data.tar.gz", "src/weather/__init__.py", "mymodule.py", "docs/index.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    return tmp_path


@pytest.fixture
def exists(project: Path) -> Iterator[object]:
    disk = Disk(budget=1.0)
    yield lambda path: disk.exists(str(project), path)
    disk.close()


@pytest.mark.parametrize(
    "line",
    [
        "python3 -m pytest",
        "python3 -m http.server 8000",
        "python3 -m weather",  # src/weather/
        "python3 -m mymodule",  # mymodule.py
        "python3 script.py",
        "tar -xzf data.tar.gz",
        "tar xzf data.tar.gz",
        "tar --extract -f data.tar.gz",
        "kubectl get pods",
        "kubectl get deploy",
        "kill -9 1234",
        "kill %1",
        "kill -s TERM $pid",
        "export PATH",
        "export PATH=$PATH:~/bin",
        "export http_proxy=http://proxy:3128",
        "unset PYTHONPATH",
        "ping 192.168.1.10",
        "ping build01.lab.internal",
        "ssh -p 2222 deploy@build01.lab.internal",
        "scp README.md build02.lab.internal:/tmp/",
        "mv README.md docs/",
        "cp -r docs backup",
        "rm -rf docs",
        "ls -la src/",
        "chmod +x README.md",
        "git add README.md src/",
        "ln -s docs/index.md index.md",
        "docker build -t weather:dev .",
        "curl -X POST http://localhost:8000/api",
        "wget https://github.com/a/b/archive/main.zip",
        "cd -",
        "git checkout -",
        "tar -cf - docs",
        "find . -name '*.py'",
    ],
)
def test_arguments_of_their_kind_pass(line: str, exists: object) -> None:
    assert wrong_kind(line, "", exists=exists, vocab=packaged_vocabulary()) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "line",
    [
        "python3 -m README.md",
        "python3 -m photos",
        "python3 -m weather.py",
        "python3 README.md",
        "tar README.md",
        "tar docker",
        "kubectl get index.html",
        "kill docker",
        "kill -9 Documents",
        "export docker",
        "export Downloads",
        "export docker-compose.yml",
        "unset docker",
        "ping docker",
        "ping docker-compose.yml",
        "ssh dotfiles",
        "mv Downloads",
        "cp Documents/report.pdf .",
        "rm -rf build",
        "ls photos",
        "chmod +x install.sh",
        "git add index.html",
        "ln -s dotfiles",
        "docker build docker",
        "wget update",
        "find . -",
        "git checkout --",
    ],
)
def test_arguments_of_another_kind_go(line: str, exists: object) -> None:
    assert wrong_kind(line, "", exists=exists, vocab=packaged_vocabulary()) is not None  # type: ignore[arg-type]


def test_what_the_user_typed_or_ran_is_theirs(exists: object) -> None:
    """A word the user typed in full is never judged; hosts, modules and variables the user's own
    commands named pass afterwards."""
    vocab = packaged_vocabulary()
    assert wrong_kind("ping docker -c 3", "ping docker ", exists=exists, vocab=vocab) is None  # type: ignore[arg-type]
    assert wrong_kind("mv Downloads/a.txt .", "mv Downloads/a.txt ", exists=exists) is None  # type: ignore[arg-type]
    mine = UserArguments()
    for cmd in ("ssh build01", "python3 -m myapp.cli", "export editor_theme=dark"):
        mine.add(cmd)
    assert wrong_kind("ping build01", "", mine=mine) is None
    assert wrong_kind("python3 -m myapp", "", exists=exists, mine=mine) is None  # type: ignore[arg-type]
    assert wrong_kind("export editor_theme", "", mine=mine) is None
    assert wrong_kind("ping build02", "", mine=mine) is not None


def test_a_path_that_cannot_be_known_passes() -> None:
    """Without a disk (or a folder not listed in time) no path is judged: what cannot be known
    is not dropped."""
    assert wrong_kind("mv Downloads", "", exists=None) is None
    assert wrong_kind("mv Downloads", "", exists=lambda path: None) is None


# --------------------------------------------------------------------------- in the engine


@pytest.fixture(scope="module")
def engine() -> ModelEngine:
    return ModelEngine(paths.packaged_weights())


def _lines(engine: ModelEngine, store: HistoryStore, typed: str, cwd: Path) -> list[str]:
    engine.attach_history(store)
    disk = Disk(budget=1.0)
    engine.attach_disk(disk)
    try:
        ctx = {"input": typed, "cwd": str(cwd), "history": []}
        return [s.text for s in engine.complete(ctx, 5, f"t-{typed}", threading.Event())]
    finally:
        engine.disk = None
        disk.close()


def test_the_users_own_placeholder_line_is_sent(
    engine: ModelEngine, store: HistoryStore, tmp_path: Path
) -> None:
    """`curl https://example.com/health` the user really ran (their service is at example.com) is
    theirs: proposed; the model's own example.com lines are not."""
    store.record("curl https://example.com/health", exit=0, cwd=str(tmp_path), session="s")
    lines = _lines(engine, store, "curl ", tmp_path)
    assert "curl https://example.com/health" in lines
    assert [line for line in lines if placeholder(line) and line != "curl https://example.com/health"] == []


def test_the_engine_sends_no_absurd_argument(engine: ModelEngine, store: HistoryStore, project: Path) -> None:
    """A new user's first keystrokes: no line the model writes names a folder that is not there,
    a file where a module belongs, or a placeholder host."""
    for typed in ("python3 -m ", "tar ", "ssh ", "kill ", "export ", "mv "):
        for line in _lines(engine, store, typed, project):
            assert placeholder(line) is None, line
            assert wrong_kind(line, typed, exists=lambda p: (project / p).exists()) is None, line
