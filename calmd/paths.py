"""Default locations (README.md; docs/protocol.md for the socket): platformdirs, overridable by
environment variables.

And how calmd keeps them private: CALM_HOME is 0700 and every file in it 0600, because it holds
the user's whole shell history. `set_private_umask()` runs first in the daemon, the trainer and
the command lines, so that everything they create (SQLite's -wal and -shm included) is born
private; `private_data_dir()` creates CALM_HOME 0700, or tightens an existing one that belongs
to the user, and strips group and other bits from the files calmd keeps there.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import platformdirs

APP = "calm"
PRIVATE_UMASK = 0o077  # files 0600, folders 0700

log = logging.getLogger("calmd")

# What calmd keeps in CALM_HOME. Every file name is defined here and nowhere else; the start-up
# tightening touches only these, so that a CALM_HOME pointed at a shared folder loses nothing else.
HISTORY = "history.sqlite3"  # the history store (SQLite adds -wal, -shm, -journal beside it)
WEIGHTS = "shell.cwgt"  # the user's model, written by the background run (or `calm train`)
PREV_WEIGHTS = "shell.prev.cwgt"  # the model the last swap replaced: `calm rollback` restores it
RANKER = "ranker.json"  # the history ranker refitted on the user's commands (beside the weights)
PREV_RANKER = "ranker.prev.json"  # the ranker the last refit replaced: `calm rollback` restores it
DATASET = "train.ctds"  # `calm dataset`'s output and `calm train`'s default input
TRAINING_STATUS = "training.json"  # the background run's progress and result
TRAINING_LOCK = "training.lock"  # held by the one run of a CALM_HOME
TRAINING_LOG = "training.log"  # the background run's output
TRAINING_SUBDIR = "training"  # the background run's datasets, built from the history:
TRAINING_SET = "train.ctds"  # ... what it trains on,
HELDOUT_SET = "heldout.ctds"  # ... and the newest commands, for its not-worse check
HELPER_LOG = "shell-helper.log"  # the shell helpers' log
DISABLED_FLAG = "shell-disabled"  # `calm disable` creates it, `calm enable` removes it
HOOK_FILE = "calm.{shell}"  # `calmd init`'s output, sourced by the setup line
SYNC_CONFIG = "sync.json"  # `calm sync --folder DIR`: the sync folder, the mode, this host's name
SYNC_KEY = "sync.key"  # the key the sync folder's segments are sealed with (`calm sync key`)
SYNC_LOCK = "sync.lock"  # held by the one export/import of a CALM_HOME (the daemon's or `calm sync now`)
CANDIDATE_WEIGHTS = ".shell.candidate.{pid}.cwgt"  # a run's trained weights, before its not-worse check
LEGACY_ROLLBACK = ".shell.cwgt.rollback"  # what an older rollback left mid-swap: removed at start
DATA_FILES = (
    HISTORY, HISTORY + "-wal", HISTORY + "-shm", HISTORY + "-journal", WEIGHTS, PREV_WEIGHTS, RANKER,
    PREV_RANKER, DATASET,
    TRAINING_STATUS, TRAINING_LOG, TRAINING_LOCK, HELPER_LOG, HELPER_LOG + ".old", DISABLED_FLAG,
    HOOK_FILE.format(shell="zsh"), HOOK_FILE.format(shell="bash"), HOOK_FILE.format(shell="fish"),
    SYNC_CONFIG, SYNC_KEY, SYNC_LOCK,
)  # fmt: skip
PACKAGE_DATA = Path(__file__).resolve().parent / "data"  # shipped in the wheel: models, ranker, hooks
# What the package ships in PACKAGE_DATA (each rebuilt by the command its module names).
PACKAGED_MODEL = "default.cwgt"  # python -m calmd.training.recipe
PACKAGED_RANKER = "ranker.json"  # python -m calmd.quality.fit_ranker
PACKAGED_SEARCH_RANKER = "search_ranker.json"  # python -m calmd.quality.fit_search
PACKAGED_CALIBRATION = "calibration.json"  # python -m calmd.quality.fit_calibration
PACKAGED_GHOST = "ghost.json"  # python -m calmd.quality.fit_ghost
PACKAGED_VOCABULARY = "vocabulary.json"  # python -m calmd.quality.fit_vocabulary
PACKAGED_ANCHOR = "anchor.json"  # python -m calmd.quality.fit_anchor (the replay's anchor, no model)
PACKAGED_RERANKER = "reranker.json"  # python -m calmd.quality.fit_reranker (none is packaged: measured)
SOCKET = "calmd.sock"  # the daemon's socket, in the user runtime dir's calm/ folder
SYSTEMD_SOCKET_UNIT = "calmd.socket"  # the user units `calmd install-systemd` writes (from systemd/)
SYSTEMD_SERVICE_UNIT = "calmd.service"


def data_dir() -> Path:
    """Weights, history and datasets: $CALM_HOME, else the platform's user data dir."""
    override = os.environ.get("CALM_HOME")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP, appauthor=False))


def weights_path(data: Path | None = None) -> Path:
    return (data or data_dir()) / WEIGHTS


def prev_weights_path(weights: Path) -> Path:
    """Where the model a swap replaced is kept, beside the weights."""
    return weights.with_name(PREV_WEIGHTS)


def ranker_path(weights: Path) -> Path:
    """The user's history ranker, written by the background run beside the weights it serves
    with: the daemon's engine loader, given the weight path, finds it there."""
    return weights.with_name(RANKER)


def prev_ranker_path(ranker: Path) -> Path:
    """Where the ranker a refit replaced is kept, beside it."""
    return ranker.with_name(PREV_RANKER)


