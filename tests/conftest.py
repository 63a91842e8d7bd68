"""Every test runs with its own data dir and socket path, so that no test (or a calm/calmd it
starts) can read or write the real user's history, weights or daemon."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_calm_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("calm-home")
    monkeypatch.setenv("CALM_HOME", str(home / "data"))
    monkeypatch.setenv("CALMD_SOCKET", str(home / "no-daemon.sock"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg-data"))


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny trained model of tests/tiny_model.py as a weight file, trained once per session
    (a few seconds on a quiet machine, minutes on a busy one)."""
    from tests.tiny_model import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny.cwgt")
