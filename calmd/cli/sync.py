"""`calm sync`: one history across your machines, through a folder another program replicates.

    calm sync                  what sync does here: folder, hosts seen, records in and out, refusals
    calm sync --folder DIR [--mode M] [--name NAME] [--git REMOTE] [--interval S]
    calm sync --off                        stop taking part (the folder and the history stay as they are)
    calm sync now                          export and import once, now (the daemon does it every --interval)
    calm sync key --show | --new | --import PHRASE|FILE|-

The first machine makes the key (`calm sync --folder DIR` makes one when the folder holds no other
machine's share yet); `calm sync key --show` prints it as a phrase to carry to the others, where
`calm sync key --import` takes it. docs/sync.md says how to set it up with Syncthing or git.

What it prints of names it did not make (the folder, the hosts' names: another machine's segments
name it, a refused file's name and why, a path, git's error) passes calmd/visible.py `visible`,
as every view does: such a name may hold an escape sequence or a bidi override.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.arguments import Parser, number
from calmd.errors import CalmError, one_line
from calmd.sync.config import MODES  # light: the parser imports no crypto
from calmd.visible import visible


def _sync(data: Path) -> Any:
    from calmd.history.store import HistoryStore
    from calmd.sync.machine import Sync

    paths.private_dir(data)
    return Sync(HistoryStore(paths.history_path(data)), data)


def cmd_sync(args: argparse.Namespace) -> int:
    from calmd.sync.config import SyncConfig, SyncError, read_config, write_config
    from calmd.sync.engines import git_sync
    from calmd.sync.folder import check_key_reads, other_machines
    from calmd.sync.seal import new_key, read_key, write_key
    from calmd.sync.state import clean_host_name

    data = paths.data_dir()
    if args.sync_command == "now":
        return _now(data)
    if args.sync_command == "key":
        return _key(args, data)
    config_path = paths.sync_config_path(data)
    if args.off:
        if config_path.exists():
            config_path.unlink()
            print(
                f"sync is off on this machine ({visible(str(config_path))} removed); the folder and the "
                "key are left as they are"
            )
        else:
            print("sync was not on")
        return 0
    changing = args.folder is not None or args.mode or args.git is not None or args.interval or args.name
    if not changing:
        return _status(data)
    current = read_config(config_path)
    if args.folder is None and current is None:
        raise CalmError("sync is not set up here: give the folder first (`calm sync --folder DIR`)")
    name = clean_host_name(args.name) if args.name else None
    folder = os.path.abspath(os.path.expanduser(args.folder)) if args.folder is not None else current.folder  # type: ignore[union-attr]
    _text_or_error(folder, "--folder")
    config = SyncConfig(
        folder,
        args.mode or (current.mode if current else MODES[0]),
        args.git if args.git is not None else (current.git if current else ""),
        args.interval or (current.interval_s if current else SyncConfig.interval_s),
    )
    _text_or_error(config.git, "--git")
    if config.git and not Path(folder).exists():
        paths.private_dir(Path(folder))  # calm's own clone of the remote: nothing else replicates it
    if not Path(folder).is_dir():
        raise CalmError(f"--folder {folder}: not a folder; create it (the one your sync engine replicates)")
    joining = current is None or current.folder != folder
    sync = _sync(data)
    try:
        if config.git and joining:  # what the remote holds, so that the other machines' shares are seen
            said = git_sync(Path(folder), config.git, name or sync.host_name(), push=False)
            if said:
                print(visible(f"warning: {said}; calmd tries again at each turn"), file=sys.stderr)
        key_path = paths.sync_key_path(data)
        others = other_machines(Path(folder), sync.host_id())
        if not key_path.exists():
            if others:
                raise SyncError(
                    f"{folder} already holds the history of {len(others)} other machine(s): bring the key "
                    "from one of them (there `calm sync key --show`, here `calm sync key --import`), "
                    "then run this again"
                )
            write_key(key_path, new_key())
            print(
                f"made a new sync key ({visible(str(key_path))}); carry it to your other machines: "
                "`calm sync key --show`"
            )
        elif joining:
            check_key_reads(Path(folder), sync.host_id(), read_key(key_path))
        if name:
            sync.set_host_name(name)
        write_config(config_path, config)
        print(
            visible(
                f"sync on: {folder} ({config.mode}{', git ' + config.git if config.git else ''}), "
                f"every {config.interval_s:g} s by calmd; this machine is '{sync.host_name()}'"
            )
        )
    finally:
        sync.store.close()
    return 0


def _text_or_error(value: str, flag: str) -> None:
    """CalmError unless `value` is text (a name given with bytes that are not UTF-8 is not: it
    could not be kept in sync.json or the history as given)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CalmError(f"{flag} {value}: not UTF-8 text (calm keeps it in sync.json)") from None


