"""Leaving sync for good (`calm forget --all`): what sync holds for this machine, and its deletion
under the sync lock."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.sync.config import SyncError, read_config, sync_lock
from calmd.sync.export import files_in
from calmd.sync.seal import HOST_ID


@dataclass(frozen=True)
class SyncHoldings:
    """What sync holds for this machine, as `calm forget --all` deletes it (`leave`): its files in
    CALM_HOME (sync.json, the key) and its share of the sync folder (its own sub-folder), with
    what stays in the folder (the other machines' shares) and the forgets made here that the other
    machines have not been sent yet (they would not forget those commands)."""

    files: tuple[Path, ...]  # sync.json and sync.key, those there
    folder: Path | None  # the sync folder sync.json names, else the one this machine last wrote its share in
    share: Path | None  # this machine's sub-folder there, when there is one
    segments: int  # the segments in it
    others: int  # the other machines' sub-folders in the folder
    unsent_forgets: int

    @property
    def anything(self) -> bool:
        return bool(self.files or self.share or self.unsent_forgets)


def sync_holdings(data_dir: Path, store: HistoryStore | None) -> SyncHoldings:
    """What sync holds for this machine (reads only). Its share is found whether sync is on or off
    (`calm sync --off` keeps the folder and the share): in the folder sync.json names, else in the
    one it last wrote its share in (`sync_folder`, kept by each export)."""
    files = tuple(p for p in (paths.sync_config_path(data_dir), paths.sync_key_path(data_dir)) if p.is_file())
    try:
        config = read_config(paths.sync_config_path(data_dir))
    except SyncError:
        config = None  # deleted all the same; which folder it named is unknown
    host_id, unsent, last_folder = None, 0, None
    if store is not None:
        with store.reading() as db:
            sql = "SELECT key, value FROM meta WHERE key IN ('sync_host_id', 'sync_folder')"
            meta = dict(db.execute(sql).fetchall())
            host_id, last_folder = meta.get("sync_host_id"), meta.get("sync_folder")
            unsent = db.execute("SELECT COUNT(*) FROM sync_forgotten WHERE sent = 0").fetchone()[0]
    named = config.folder if config is not None else last_folder
    folder = Path(named) if named else None
    share, segments, others = None, 0, 0
    if folder is not None:
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        others = sum(1 for n in names if HOST_ID.match(n) and n != host_id)
        if host_id is not None:
            own = paths.sync_host_dir(folder, host_id)
            if own.is_dir() and not own.is_symlink():
                share = own
                segments = len(files_in(own))
    return SyncHoldings(files, folder, share, segments, others, unsent if config is not None else 0)


def leave(
    data_dir: Path, store: HistoryStore | None, holdings: SyncHoldings, wait_s: float = 30.0
) -> tuple[int, str | None]:
    """This machine leaves sync for good (`calm forget --all`): under the sync lock (a sync in
    progress ends first; the daemon's next turn finds no sync.json and does nothing), sync.json
    and the key deleted, every stored command deleted without a forget sent (`forget_all`), this
    machine's share of the folder deleted (its own sub-folder: nothing of this machine's history
    stays there; the engine carries the deletion, and the other machines keep what they received).
    Returns how many commands were deleted, and why the share could not be deleted (None: it
    was, or there was none); SyncError, with nothing deleted, when the lock stays held."""
    deadline = time.monotonic() + wait_s
    while True:
        with sync_lock(data_dir) as held:
            if held:
                for path in holdings.files:
                    path.unlink(missing_ok=True)
                commands = store.forget_all() if store is not None else 0
                problem = None
                if holdings.share is not None:
                    try:
                        shutil.rmtree(holdings.share)
                    except OSError as exc:
                        problem = f"{holdings.share}: {exc.strerror or exc}"
                return commands, problem
        if time.monotonic() > deadline:
            raise SyncError(f"a sync (calmd's) held {paths.sync_lock_path(data_dir)} for {wait_s:g} s: "
                            "nothing was deleted; try again")  # fmt: skip
        time.sleep(0.1)
