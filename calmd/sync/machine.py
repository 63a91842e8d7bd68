"""`Sync`: one history store's export and import through the folder, run under the CALM_HOME's
sync lock (the daemon every interval, `calm sync now` at once), and what `calm sync` and `calmd
status` say of it."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.history.query import this_hostname
from calmd.sync.config import SyncError, sync_lock
from calmd.sync.engines import git_sync
from calmd.sync.export import Export
from calmd.sync.import_ import Import
from calmd.sync.seal import key_id, read_key
from calmd.sync.state import REFUSALS_SAID, SyncReport, hidden_shares


class Sync(Export, Import):
    """Export and import for one history store. Thread-compatible: `run` takes the CALM_HOME's sync
    lock (a file lock), so the daemon and `calm sync now` never export at once."""

    def _locked(self) -> contextlib.AbstractContextManager[bool]:
        return sync_lock(self.data_dir)

    def run(self, *, wait: bool = False) -> SyncReport | None:
        """Export this machine's new records and forgets, import the others'; with a git remote,
        commit and pull the folder between the two. None when sync is not set up, or another
        process holds the lock (and `wait` is False)."""
        config = self.config()
        if config is None:
            return None
        key = self.key()
        folder = Path(config.folder)
        if not folder.is_dir():
            raise SyncError(f"{folder}: the sync folder does not exist (or is not a folder): create it, "
                            "or point `calm sync --folder` at another")  # fmt: skip
        deadline = time.monotonic() + (30.0 if wait else 0.0)
        while True:
            with self._locked() as held:
                if held:
                    report = SyncReport()
                    if config.sends:
                        self.export(folder, key, report)
                    if config.git:
                        report.git = git_sync(folder, config.git, self.host_name())
                    if config.receives:
                        self.import_all(folder, key, report)
                    if report.forgotten and config.sends and self._rebuild_due():
                        # what the others forgot of this machine's records leaves its segments now
                        self.export(folder, key, report)
                        if config.git:
                            report.git = git_sync(folder, config.git, self.host_name())
                    self.last_run = time.time()
                    return report
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def describe(self) -> dict[str, Any]:
        """The folder, this machine (its live segments, how many it re-sealed), the hosts seen
        (their last segment and when it was sealed), records in and out, the refused files (how
        many, the first few and why), the replaced segments still in the folder, the machines whose
        list of segments hid records; what `calm sync` and `calmd status` show."""
        try:
            config = self.config()
        except SyncError as exc:
            return {"enabled": False, "error": str(exc)}
        if config is None:
            return {"enabled": False}
        key_path = paths.sync_key_path(self.data_dir)
        try:
            kid: str | None = key_id(read_key(key_path)).hex()
        except SyncError:
            kid = None
        with self.store.reading() as db:
            meta = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'sync_%'").fetchall())
            hosts = db.execute("SELECT id, name, last_seq, last_sealed, records, live FROM sync_hosts "
                               "ORDER BY name, id").fetchall()  # fmt: skip
            refused = db.execute(
                "SELECT path, reason, at FROM sync_refused ORDER BY at, path LIMIT ?", (REFUSALS_SAID,)
            ).fetchall()
            refused_now = db.execute("SELECT COUNT(*) FROM sync_refused").fetchone()[0]
            segments = db.execute("SELECT COUNT(*) FROM sync_own").fetchone()[0]
            written = int(meta.get("sync_written_id") or 0)
            pending = db.execute(
                "SELECT COUNT(*) FROM commands WHERE origin = '' AND (origin_id IS NULL OR origin_id > ?)",
                (written,),
            ).fetchone()[0]
        return {
            "enabled": True, "folder": config.folder, "mode": config.mode, "git": config.git or None,
            "interval_s": config.interval_s,
            "host": {"id": meta.get("sync_host_id"), "name": meta.get("sync_host_name") or this_hostname()},
            "key": {"id": kid, "path": str(key_path)},
            "segments": segments, "healed": int(meta.get("sync_healed") or 0),
            "hosts": [{"id": h, "name": n, "last_segment": s, "last_sealed": t, "records_in": r,
                       "segments": sum(b - a + 1 for a, b in json.loads(live))}
                      for h, n, s, t, r, live in hosts],
            "records_out": int(meta.get("sync_records_out") or 0),
            "records_in": int(meta.get("sync_records_in") or 0),
            "bad_times": int(meta.get("sync_bad_times") or 0),
            "pending_out": pending if config.sends else 0,
            "refused": {"count": int(meta.get("sync_refused") or 0), "now": refused_now,
                        "files": [{"path": p, "reason": why, "at": at} for p, why, at in refused]},
            "superseded": int(meta.get("sync_superseded") or 0),
            "hidden": [h.to_json() for h in hidden_shares(meta.get("sync_hidden")).values()],
            "disowned": int(meta.get("sync_disowned") or 0),
            "last_run": self.last_run, "last_error": self.last_error,
        }  # fmt: skip