def _now(data: Path) -> int:
    # what the run logs for calmd's log (a refusal, a segment sealed again) is in its report, which
    # is printed below: each said once, not twice (Python's last-resort handler would print both)
    logging.getLogger("calmd.sync").addHandler(logging.NullHandler())
    sync = _sync(data)
    try:
        report = sync.run(wait=True)
    finally:
        sync.store.close()
    if report is None:
        if not paths.sync_config_path(data).exists():
            raise CalmError("sync is not set up here: `calm sync --folder DIR` first")
        raise CalmError("another sync (calmd's) held the lock for 30 s: try again")
    done = [f"sent {report.exported} records and {report.forgets_sent} forgets",
            f"received {report.imported} records and {report.forgotten} forgets"]  # fmt: skip
    if report.bad_times:
        done.append(f"{report.bad_times} of them with an impossible time (before 1970, after 2100 or not a "
                    "number: kept, timed by the record before them)")  # fmt: skip
    if report.rebuilt:
        done.append("wrote this machine's segments anew")
    if report.healed:
        done.append(
            f"sealed again {report.healed} of this machine's segments the engine deleted, cut or changed"
        )
    if report.merged:
        done.append(f"merged {report.merged} small segments")
    if report.disowned:
        done.append(
            f"found {report.disowned} segment{'s' * (report.disowned != 1)} sealed with this machine's key "
            "and id that it never wrote (a store restored from a backup, or another program with the key): "
            "this machine's list of its segments is written again past them, and they are deleted"
        )
    if report.refused_count:
        done.append(f"refused {report.refused_count:,} file{'s' * (report.refused_count != 1)} "
                    "(nothing of them imported)")  # fmt: skip
    print("; ".join(done))
    for path, why in report.refused:
        print(visible(f"refused {path}: {why}"), file=sys.stderr)
    if report.refused_count > len(report.refused):
        print(f"... and {report.refused_count - len(report.refused):,} more refused files (`calm sync` "
              "counts them)", file=sys.stderr)  # fmt: skip
    for share in report.hidden:
        print(visible(f"warning: {hidden_line(share.to_json())}"), file=sys.stderr)
    if report.git:
        print(f"calm: error: {visible(report.git)}", file=sys.stderr)
        return 1
    return 1 if report.refused or report.hidden else 0


def hidden_line(share: dict[str, Any]) -> str:
    """What is said of a machine whose list of segments left out segments that held records."""
    from calmd.history.query import host_label

    segments = sum(last - first + 1 for first, last in share["segments"])
    return (
        f"{host_label(str(share['name']), '')} ({share['host']}): its newest list of its segments (in "
        f"{paths.SYNC_SEGMENT.format(seq=share['manifest'])}) leaves out {segments:,} "
        f"segment{'s' * (segments != 1)} still in the folder that held {share['records']:,} "
        f"record{'s' * (share['records'] != 1)} not in the ones it lists: received all the same; that "
        "machine lists its segments again at its next sync"
    )


def _key(args: argparse.Namespace, data: Path) -> int:
    from calmd.sync.config import SyncError
    from calmd.sync.seal import key_id, key_phrase, new_key, parse_key_phrase, read_key, write_key

    key_path = paths.sync_key_path(data)
    paths.private_dir(data)
    if args.new:
        write_key(key_path, new_key())
        print(
            f"a new sync key is in {visible(str(key_path))}: this machine rewrites its share with it at "
            "its next sync. Import it on every other machine (`calm sync key --import`); until then "
            "they refuse what is sealed with it, and it refuses theirs"
        )
        return 0
    if args.import_key is not None:
        source = args.import_key
        if source == "-":
            text, where = sys.stdin.read(4096), "standard input"
        elif Path(source).expanduser().is_file():
            where = source
            try:
                text = Path(source).expanduser().read_text(encoding="utf-8")[:4096]
            except (OSError, UnicodeDecodeError) as exc:
                raise CalmError(f"{source}: cannot read the key: {one_line(exc, named=False)}") from None
        else:
            text, where = source, "the phrase given"
        key = parse_key_phrase(text, where)
        write_key(key_path, key)
        print(f"imported the sync key {key_id(key).hex()} into {visible(str(key_path))}")
        return 0
    try:
        key = read_key(key_path)
    except SyncError as exc:
        raise CalmError(str(exc)) from None
    print(key_phrase(key))
    print(
        f"(key id {key_id(key).hex()}; whoever holds this phrase can read your history in the sync folder: "
        "carry it yourself, never through the folder)",
        file=sys.stderr,
    )
    return 0


def _status(data: Path) -> int:
    if not paths.sync_config_path(data).exists():
        print("sync is off on this machine: `calm sync --folder DIR` turns it on (docs/sync.md)")
        return 0
    sync = _sync(data)
    try:
        status = sync.describe()
    finally:
        sync.store.close()
    for line in status_lines(status):
        print(line)
    return 0


