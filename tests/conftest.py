"""What every test shares.

- Its own data dir and socket path, so that no test (or a calm/calmd it starts) can read or write
  the real user's history, weights or daemon.
- One torch thread count for the whole suite (TEST_THREADS), restored after any test that changes
  it (`calm train --threads`, the background run): a test's speed does not depend on the one before.
- `@pytest.mark.needs(...)`: programs a test drives (tests/support/tools.py).
- The session's tiny trained models (tests/support/tiny_model.py), trained by one worker.
- What the suite builds (the scan kernel, the rewritten test modules) kept between runs: in
  pytest's cache, or without it in the user's private folder of the suite (private_folder).
"""

from __future__ import annotations

import fcntl
import inspect
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.model import fastscan
from calmd.shell.client import CalmClient
from tests.support.tools import in_ci, need
from tests.support.waiting import HANG_S

if TYPE_CHECKING:
    from tests.support.daemon import Daemon


def private_folder(name: str) -> Path | None:
    """A folder of this user's that outlives the session, for what the suite builds and the next run
    reuses where pytest has no cache (`-p no:cacheprovider`): under the temporary directory, 0700,
    and used only when it is this user's own (not a link, nobody else can write it), else None."""
    folder = Path(tempfile.gettempdir()) / f"calm-tests-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        held = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid() or held.st_mode & 0o077:
        return None
    (folder / name).mkdir(exist_ok=True)
    return folder / name


def pytest_configure(config: pytest.Config) -> None:
    """In CI (CI=true) the run ends with the slowest tests' durations, whatever command ran it.

    Where PYTHONDONTWRITEBYTECODE is set, pytest rewrote every test module's asserts again in every
    worker of every run (4 CPU-seconds a worker): the rewritten modules go to pytest's cache folder
    instead, or without one to the user's private folder of the suite (sys.pycache_prefix, outside
    the source tree, which stays as the setting wants it)."""
    if in_ci() and config.option.durations is None:  # --durations=0 asks for all of them
        config.option.durations = 15
    if not sys.dont_write_bytecode:
        return
    cache = getattr(config, "cache", None)
    folder = Path(cache.mkdir("pycache")) if cache is not None else private_folder("pycache")
    if folder is not None:
        sys.pycache_prefix = str(folder)
        sys.dont_write_bytecode = False


# running_daemon (tests/support/daemon.py), its argv lists, or `calmd serve` run as a command
STARTS_A_DAEMON = re.compile(r'running_daemon\(|CALMD_SERVE|SCRIPTED_SERVE|"calmd"\)?, "serve"')


def _starts_a_daemon(item: pytest.Item) -> bool:
    """A test that starts `calmd serve` (tests/support/daemon.py): through the `daemon` fixture, or by
    calling running_daemon, itself or through a helper of its module that does (read from the
    sources: no marker to forget)."""
    if "daemon" in getattr(item, "fixturenames", ()):
        return True
    function = getattr(item, "function", None)
    if function is None:
        return False
    if function not in _STARTS:  # read once per function, not once per parameter (2,000 of them)
        module = getattr(item, "module", None)
        _STARTS[function] = _calls_running_daemon(function, vars(module) if module else {}, set())
    return _STARTS[function]


_STARTS: dict[object, bool] = {}


def _calls_running_daemon(function: object, names: dict[str, object], seen: set[str]) -> bool:
    try:
        source = inspect.getsource(function)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    if STARTS_A_DAEMON.search(source):
        return True
    for name, value in names.items():
        if (
            name not in seen
            and inspect.isfunction(value)
            and value.__module__ == getattr(function, "__module__", None)
            and f"{name}(" in source
        ):
            seen.add(name)
            if _calls_running_daemon(value, names, seen):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts a daemon is `slow` (a process, a socket, seconds): the fast loop
    (`pytest -m "not slow"`) leaves them to the whole suite."""
    for item in items:
        if not item.get_closest_marker("slow") and _starts_a_daemon(item):
            item.add_marker(pytest.mark.slow)
    # The modules of slow tests first (the larger their share of slow tests, the earlier), each
    # kept whole (module fixtures are built once): pytest-xdist hands tests out in this order, so
    # the long ones start early and the short ones fill the end, instead of one worker finishing
    # a training test while the other waits.
    counts: dict[object, list[int]] = {}
    for item in items:
        slow_and_all = counts.setdefault(getattr(item, "module", None), [0, 0])
        slow_and_all[0] += item.get_closest_marker("slow") is not None
        slow_and_all[1] += 1
    items.sort(
        key=lambda item: -counts[getattr(item, "module", None)][0] / counts[getattr(item, "module", None)][1]
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.needs("zsh", "tmux")`: the programs a test drives (tests/support/tools.py)."""
    for mark in item.iter_markers("needs"):
        need(*mark.args)


TEST_THREADS = 1  # tiny models: one thread is the fastest, and the same on every machine


@pytest.fixture(autouse=True, scope="session")
def _threads_for_the_session() -> None:
    torch.set_num_threads(TEST_THREADS)  # before any module's fixture trains a model


