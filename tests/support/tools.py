"""The programs tests drive (zsh, bash, tmux, systemd's tools, g++): present, or the test cannot run.

Outside CI a missing program skips the test with its reason (a newcomer without zsh still gets a
green run of everything else); in CI (CI=true) it fails, because .ci/run installs every one of
them and a skip there would hide a whole layer of tests.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def need(*programs: str) -> None:
    """Skip (fail under CI=true) when a program the test runs is not on PATH."""
    missing = [program for program in programs if shutil.which(program) is None]
    if not missing:
        return
    reason = f"needs {', '.join(missing)}, not installed"
    if in_ci():
        pytest.fail(f"{reason}: .ci/run installs it, so CI must not skip this test", pytrace=False)
    pytest.skip(reason)


def need_file(path: Path | None, what: str) -> Path:
    """Like `need`, for a file a test loads (a zsh plugin): skip, or fail under CI=true."""
    if path is not None and path.is_file():
        return path
    reason = f"needs {what}, not installed"
    if in_ci():
        pytest.fail(f"{reason}: .ci/run installs it, so CI must not skip this test", pytrace=False)
    pytest.skip(reason)


# Where the public data of ../shared/data lives: beside the repository (a developer's checkout),
# where $CALM_SHARED_DATA says (.ci/run sets it when it finds the data), or where this project's
# machines mount it.
SHARED_DATA_PLACES = (
    Path(__file__).resolve().parents[3] / "shared" / "data",
    Path("/work/shared/data"),
)


def shared_data(*parts: str) -> Path:
    """A folder of the shared data (`shared_data("histories", "users")`): skip when it is not on this
    machine, fail under CI=true, where .ci/run finds it."""
    places = [Path(os.environ["CALM_SHARED_DATA"])] if os.environ.get("CALM_SHARED_DATA") else []
    for base in [*places, *SHARED_DATA_PLACES]:
        folder = base.joinpath(*parts)
        if folder.is_dir():
            return folder
    reason = f"needs the shared data ({'/'.join(('shared', 'data', *parts))}), not found"
    if in_ci():
        pytest.fail(f"{reason}: .ci/run sets CALM_SHARED_DATA, so CI must not skip this test", pytrace=False)
    pytest.skip(reason)


def need_root(why: str) -> None:
    """Skip a test that needs root (`why`) when not root; fail under CI=true, which runs as root."""
    if os.getuid() == 0:
        return
    if in_ci():
        pytest.fail(f"needs root {why}: CI runs as root, so it must not skip this test", pytrace=False)
    pytest.skip(f"needs root {why}")
