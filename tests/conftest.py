"""Every test runs with its own data dir and socket path, so that no test (or a calm/calmd it
starts) can read or write the real user's history, weights or daemon."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_calm_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("calm-home")
    monkeypatch.setenv("CALM_HOME", str(home / "data"))
    monkeypatch.setenv("CALMD_SOCKET", str(home / "no-daemon.sock"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg-data"))
