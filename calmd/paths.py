"""Default locations (calmd.md, "Paths"): platformdirs, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "calm"


def data_dir() -> Path:
    """Weights, history and datasets: $CALM_HOME, else the platform's user data dir."""
    override = os.environ.get("CALM_HOME")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP, appauthor=False))


def weights_path() -> Path:
    return data_dir() / "shell.cwgt"


def dataset_path() -> Path:
    return data_dir() / "train.ctds"


def history_path() -> Path:
    return data_dir() / "history.sqlite3"


def socket_path() -> Path:
    """$CALMD_SOCKET, else <user runtime dir>/calm/calmd.sock."""
    override = os.environ.get("CALMD_SOCKET")
    if override:
        return Path(override)
    return Path(platformdirs.user_runtime_dir(APP, appauthor=False)) / "calmd.sock"


def cache_dir() -> Path:
    """Things rebuilt on demand (the compiled scan kernel): $CALM_CACHE, else the user cache dir."""
    override = os.environ.get("CALM_CACHE")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP, appauthor=False))
