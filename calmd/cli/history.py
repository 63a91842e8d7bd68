"""`calm import`, `calm search`, `calm history`, `calm stats` and `calm forget`: the history store."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from calmd import paths
from calmd.arguments import Parser, number, whole
from calmd.errors import CalmError
from calmd.shell import (  # imports nothing heavy (`calm history` and `calm stats`; `calm search`)
    history_view,
    search_ui,
)
from calmd.visible import visible

if TYPE_CHECKING:
    from calmd.sync.leave import SyncHoldings

IMPORT_NICE = 10  # `calm import`'s niceness over the shell's


def cmd_import(args: argparse.Namespace) -> int:
    """Each file in turn; one that is not a history (or cannot be read) is reported on one line
    and the others are still imported; exit 1 when any was refused. fish's history is told apart
    by its first entry (or --format fish) and read by calmd/history/fish.py."""
    from calmd.history.fish import import_fish_history, is_fish_history
    from calmd.history.formats import NotAHistory
    from calmd.history.imports import import_summary
    from calmd.history.store import HistoryStore

    if args.max_mib <= 0:
        raise CalmError(f"--max-mib {args.max_mib}: give a positive number of MiB (default 16)")
    # a batch job beside the shells: on a busy machine their keystrokes (the daemon) go first, as
    # they do before the daemon's own import worker (calmd/daemon/worker.py; issue 42)
    with contextlib.suppress(OSError):
        os.nice(IMPORT_NICE)
    store = HistoryStore(Path(args.db) if args.db else paths.history_path())
    refused = 0
    try:
        for name in args.files:
            try:
                max_bytes = int(args.max_mib * (1 << 20))
                if args.format == "fish" or (args.format == "auto" and _starts_like(name, is_fish_history)):
                    result = import_fish_history(store, name, max_bytes=max_bytes)
                else:
                    result = store.import_file(name, args.format, max_bytes=max_bytes)
            except (NotAHistory, OSError) as exc:
                detail = (
                    exc if isinstance(exc, NotAHistory) else f"{name}: cannot read: {exc.strerror or exc}"
                )
                print(f"calm: error: {visible(str(detail))}", file=sys.stderr)
                refused += 1
                continue
            print(import_summary(result))  # its file name through `visible`
        count = store.count()
        print(f"history: {count} command{'s' * (count != 1)} in {visible(str(store.path))}")
    finally:
        store.close()
    return 1 if refused else 0


def _starts_like(name: str, check: Callable[[bytes], bool]) -> bool:
    """Whether a regular file's first 4 KiB pass `check`; False for anything else (a FIFO is
    opened without waiting for a writer, and never read) or what cannot be read: the import
    then says why."""
    import stat

    try:
        fd = os.open(Path(name).expanduser(), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and check(os.pread(fd, 4096, 0))
    except OSError:
        return False
    finally:
        os.close(fd)


def cmd_search(args: argparse.Namespace) -> int:
    """`calm search` typed at a prompt: what Ctrl-R opens (`python -m calmd.shell.search_ui`,
    whose output the hooks read through `$(...)`), and the line it prints ends with a newline,
    so that the prompt after it starts on a line of its own."""
    status = search_ui.cmd_search(args, "calm")
    if status == search_ui.CHOSEN:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return status


def cmd_forget(args: argparse.Namespace) -> int:
    """Delete the history rows that match PATTERN, for good. The pattern is never written
    anywhere (it may be the secret); `-` reads it from standard input, so that it is not on a
    command line either."""
    import re

    from calmd.history.recorded import clean_text
    from calmd.history.store import HistoryStore

    if args.all:
        if args.pattern is not None or args.regex or args.db:
            raise CalmError("--all deletes everything calm holds: give it no PATTERN, --regex or --db")
        return forget_everything(dry_run=args.dry_run, yes=args.yes)
    if args.pattern is None:
        raise CalmError("give the text to forget (PATTERN; - reads it from stdin), or --all for everything")
    pattern = sys.stdin.readline().rstrip("\n") if args.pattern == "-" else args.pattern
    pattern = clean_text(pattern)[0]  # bytes that are not UTF-8 as the store keeps them: U+FFFD
    if not pattern:
        raise CalmError("an empty pattern would match every command; give the text to forget")
    if args.regex:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise CalmError(f"PATTERN is not a valid regular expression: {exc}") from None
        match = lambda cmd: compiled.search(cmd) is not None  # noqa: E731
    else:
        match = lambda cmd: pattern in cmd  # noqa: E731
    db = Path(args.db) if args.db else paths.history_path()
    if not db.exists():
        raise CalmError(f"{db}: no history store yet: nothing to forget")
    store = HistoryStore(db)
    try:
        if args.dry_run:
            n = store.count_matching(match)
            print(f"{n} command{'s' * (n != 1)} in {visible(str(db))} match (dry run: nothing deleted)")
            return 0
        n = store.forget(match)
    finally:
        store.close()
    print(f"forgot {n} command{'s' * (n != 1)} in {visible(str(db))}")
    if n:
        print("the training datasets built from them were removed; a running calmd stops suggesting them")
        built = paths.dataset_path()
        if built.exists():
            print(
                f"note: {visible(str(built))} (written by `calm dataset`) may hold them too: "
                "delete or rebuild it"
            )
    return 0


# What `calm forget --all` deletes in the data dir besides the history's rows: everything built
# from them or about them. The shells' hook files and `calm disable`'s flag are settings: kept.
LEARNED_FILES = (
    paths.WEIGHTS, paths.PREV_WEIGHTS, paths.RANKER, paths.PREV_RANKER, paths.DATASET, paths.TRAINING_STATUS,
    paths.TRAINING_LOG, paths.TRAINING_LOG + ".old", paths.HELPER_LOG, paths.HELPER_LOG + ".old",
)  # fmt: skip


def forget_everything(*, dry_run: bool, yes: bool) -> int:
    """`calm forget --all`: every stored command (deleted for good, as `calm forget` deletes: the
    store stays, empty, and remembers that the shells' history files were imported, so the next
    start does not bring them back), the model and ranker trained on them and the ones they
    replaced, the datasets, the training run's status and log, the helpers' log, and the cache
    (the compiled kernels). With `calm sync`, this machine leaves it (calmd/sync/leave.py
    `leave`): sync.json and the key deleted, and this machine's share of the sync folder, so
    that nothing comes back from the folder and nothing of this machine's history stays there;
    the other machines are sent no forget (they keep their history), and what stays in the folder
    (their shares) is said. Asks first on a terminal; elsewhere it wants --yes. A running daemon
    is asked to reload: it serves the packaged model at once."""
    import shutil

    from calmd.history.store import HistoryStore
    from calmd.sync.config import SyncError
    from calmd.sync.leave import leave, sync_holdings
    from calmd.training.background import TrainingLock, lock_holder

    data, cache = paths.data_dir(), paths.cache_dir()
    db = paths.history_path(data)
    files = [data / name for name in LEARNED_FILES if (data / name).is_file()]
    folders = [folder for folder in (paths.training_dir(data), cache) if folder.is_dir()]
    commands = 0
    if db.is_file():
        store = HistoryStore(db)
        try:
            commands = store.count()
            holdings = sync_holdings(data, store)
        finally:
            store.close()
    else:
        holdings = sync_holdings(data, None)
    listing = [f"{commands} stored command{'s' * (commands != 1)} ({db})"] + [str(p) for p in files + folders]
    listing += [str(p) for p in holdings.files]
    if holdings.share is not None:
        segments = f"{holdings.segments} segment{'s' * (holdings.segments != 1)}"
        listing.append(f"{holdings.share} (this machine's share of the sync folder: {segments}; your other "
                       "machines keep what they received)")  # fmt: skip
    if holdings.unsent_forgets:
        listing.append(
            f"note: {holdings.unsent_forgets} forget{'s' * (holdings.unsent_forgets != 1)} made here "
            "not sent to your other machines yet: they would keep those commands (answer n, run "
            "`calm sync now`, then this again)"
        )
    listing = [visible(line) for line in listing]  # a folder's name is any bytes
    if dry_run:
        print("calm forget --all would delete (dry run: nothing deleted):\n  " + "\n  ".join(listing))
        return 0
    if not yes:
        if not sys.stdin.isatty():
            raise CalmError("--all deletes everything calm holds and asks first: on no terminal, give --yes")
        print("calm forget --all deletes, for good:\n  " + "\n  ".join(listing))
        answer = input("delete all of it? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing deleted")
            return 1
    with TrainingLock(data) as lock:
        if not lock.acquire():  # the run would write a model trained on what is being deleted
            holder = lock_holder(data)
            raise CalmError(f"a training run (pid {holder}) is in progress: run this again once it ends "
                            "(calmd status), or after `calmd stop`")  # fmt: skip
        opened = HistoryStore(db) if db.is_file() else None
        problem = None
        try:
            if holdings.anything:  # sync's lock: a sync in progress ends first, none starts after
                commands, problem = leave(data, opened, holdings)
            elif opened is not None:
                commands = opened.forget_all()
        except SyncError as exc:
            raise CalmError(str(exc)) from None
        finally:
            if opened is not None:
                opened.close()
        for path in files:
            path.unlink(missing_ok=True)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    print(visible(
        f"forgot {commands} command{'s' * (commands != 1)} and deleted "
        + (", ".join(map(str, files + folders + list(holdings.files))) or "nothing else")
    ))  # fmt: skip
    if holdings.anything:
        print(_left_in_sync_folder(holdings, problem))
    _reload_daemon()
    print("the shells' own history files (~/.zsh_history ...) are yours: untouched, and not imported again")
    return 0


def _left_in_sync_folder(holdings: SyncHoldings, problem: str | None) -> str:
    """What `calm forget --all` says of sync once done: off here, and what the folder still holds."""
    said = "sync is off on this machine"
    if problem is not None:
        said += f"; its share of the sync folder could not be deleted ({problem}): delete it by hand"
    elif holdings.share is not None:
        said += f"; its share of the sync folder ({holdings.share}) is deleted"
    if holdings.folder is not None and holdings.others:
        others = f"{holdings.others} other machine{'s' * (holdings.others != 1)}"
        said += (
            f". {holdings.folder} still holds the shares of {others} (sealed): they keep their history "
            "and what they received from this one (`calm forget PATTERN` there forgets it on every "
            "machine). To keep none of it here, stop your sync engine sharing the folder on this "
            "machine, then delete it (deleted while shared, it goes on every machine)"
        )
    return visible(said)


def _reload_daemon() -> None:
    """A running daemon serves the packaged model now, not the deleted one (it would notice the
    file go within a moment anyway)."""
    from calmd.shell.client import CalmClient

    try:
        with CalmClient(None, timeout=10.0) as client:
            client.reload()
    except (OSError, ValueError, RuntimeError):  # no daemon (DaemonNotRunning), or one that failed
        return
    print("the running calmd serves the packaged model now")


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """import, search, history, stats, forget"""
    p = sub.add_parser("import", help="import bash, zsh or fish history files into the history store")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="history files: ~/.bash_history, ~/.zsh_history, fish's fish_history")  # fmt: skip
    p.add_argument("--format", choices=["auto", "bash", "zsh", "fish"], default="auto",
                   help="the file's format (default auto: told from its first lines and name)")  # fmt: skip
    p.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    p.add_argument("--max-mib", type=number(0, 1 << 20, above=True), default=16, metavar="MIB",
                   help="read at most the newest MIB mebibytes of each file (default 16)")  # fmt: skip
    p.set_defaults(func=cmd_import)

    p = sub.add_parser(
        "search",
        help="search the whole history, ranked by calmd (what Ctrl-R opens in zsh, bash and fish)",
        description=search_ui.parser().description,
    )
    search_ui.add_arguments(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser(
        "history",
        help="list and search the commands calmd stored (filters: folder, session, status, time, text)",
        description="The stored commands, oldest first: `time  status  folder  command` per line, "
        "or JSON Lines (--json), or the command lines alone (--commands). Read-only; safe while calmd runs.",
    )
    history_view.add_filters(p)
    p.add_argument("--commands", action="store_true", help="print the command lines alone")
    p.set_defaults(func=history_view.cmd_history)

    p = sub.add_parser(
        "stats",
        help="top commands and subcommands, per folder, failure rate, busiest hours",
        description="Tables of the stored commands (the same filters as `calm history`).",
    )
    history_view.add_filters(p)
    p.add_argument("--top", type=whole(1), default=10, metavar="N", help="rows per table (default 10)")
    p.set_defaults(func=history_view.cmd_stats)

    p = sub.add_parser(
        "forget",
        help="delete history commands that contain PATTERN (for good), e.g. a password typed by mistake",
        description="Delete every stored command that contains PATTERN (plain text, case-sensitive; "
        "--regex for a Python regular expression), and the datasets built from them. The pattern is "
        "not stored anywhere; type the command with a leading space so that your shell does not keep "
        "it either, or give - and type the pattern on standard input.",
    )
    p.add_argument("pattern", metavar="PATTERN", nargs="?",
                   help="text to look for in commands; - reads it from stdin")  # fmt: skip
    p.add_argument("--regex", "-E", action="store_true", help="PATTERN is a regular expression")
    p.add_argument("--all", action="store_true",
                   help="delete everything calm holds: every command, your model and ranker, the datasets, "
                   "logs and caches, this machine's part in `calm sync` (asks first; --yes does "
                   "not)")  # fmt: skip
    p.add_argument("--yes", "-y", action="store_true", help="with --all: do not ask")
    p.add_argument("--dry-run", "-n", action="store_true", help="only count the matching commands")
    p.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    p.set_defaults(func=cmd_forget)