def dataset_path() -> Path:
    return data_dir() / DATASET


def history_path(data: Path | None = None) -> Path:
    return (data or data_dir()) / HISTORY


def candidate_weights_path(data: Path, pid: int) -> Path:
    return data / CANDIDATE_WEIGHTS.format(pid=pid)


def training_dir(data: Path) -> Path:
    return data / TRAINING_SUBDIR


def training_sets(data: Path) -> tuple[Path, Path]:
    """The background run's (training, held-out) datasets: derived from the history, so `calm
    forget` deletes them with the rows."""
    return training_dir(data) / TRAINING_SET, training_dir(data) / HELDOUT_SET


def sync_config_path(data: Path | None = None) -> Path:
    return (data or data_dir()) / SYNC_CONFIG


def sync_key_path(data: Path | None = None) -> Path:
    return (data or data_dir()) / SYNC_KEY


def sync_lock_path(data: Path | None = None) -> Path:
    return (data or data_dir()) / SYNC_LOCK


# Inside the sync folder (docs/sync.md): one folder per host, named by its random id, holding its
# numbered segments. Nothing else there is read (a sync engine's conflict copies, temp files).
SYNC_SEGMENT = "{seq:08d}.calm"


def sync_host_dir(folder: Path, host_id: str) -> Path:
    return folder / host_id


def sync_segment(folder: Path, host_id: str, seq: int) -> Path:
    return sync_host_dir(folder, host_id) / SYNC_SEGMENT.format(seq=seq)


def packaged_weights() -> Path:
    """The default model shipped inside the package (built by `python -m calmd.training.recipe`)."""
    return PACKAGE_DATA / PACKAGED_MODEL


def serving_weights(weights: Path | None = None) -> Path:
    """The model that serves: the user's weights (`weights`, else the data dir's) when the file
    exists, else the packaged default model."""
    user = weights or weights_path()
    return user if user.exists() else packaged_weights()


def socket_path() -> Path:
    """$CALMD_SOCKET, else <user runtime dir>/calm/calmd.sock."""
    override = os.environ.get("CALMD_SOCKET")
    if override:
        return Path(override)
    return Path(platformdirs.user_runtime_dir(APP, appauthor=False)) / SOCKET


def systemd_units_dir() -> Path:
    """Where `calmd install-systemd` writes the user units: systemd's own user unit folder."""
    return Path.home() / ".config" / "systemd" / "user"


def cache_dir() -> Path:
    """Things rebuilt on demand (the compiled scan kernel): $CALM_CACHE, else the user cache dir."""
    override = os.environ.get("CALM_CACHE")
    return Path(override) if override else Path(platformdirs.user_cache_dir(APP, appauthor=False))


# --------------------------------------------------------------------------- privacy


def set_private_umask() -> int:
    """Make every file and folder this process creates private (0600 / 0700); returns the old
    umask. Called first by `calmd serve`, the trainer and the command lines."""
    return os.umask(PRIVATE_UMASK)


def _strip_group_other(path: Path, st: os.stat_result) -> bool:
    """chmod away group and other bits of a file or folder we own; True when it changed."""
    if st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return False
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    return True


def private_dir(path: Path) -> Path:
    """Create `path` 0700 (missing parents too: XDG asks for 0700), or tighten it to owner-only
    when it exists and is the user's own. A folder of another user is left alone (logged)."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode goes through the umask of whoever called us
        return path
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a folder")
    if st.st_uid != os.getuid():
        log.warning("%s belongs to uid %d, not to us: its mode is left as it is", path, st.st_uid)
    elif _strip_group_other(path, st):
        log.warning("%s was readable by others: made it 0%o", path, stat.S_IMODE(st.st_mode) & ~0o077)
    return path


def private_data_dir(directory: Path) -> list[str]:
    """CALM_HOME 0700 and calmd's files in it owner-only (files written by an older calmd, or
    under a looser umask, were 0644). Returns the names it tightened."""
    private_dir(directory)
    tightened: list[str] = []
    candidates = [directory / name for name in DATA_FILES]
    work = training_dir(directory)
    if work.is_dir() and not work.is_symlink():
        candidates.append(work)
        candidates += [p for p in work.iterdir() if p.suffix in (".ctds", ".tmp", ".tokens")]
    for path in candidates:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and _strip_group_other(path, st):
            tightened.append(str(path.relative_to(directory)))
    if tightened:
        log.warning("made private (owner-only): %s", ", ".join(tightened))
    return tightened


class UnsafeSocketFolder(RuntimeError):
    """The socket's folder could let another user replace or remove our socket."""


def socket_dir(folder: Path) -> Path:
    """The socket's folder: created 0700 when missing; an existing one keeps its mode, but is
    refused when another user could swap the socket in it: not a folder, owned by another
    user (root aside), or writable by group or others without the sticky bit (a 1777 folder
    like /tmp is fine: the sticky bit keeps others from removing or renaming our socket, the
    socket itself is 0600 and peers of another uid are refused)."""
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)  # we created it: ours to make private
        return folder
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocketFolder(f"{folder} is not a folder")
    if st.st_uid not in (os.getuid(), 0):
        raise UnsafeSocketFolder(
            f"{folder} belongs to uid {st.st_uid}: that user could replace the socket; "
            "choose another place with --socket or CALMD_SOCKET"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeSocketFolder(
            f"{folder} is writable by others (mode 0{stat.S_IMODE(st.st_mode):o}) without the sticky "
            "bit: another user could replace the socket; choose another place with --socket or "
            "CALMD_SOCKET"
        )
    return folder
