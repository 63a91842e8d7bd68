"""Background training: the fine-tuning run the daemon starts when enough new history arrived.

A run (`python -m calmd.training.background`, started by the daemon in a niced single-thread process):
0. refits the history ranker, which decides most of the order (docs/quality.md), on the user's
   newest commands, anchored to the packaged ranker (calmd/training/ranker_refit.py; seconds, no
   model), and writes it as `ranker.json` beside the weights (atomically, 0600), keeping the one
   it replaces as `ranker.prev.json` (`calm rollback` restores it with the weights); with too few
   ranking examples the ranker in place stays (the packaged one at first);
1. builds a CTDS from the history store with the `calm dataset` options (`DatasetOptions`), the
   most recent eligible commands held out for evaluation;
2. fine-tunes the serving weights (`shell.cwgt`, else the packaged default) with EWC against
   their stored anchor (calmd/training/train.py), into a temp file in the data dir;
3. evaluates old and new weights on the held-out commands (calmd/training/evaluate.py); the new weights
   replace the old only when they are not worse (held-out loss per supervised token not higher):
   the old file is kept as `shell.prev.cwgt` (`calm rollback` restores it) and the new one is
   renamed over `shell.cwgt`, which the daemon's hot reload picks up;
4. writes its progress and result to `training.json` in the data dir (atomically), which
   `calmd status` shows: the model's result and the ranker's (refitted, on how many examples).
   A crash or kill at any point leaves `shell.cwgt`, `ranker.json` and the history as they were:
   the only files it replaces are replaced by rename.

One run per CALM_HOME: the run holds `training.lock` (flock) for its whole life; a second one
says who holds it and exits 4 without touching anything. Holding the lock, it first removes what
killed runs left (`.shell.candidate.<pid>.cwgt`, stale temp files). Started by the daemon
(`--parent-pid`), it dies with it: the kernel sends it SIGKILL when the daemon exits
(PR_SET_PDEATHSIG, set between fork and exec), and each training step checks that its parent is
still the daemon. SIGTERM (the daemon's graceful stop) ends it cleanly, state `interrupted`.
Exit codes: 0 done (swapped or not), 1 failed (reason in training.json), 3 disk full, 4 another
run holds the lock, 5 stopped (SIGTERM, or the daemon went away).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.atomic import (
    atomic_write,
    exchange,
    fsync_dir,
    keep_copy,
    parse_json,
    read_regular_file,
    remove_stale_temp_files,
)
from calmd.errors import CalmError, DiskFull, one_line
from calmd.history.store import HistoryStore
from calmd.suggest.ranking import Ranker
from calmd.training.datasets import DatasetOptions, write_history_dataset
from calmd.training.ranker_refit import LEARN_COMMANDS, RefitOptions

# --------------------------------------------------------------------------- the background run


@dataclass(frozen=True)
class RunOptions:
    data_dir: Path
    weights: Path
    min_examples: int = 50  # fewer eligible commands: nothing to learn yet
    holdout: int = 100  # the newest eligible commands, for the not-worse check
    epochs: int = 2
    lr: float = 1e-4
    ewc_lambda: float = 100.0
    threads: int = 1
    max_minutes: float = 20.0
    parent_pid: int | None = None  # the daemon that started the run: stop when it is gone
    refit_ranker: bool = True  # False: the model alone (`calm replay --refit model` measures it so)
    ranker_commands: int = LEARN_COMMANDS  # the newest commands the ranker's refit learns from
    ranker_min_examples: int = RefitOptions.min_examples  # fewer: the ranker in place stays


PROG = "python -m calmd.training.background"
EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_DISK_FULL = 3
EXIT_LOCKED = 4
EXIT_STOPPED = 5
RUNNING_STATES = ("ranker", "dataset", "training", "evaluating")  # written while a run works
MAX_STATUS_BYTES = 1 << 20


class RunStopped(BaseException):
    """SIGTERM, or the daemon that started the run is gone: stop, leave everything as it was.
    A BaseException, so that no `except Exception` on the way swallows it."""


def status_path(data_dir: Path) -> Path:
    return data_dir / paths.TRAINING_STATUS


def lock_path(data_dir: Path) -> Path:
    return data_dir / paths.TRAINING_LOCK


def write_status(data_dir: Path, **fields: Any) -> None:
    fields.setdefault("updated", time.time())
    fields.setdefault("pid", os.getpid())
    with atomic_write(status_path(data_dir)) as f:
        f.write(json.dumps(fields, default=str).encode())


def read_status(data_dir: Path) -> dict[str, Any]:
    try:
        data = parse_json(
            bytes(read_regular_file(status_path(data_dir), limit=MAX_STATUS_BYTES)), paths.TRAINING_STATUS
        )
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # FormatError: not JSON, or nested too deeply
        return {}


def is_disk_full(exc: BaseException) -> bool:
    """A write failed for lack of space (ENOSPC, a quota, SQLite's "database or disk is full")."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:  # the exception and what caused it
        seen.add(id(link))
        if isinstance(link, DiskFull):
            return True
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "database or disk is full" in str(link):
            return True
        link = link.__cause__ or link.__context__
    return False


# --------------------------------------------------------------------------- one run per CALM_HOME


class TrainingLock:
    """`training.lock` in the data dir, held (flock) by the one run of a CALM_HOME, and by `calm
    rollback` while it swaps files. The holder's pid is written in it for `lock_holder`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = lock_path(data_dir)
        self._fd: int | None = None

    def acquire(self, *, wait_s: float = 1.0) -> bool:
        """True when acquired. Waits a little: the daemon's status probe holds it for microseconds."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    return False
                time.sleep(0.01)
        with contextlib.suppress(OSError):  # the pid is for status only; a full disk must not stop us
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> TrainingLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(data_dir: Path) -> int | None:
    """The pid of the process holding `training.lock` (0 when it wrote none yet), None when free."""
    try:
        fd = os.open(lock_path(data_dir), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no lock file (no run ever), or one we cannot read: nobody we can see
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else 0
        return None  # we got it: nobody holds it (closing the fd releases ours)
    finally:
        os.close(fd)


def clean_leftovers(data_dir: Path) -> list[str]:
    """Remove what killed runs left: candidate weights (6 MB each for nano) and stale temp files.
    Only call it while no run can be live (holding the lock, or having seen it free)."""
    removed: list[str] = []
    for pattern in (paths.CANDIDATE_WEIGHTS.format(pid="*"), paths.LEGACY_ROLLBACK):
        for path in data_dir.glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    removed += remove_stale_temp_files(data_dir)
    work = paths.training_dir(data_dir)
    removed += [f"{work.name}/{name}" for name in remove_stale_temp_files(work)]
    return removed


def candidate_path(data_dir: Path, pid: int) -> Path:
    """Where run `pid` writes the weights it trained, before the not-worse check swaps them in."""
    return paths.candidate_weights_path(data_dir, pid)


def remove_run_files(data_dir: Path, pid: int) -> list[str]:
    """What the ended run `pid` left: its candidate weights (and the candidate's temp file), the
    temp files of its datasets, of training.json and of the ranker it was writing. Only call it
    once that run is gone and no other holds the lock. Other processes' temp files in the data
    dir (a hook file being written) are left alone."""
    removed: list[str] = []
    candidate = candidate_path(data_dir, pid)
    doomed = [candidate, *data_dir.glob(f".{candidate.name}.*.tmp"),
              *data_dir.glob(f".{paths.TRAINING_STATUS}.*.tmp"),
              *data_dir.glob(f".{paths.RANKER}.*.tmp"),
              *data_dir.glob(f".{paths.PREV_RANKER}.*.tmp")]  # fmt: skip
    work = paths.training_dir(data_dir)
    if work.is_dir() and not work.is_symlink():
        doomed += [p for p in work.iterdir() if p.name.startswith(".") and p.suffix in (".tmp", ".tokens")]
    for path in doomed:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(str(path.relative_to(data_dir)))
    return removed


def _check_parent(parent_pid: int | None) -> None:
    if parent_pid is not None and os.getppid() != parent_pid:
        raise RunStopped(f"the daemon (pid {parent_pid}) is gone")


def run(opts: RunOptions) -> dict[str, Any]:
    """One training run; returns (and writes) its result. Whatever ends it early is written as
    its result too: `interrupted` (stopped) or `failed` with the reason (a full disk says so)."""
    started = time.time()
    candidate = candidate_path(opts.data_dir, os.getpid())
    try:
        result = _run_stages(opts, started, candidate)
    except BaseException as exc:
        if isinstance(exc, RunStopped | KeyboardInterrupt):
            state, reason = "interrupted", f"stopped: {exc or type(exc).__name__}"
        elif is_disk_full(exc):
            state, reason = "failed", f"disk full: {exc}"
        else:
            state, reason = "failed", f"{type(exc).__name__}: {exc}"
        result = {"state": state, "swapped": False, "reason": reason, "started": started,
                  "finished": time.time()}  # fmt: skip
        with contextlib.suppress(OSError):  # a full disk: the exit code tells the daemon
            write_status(opts.data_dir, **result)
        raise
    finally:
        candidate.unlink(missing_ok=True)
    write_status(opts.data_dir, **result)
    return result


def _run_stages(opts: RunOptions, started: float, candidate: Path) -> dict[str, Any]:
    from calmd.formats.ctds import CtdsReader
    from calmd.model.checkpoint import load_model
    from calmd.training.evaluate import compare, load_sequences
    from calmd.training.train import TrainConfig, planned_steps, train

    train_set, heldout_set = paths.training_sets(opts.data_dir)
    train_set.parent.mkdir(parents=True, exist_ok=True)
    base = paths.serving_weights(opts.weights)
    store = HistoryStore(paths.history_path(opts.data_dir))
    try:
        write_status(opts.data_dir, state="ranker", started=started, base=str(base))
        try:
            ranker = (
                refit_user_ranker(store, opts) if opts.refit_ranker
                else {"ranker_refitted": False, "ranker_examples": 0,
                      "ranker_reason": "the ranker was not refitted (--no-refit-ranker)"}
            )  # fmt: skip
        except Exception as exc:  # the model's fine-tune still runs; the result says why
            if is_disk_full(exc):
                raise
            traceback.print_exc()  # to training.log
            ranker = {"ranker_refitted": False, "ranker_examples": 0,
                      "ranker_reason": f"the ranker's refit failed ({type(exc).__name__}: {exc}): "
                                       "the ranker in place stays"}  # fmt: skip
        write_status(opts.data_dir, state="dataset", started=started, base=str(base))
        current = load_model(base)
        recorded = store.count()
        counts = write_history_dataset(
            store, train_set, DatasetOptions(), template=current.metadata.parsed_template(),
            l_max=current.model.cfg.l_max, holdout=opts.holdout, holdout_path=heldout_set,
        )  # fmt: skip
    finally:
        store.close()
    if counts["sequences"] < opts.min_examples or counts["held_out"] == 0:
        return {"state": "done", "swapped": False, "started": started, "finished": time.time(),
                "reason": f"only {counts['sequences']} training examples (need {opts.min_examples}): "
                          f"nothing trained, the current model stays; {ranker['ranker_reason']}",
                **counts, **ranker}  # fmt: skip
    last_write = [0.0]
    cfg = TrainConfig(
        model=str(base), dataset=str(train_set), output=str(candidate), epochs=opts.epochs,
        lr=opts.lr, ewc_lambda=opts.ewc_lambda, threads=opts.threads, max_minutes=opts.max_minutes,
        val_fraction=0.0, quiet=True, force=True,
    )  # fmt: skip
    # what `status` turns into "step 12/74, about 40 s left": the total, and the pace's origin
    pace = {"total_steps": planned_steps(counts["sequences"], cfg), "training_since": time.time()}
    pace["deadline"] = pace["training_since"] + 60 * opts.max_minutes

    def on_step(step: int, loss: float) -> None:
        _check_parent(opts.parent_pid)
        if time.monotonic() - last_write[0] > 1.0 or step == pace["total_steps"]:
            last_write[0] = time.monotonic()
            write_status(opts.data_dir, state="training", started=started, step=step, loss=loss,
                         base=str(base), **pace, **counts)  # fmt: skip

    trained = train(cfg, on_step=on_step)
    write_status(opts.data_dir, state="evaluating", started=started, **counts)
    new = load_model(candidate)
    seqs = load_sequences(CtdsReader(heldout_set))
    cmp = compare(current.model, new.model, seqs, stops=current.metadata.stop_conditions(), ks=(0, 2))
    swapped = cmp.new.loss <= cmp.old.loss
    _check_parent(opts.parent_pid)  # an orphaned run does not swap anything in
    before_after = f"held-out loss {cmp.old.loss:.4f} -> {cmp.new.loss:.4f}"
    if swapped:
        swap_in(candidate, opts.weights)
        reason = f"{before_after}, not worse: swapped in"
    else:
        reason = f"{before_after}, worse: kept the current model"
    return {
        "state": "done", "swapped": swapped, "reason": f"{reason}; {ranker['ranker_reason']}",
        "started": started, "finished": time.time(),
        "recorded": recorded, "steps": trained.steps, "old_loss": cmp.old.loss, "new_loss": cmp.new.loss,
        "old_exact0": cmp.old.accuracy(0), "new_exact0": cmp.new.accuracy(0), **counts, **ranker,
    }  # fmt: skip


def refit_user_ranker(store: HistoryStore, opts: RunOptions) -> dict[str, Any]:
    """Refit the packaged history ranker on the store's newest commands and write it beside the
    weights (`ranker.json`, the one it replaces kept as `ranker.prev.json`). Returns the result's
    ranker fields: `ranker_refitted`, `ranker_examples`, `ranker_reason`. Fewer examples than
    `opts.ranker_min_examples`: nothing written, the ranker in place stays.

    Only the store's rows are read (it refused what looked like a credential), and the file holds
    weights and the packaged carry-over table, no command of the user's."""
    from calmd.suggest.ranking import packaged_ranker
    from calmd.training.ranker_refit import examples_from_store, refit_ranker

    target = paths.ranker_path(opts.weights)
    base = packaged_ranker()
    gathered = examples_from_store(
        store, base, learn=opts.ranker_commands, check=lambda: _check_parent(opts.parent_pid)
    )
    found = len(gathered.examples)
    fitted = refit_ranker(gathered.examples, base, RefitOptions(min_examples=opts.ranker_min_examples))
    if fitted is base:
        stays = "your ranker from an earlier run" if target.exists() else "the packaged ranker"
        return {"ranker_refitted": False, "ranker_examples": found,
                "ranker_reason": f"only {found} ranking examples (need {opts.ranker_min_examples}): "
                                 f"{stays} stays"}  # fmt: skip
    _check_parent(opts.parent_pid)  # an orphaned run writes nothing
    write_ranker(fitted, target)
    used = int(fitted.info["refit"]["examples"])
    return {"ranker_refitted": True, "ranker_examples": used,
            "ranker_reason": f"ranker refitted on {used} ranking examples"}  # fmt: skip


def write_ranker(ranker: Ranker, target: Path) -> None:
    """Write `ranker` to `target` atomically and privately (temp, fsync, rename; 0600), keeping
    the file it replaces as `ranker.prev.json` for `calm rollback`."""
    if target.is_file():
        keep_copy(target, paths.prev_ranker_path(target))
    with atomic_write(target) as f:
        f.write(json.dumps(ranker.to_json()).encode())


def swap_in(candidate: Path, weights: Path) -> None:
    """Rename `candidate` over `weights`, keeping the replaced file as `shell.prev.cwgt` for `calm
    rollback`. Renames only: `weights` holds a complete file at every instant."""
    if weights.exists():
        keep_copy(weights, paths.prev_weights_path(weights))  # the same file under a second name
    os.replace(candidate, weights)
    fsync_dir(weights.parent)


def rollback(weights: Path) -> list[str]:
    """Undo the last training run: put `shell.prev.cwgt` back as the serving weights (the current
    ones become the prev), and `ranker.prev.json` back as the user's ranker beside them. With no
    previous file, move the current one aside to it: the packaged model (or ranker) serves
    (`serving_weights`, `serving_ranker`), and the next rollback brings it back. Returns what it
    did, one sentence per file.

    Atomic: one renameat2(RENAME_EXCHANGE) swaps two files, so each name holds a complete file at
    every instant and a crash leaves either the old pair or the swapped one. Where the file system
    cannot exchange, three renames keep the current name complete throughout (a crash between them
    leaves the replaced file as a temp file, not lost in place). The previous files are checked
    before anything moves: one that does not load is refused and nothing changes. Refused while a
    training run holds the data dir's lock: it could rename its own result over the rollback."""
    from calmd.model.checkpoint import load_model
    from calmd.suggest.ranking import read_user_ranker

    prev = paths.prev_weights_path(weights)
    ranker = paths.ranker_path(weights)
    prev_ranker = paths.prev_ranker_path(ranker)
    for path in (weights, prev):
        if path.exists() and not path.is_file():
            raise CalmError(f"{path} is not a weight file (a folder?); give the weights with --weights FILE")
    model_files = prev.exists() or weights.exists()
    ranker_files = ranker.is_file() or prev_ranker.is_file()
    if not model_files and not ranker_files:
        raise CalmError(f"neither {weights} nor {prev} exists: the packaged model serves already")
    done: list[str] = []
    with TrainingLock(weights.parent) as lock:
        if not lock.acquire():
            holder = lock_holder(weights.parent)
            raise CalmError(f"a training run (pid {holder}) is in progress: roll back after it ends")
        if model_files and not prev.exists() and weights.name != paths.WEIGHTS:
            # only serving weights give way to the packaged model
            raise CalmError(f"{prev} does not exist: nothing to roll back to")
        if model_files and prev.exists():
            load_model(prev)  # refuse to restore a file that does not load (read safely, into memory)
        if prev_ranker.is_file():  # the same for the ranker, before anything moves
            try:
                read_user_ranker(prev_ranker)
            except CalmError as exc:
                raise CalmError(f"{exc}: nothing was rolled back") from None
        if model_files:
            done.append(_swap_back(weights, prev, "weights", "model"))
        if ranker_files:
            done.append(_swap_back(ranker, prev_ranker, "ranker", "ranker"))
    return done


def _swap_back(current: Path, prev: Path, what: str, packaged: str) -> str:
    """`_exchange` the two files and say what that did: a restore, or with no previous file,
    `current` moved aside so that the packaged `packaged` serves."""
    had_prev = prev.is_file()  # (rollback refused a previous weight file that is not a file)
    _exchange(current, prev)
    if had_prev:
        return f"restored {current} from {prev}"
    return f"no previous {what}: moved {current} to {prev}; the packaged {packaged} serves now"


def _exchange(current: Path, prev: Path) -> None:
    """`prev` becomes `current` and `current` becomes `prev` (one of them may be missing)."""
    if not prev.exists():
        os.replace(current, prev)
        fsync_dir(current.parent)
    elif not current.exists():
        os.replace(prev, current)
        fsync_dir(current.parent)
    elif not exchange(current, prev):
        keep = current.with_name(f".{current.name}.rollback.{os.getpid()}.tmp")
        os.link(current, keep)
        os.replace(prev, current)
        os.replace(keep, prev)
        fsync_dir(current.parent)


def _stop_on_sigterm(signum: int, _frame: object) -> None:
    raise RunStopped(f"{signal.Signals(signum).name} (the daemon is shutting down)")


def _say(message: str) -> None:
    """One line to stderr (training.log), unbuffered: on a full disk the write fails, and a
    buffered one would fail again at exit and turn the exit code into 120."""
    with contextlib.suppress(OSError):
        os.write(2, f"calmd.training.background: {message}\n".encode())


def main(argv: list[str] | None = None) -> int:
    paths.set_private_umask()  # datasets, candidates, training.json: the user's history, 0600
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=paths.data_dir())
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--epochs", type=int, default=RunOptions.epochs)
    parser.add_argument("--min-examples", type=int, default=RunOptions.min_examples)
    parser.add_argument("--holdout", type=int, default=RunOptions.holdout)
    parser.add_argument("--max-minutes", type=float, default=RunOptions.max_minutes)
    parser.add_argument("--threads", type=int, default=RunOptions.threads)
    parser.add_argument("--no-refit-ranker", dest="refit_ranker", action="store_false",
                        help="fine-tune the model alone, leave the history ranker as it is")  # fmt: skip
    parser.add_argument("--ranker-commands", type=int, default=RunOptions.ranker_commands,
                        help="the newest commands the history ranker's refit learns from")  # fmt: skip
    parser.add_argument("--ranker-min-examples", type=int, default=RunOptions.ranker_min_examples,
                        help="fewer ranking examples: the ranker in place stays")  # fmt: skip
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the daemon that started this run: stop when it is gone")  # fmt: skip
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        _check_parent(args.parent_pid)
    except RunStopped as exc:
        _say(str(exc))
        return EXIT_STOPPED
    weights = args.weights or paths.weights_path(args.data_dir)
    opts = RunOptions(args.data_dir, weights, min_examples=args.min_examples, holdout=args.holdout,
                      epochs=args.epochs, threads=args.threads, max_minutes=args.max_minutes,
                      parent_pid=args.parent_pid, refit_ranker=args.refit_ranker,
                      ranker_commands=args.ranker_commands,
                      ranker_min_examples=args.ranker_min_examples)  # fmt: skip
    paths.private_dir(args.data_dir)
    with TrainingLock(args.data_dir) as lock:
        if not lock.acquire():
            _say(f"another training run (pid {lock_holder(args.data_dir)}) holds {lock.path}; "
                 "not starting a second one")  # fmt: skip
            return EXIT_LOCKED
        removed = clean_leftovers(args.data_dir)
        if removed:
            _say(f"removed what killed runs left: {', '.join(removed)}")
        try:
            result = run(opts)
        except RunStopped as exc:
            _say(f"stopped: {exc}")
            return EXIT_STOPPED
        except BaseException as exc:
            if is_disk_full(exc):
                _say(f"disk full: {one_line(exc)}")
                return EXIT_DISK_FULL
            if not isinstance(exc, Exception):
                raise
            traceback.print_exc()  # to training.log; the reason is in training.json too
            return EXIT_FAILED
    print(json.dumps({k: v for k, v in result.items() if k != "state"} | {"state": result["state"]}))
    return EXIT_DONE


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))  # what fails before the run (a --data-dir that is a file)