def status_lines(status: dict[str, Any], now: float | None = None) -> list[str]:
    """`calm sync`'s lines (and `calmd status`'s sync part): the folder, this machine (its live
    segments, and how many it sealed again after the engine lost them), the hosts seen with their
    last segment and when it was sealed, records in and out, refused files, replaced segments the
    engine left. Each
    line is `visible` (calmd/visible.py): a host's name is what that machine put in its segments, a
    folder's or a refused file's name any bytes. A sealed time that is not one (`known_ts`: a
    segment may claim any finite number) is shown `-`, never a crash."""
    from calmd.history.query import host_label, known_ts

    now = time.time() if now is None else now
    if not status.get("enabled"):
        return [visible(f"sync: {status['error']}") if status.get("error") else "sync: off"]
    host = status.get("host") or {}
    key = status.get("key") or {}
    bad_times = status.get("bad_times") or 0
    lines = [
        f"folder: {status['folder']} ({status['mode']}"
        f"{', git ' + status['git'] if status.get('git') else ''}, "
        f"every {status['interval_s']:g} s)",
        f"this machine: {host_label(str(host.get('name') or ''), '')} ({host.get('id') or 'no id yet'}); "
        f"key {key.get('id') or 'MISSING: calm sync key --import'}",
        f"records: {status['records_out']:,} sent, {status['pending_out']:,} to send, "
        f"{status['records_in']:,} received"
        + (f" ({bad_times:,} with an impossible time: kept without it)" if bad_times else ""),
        f"this machine's segments: {status.get('segments', 0):,} in the folder, {status.get('healed', 0):,} "
        "sealed again after the engine deleted, cut or changed them"
        + (f", {status['disowned']:,} found that it never wrote (listed past them, deleted)"
           if status.get("disowned") else ""),
    ]  # fmt: skip
    hosts = status.get("hosts") or []
    if not hosts:
        lines.append("other machines: none seen yet")
    for h in hosts:
        sealed = known_ts(h.get("last_sealed"))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(sealed)) if sealed else "-"
        lines.append(
            f"  {host_label(h['name'], '')} ({h['id']}): segment {h['last_segment']}, sealed {when}, "
            f"{h['records_in']:,} records received"
        )
    refused = status.get("refused") or {}
    files = refused.get("files") or []
    now_refused = refused.get("now", len(files))
    first = f"; the first {len(files)}:" if now_refused > len(files) else ""
    lines.append(f"refused files: {refused.get('count', 0):,} in all, {now_refused:,} now{first}")
    lines += [f"  {f['path']}: {f['reason']}" for f in files]
    if now_refused > len(files):
        lines.append(f"  ... and {now_refused - len(files):,} more")
    if status.get("superseded"):
        lines.append(
            f"replaced segments still in the folder: {status['superseded']:,} (read once: what they hold is "
            "in the live ones, or forgotten; the engine has not deleted them, or put them back)"
        )
    lines += [f"warning: {hidden_line(share)}" for share in status.get("hidden") or []]
    last = status.get("last_run")
    if last:
        lines.append(f"last run: {now - last:.0f} s ago")
    if status.get("last_error"):
        lines.append(f"last error: {status['last_error']}")
    return [visible(line) for line in lines]


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """sync (and its now, key)"""
    p = sub.add_parser(
        "sync",
        help="one history across your machines: sealed, through a folder Syncthing, git, ... replicate",
        description="Share the history with your other machines through a folder that another program "
        "replicates (Syncthing, a cloud drive, NFS, rsync, or a git remote with --git). What is written "
        "there is sealed with a key only your machines hold. Without options: what sync does here.",
    )
    p.add_argument(
        "--folder", metavar="DIR", help="the folder your sync engine replicates (kept in sync.json)"
    )
    p.add_argument(
        "--mode", choices=MODES, help="both (default), send (share only) or receive (receive only)"
    )
    p.add_argument(
        "--name", metavar="NAME", help="this machine's name as the others show it (default: hostname)"
    )
    p.add_argument(
        "--git", metavar="REMOTE", help="also commit the folder and pull/push it to this git remote"
    )
    p.add_argument(
        "--interval",
        type=number(0, 86400, above=True),
        metavar="S",
        help="seconds between calmd's exports and imports (default 30)",
    )
    p.add_argument("--off", action="store_true", help="stop taking part (nothing is deleted)")
    p.set_defaults(func=cmd_sync, sync_command=None)
    inner = p.add_subparsers(dest="sync_command", metavar="now | key")
    now = inner.add_parser("now", help="export and import once, now")
    now.set_defaults(func=cmd_sync)
    key = inner.add_parser("key", help="show, make or import the key the folder is sealed with")
    which = key.add_mutually_exclusive_group()
    which.add_argument("--show", action="store_true", help="print the key as a phrase (the default)")
    which.add_argument("--new", action="store_true", help="make a new key (rotation: docs/sync.md)")
    which.add_argument(
        "--import",
        dest="import_key",
        metavar="PHRASE|FILE|-",
        help="take the key from another machine: its phrase, a file holding it, or - (stdin)",
    )
    key.set_defaults(func=cmd_sync)