@pytest.fixture(autouse=True)
def _pinned_threads(_threads_for_the_session: None) -> Iterator[None]:
    torch.set_num_threads(TEST_THREADS)
    yield
    torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """CALM_CACHE for the whole session, never the user's own ~/.cache/calm: the compiled kernels
    are built once, by the first worker (the other waits on the lock), and every daemon the tests
    start gets the same folder (tests/support/daemon.py). The folder is pytest's cache when it has one
    (.pytest_cache, kept between runs: the next run builds nothing), else the user's private folder
    of the suite (private_folder), else one of the session; matplotlib's cache beside it."""
    cache = getattr(request.config, "cache", None)
    private = private_folder("calm-kernels") if cache is None else None
    if cache is not None:
        folder = Path(cache.mkdir("calm-kernels"))
    elif private is not None:  # -p no:cacheprovider: built once, not again in every run
        folder = private
    else:  # no folder of the user's: the session's temporary folder, which the workers share
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "calm-kernels"
        folder.mkdir(exist_ok=True)
    saved = {name: os.environ.get(name) for name in ("CALM_CACHE", "MPLCONFIGDIR")}
    os.environ["CALM_CACHE"] = str(folder)
    os.environ["MPLCONFIGDIR"] = str(folder.parent / "calm-matplotlib")
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build, not one per worker and daemon starting at once
        fastscan.library()
    yield folder
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="session")
def _clients_wait_as_long_as_a_hang() -> Iterator[None]:
    """A test's CalmClient waits for its reply up to the ceiling of tests/support/waiting.py, not the 10 s
    after which a shell's client gives up: on a busy machine a slow reply is not a failure, and a
    daemon that never answers is still caught. (The tests of a client's timeout pass their own.)"""
    defaults = CalmClient.__init__.__kwdefaults__
    CalmClient.__init__.__kwdefaults__ = {**defaults, "timeout": HANG_S}
    yield
    CalmClient.__init__.__kwdefaults__ = defaults


@pytest.fixture(autouse=True, scope="session")
def _training_runs_at_the_daemons_priority() -> Iterator[None]:
    """The daemons' training runs at their daemon's priority, not SCHED_IDLE (tests/support/daemon.py
    SUITE_ENV): beside a CPU hog at nice 0 an idle-priority run gets nothing for hours."""
    from calmd.daemon.trainer import TEST_PRIORITY_ENV
    from tests.support.daemon import SUITE_ENV

    SUITE_ENV[TEST_PRIORITY_ENV] = "inherit"
    yield
    SUITE_ENV.pop(TEST_PRIORITY_ENV, None)


@pytest.fixture(autouse=True)
def _in_process_imports_keep_the_workers_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """`calm import` lowers its own priority (calmd/cli/history.py IMPORT_NICE): called in process by
    a test, it lowered the xdist worker's for good (nice 10, then 19 after a second), and every later
    test of that worker, with the daemons and training runs it started, ran below everything else:
    beside a CPU hog, a whole run stalled behind it. In a subprocess it renices itself as for users."""
    import calmd.cli.history

    monkeypatch.setattr(calmd.cli.history, "IMPORT_NICE", 0)


@pytest.fixture(autouse=True)
def _private_calm_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("calm-home")
    monkeypatch.setenv("CALM_HOME", str(home / "data"))
    monkeypatch.setenv("CALMD_SOCKET", str(home / "no-daemon.sock"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg-data"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A test's HOME for the daemon, the shells and their data dir (tests/support/daemon.py)."""
    return tmp_path


@pytest.fixture
def daemon(home: Path) -> Iterator[Daemon]:
    """`calmd serve` with the scripted engine in `home`, stopped after the test."""
    from tests.support.daemon import running_daemon

    with running_daemon(home) as d:
        yield d


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    """An empty history store where a daemon in tmp_path would keep it."""
    s = HistoryStore(tmp_path / "data" / paths.HISTORY)
    yield s
    s.close()


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """NAME in the session's folder that every xdist worker sees, built by the first worker that
    asks (the others wait on its lock, then read it): a model is trained once a run, not once a
    worker. The build writes atomically, so a file there is a whole one."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    folder.mkdir(exist_ok=True)
    path = folder / name
    with open(folder / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            build(path)
    return path


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny trained model of tests/support/tiny_model.py as a weight file, trained once per session
    (a few seconds on a quiet machine, minutes on a busy one). Read it; copy it to change it."""
    from tests.support.tiny_model import save_tiny

    return built_once(tmp_path_factory, "tiny.cwgt", save_tiny)


@pytest.fixture(scope="session")
def other_tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model, trained once per session on other lines (`make install` first): the
    model a swap or a comparison puts beside tiny_weights. Read it; copy it to change it."""
    from tests.support.tiny_model import OTHER_COMMANDS, save_tiny, train_tiny

    return built_once(
        tmp_path_factory, "other.cwgt", lambda path: save_tiny(path, train_tiny(OTHER_COMMANDS, favourite=0))
    )
