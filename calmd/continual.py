"""Continual training: datasets from the history store, and the background fine-tuning run.

A run (`python -m calmd.continual`, started by the daemon in a niced single-thread process):
1. builds a CTDS from the history store with the `calm dataset` options (`DatasetOptions`), the
   most recent eligible commands held out for evaluation;
2. fine-tunes the serving weights (`shell.cwgt`, else the packaged default) with EWC against
   their stored anchor (calmd/train.py), into a temp file in the data dir;
3. evaluates old and new weights on the held-out commands (calmd/evaluate.py); the new weights
   replace the old only when they are not worse (held-out loss per supervised token not higher):
   the old file is kept as `shell.prev.cwgt` (`calm rollback` restores it) and the new one is
   renamed over `shell.cwgt`, which the daemon's hot reload picks up;
4. writes its progress and result to `training.json` in the data dir (atomically), which
   `calmd status` shows. A crash or kill at any point leaves `shell.cwgt` and the history as they
   were: the only files it replaces are replaced by rename.

"Trivial" commands (dropped unless --include-trivial): a bare `ls`, `ll`, `la`, `l`, `pwd`,
`clear`, `reset`, `exit`, `history`, `jobs`, `fg`, `bg`, `cd` alone or with `..`, `-`, `~`, and
anything shorter than --min-cmd-len. They are cheap to type and frequent enough to swamp the
loss; they still appear as context (HIST frames) of the commands that follow them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.atomic import atomic_write
from calmd.ctds import CtdsWriter
from calmd.errors import SequenceTooLong
from calmd.history import HistoryRow, HistoryStore
from calmd.tokenizer import DEFAULT_SHELL_TEMPLATE, Template, build_sequence

TRIVIAL = frozenset({"ls", "ll", "la", "l", "pwd", "clear", "reset", "exit", "history", "jobs", "fg", "bg",
                     "cd", "cd ..", "cd -", "cd ~"})  # fmt: skip


def is_trivial(cmd: str) -> bool:
    return " ".join(cmd.split()) in TRIVIAL


@dataclass(frozen=True)
class DatasetOptions:
    """`calm dataset` options for the shell-history path (calm-dataset.txt)."""

    max_entries: int = 0  # latest N history entries; 0: all
    hist_frames: int = 5
    comp_frames: int = 3  # the store records no completion lists, so COMP frames stay empty
    max_dup: int = 3  # a distinct command is a target at most this many times (its latest uses)
    min_cmd_len: int = 2
    include_failed: bool = False
    include_trivial: bool = False


def history_examples(store: HistoryStore, opts: DatasetOptions) -> list[tuple[dict[str, Any], str]]:
    """(context, command) pairs from the store, oldest first, filtered as `opts` says."""
    rows: list[HistoryRow] = list(store.all_rows())
    if opts.max_entries:
        rows = rows[-opts.max_entries :]
    recent: dict[str, deque[HistoryRow]] = {}
    everyone: deque[HistoryRow] = deque(maxlen=opts.hist_frames)
    pairs: list[tuple[dict[str, Any], str]] = []
    for row in rows:
        own = recent.setdefault(row.session, deque(maxlen=opts.hist_frames))
        context_rows = list(own)
        if len(context_rows) < opts.hist_frames:  # topped up with other shells', as the server does
            others = [r for r in everyone if r.session != row.session]
            context_rows = others[len(others) - (opts.hist_frames - len(context_rows)) :] + context_rows
        eligible = (
            len(row.cmd.strip()) >= opts.min_cmd_len
            and (opts.include_failed or not row.exit)
            and (opts.include_trivial or not is_trivial(row.cmd))
        )
        if eligible:
            ctx: dict[str, Any] = {"history": [{"cmd": r.cmd, "exit": r.exit} for r in context_rows]}
            if row.cwd:
                ctx["cwd"] = row.cwd
            if row.git:
                ctx["git"] = row.git
            pairs.append((ctx, row.cmd))
        own.append(row)
        everyone.append(row)
    # --max-dup keeps each command's latest uses (newest contexts matter most)
    seen: dict[str, int] = {}
    kept: list[tuple[dict[str, Any], str]] = []
    for ctx, cmd in reversed(pairs):
        seen[cmd] = seen.get(cmd, 0) + 1
        if seen[cmd] <= opts.max_dup:
            kept.append((ctx, cmd))
    return kept[::-1]


def write_history_dataset(
    store: HistoryStore, out: Path, opts: DatasetOptions, *, template: Template = DEFAULT_SHELL_TEMPLATE,
    l_max: int = 768, holdout: int = 0, holdout_path: Path | None = None,
) -> dict[str, int]:  # fmt: skip
    """Write the history dataset (and its newest `holdout` examples to `holdout_path`)."""
    pairs = history_examples(store, opts)
    split = max(0, len(pairs) - holdout) if holdout_path is not None else len(pairs)
    counts = {"sequences": 0, "held_out": 0, "skipped_too_long": 0}

    def sequences(chunk: list[tuple[dict[str, Any], str]]) -> Iterator[Any]:
        for ctx, cmd in chunk:
            try:
                yield build_sequence(template, {**ctx, "input": cmd}, l_max=l_max, training=True)
            except SequenceTooLong:
                counts["skipped_too_long"] += 1

    with CtdsWriter(out) as writer:
        for seq in sequences(pairs[:split]):
            writer.add(seq)
            counts["sequences"] += 1
    if holdout_path is not None:
        with CtdsWriter(holdout_path) as writer:
            for seq in sequences(pairs[split:]):
                writer.add(seq)
                counts["held_out"] += 1
    return counts


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


def status_path(data_dir: Path) -> Path:
    return data_dir / "training.json"


def write_status(data_dir: Path, **fields: Any) -> None:
    fields.setdefault("updated", time.time())
    with atomic_write(status_path(data_dir)) as f:
        f.write(json.dumps(fields, default=str).encode())


def read_status(data_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(status_path(data_dir).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def run(opts: RunOptions) -> dict[str, Any]:
    """One training run; returns (and writes) its result."""
    from calmd.checkpoint import load_model
    from calmd.ctds import CtdsReader
    from calmd.engine import packaged_model
    from calmd.evaluate import compare, load_sequences
    from calmd.train import TrainConfig, train

    started = time.time()
    work = opts.data_dir / "training"
    work.mkdir(parents=True, exist_ok=True)
    base = opts.weights if opts.weights.exists() else packaged_model()
    write_status(opts.data_dir, state="dataset", started=started, pid=os.getpid(), base=str(base))
    current = load_model(base)
    store = HistoryStore(opts.data_dir / "history.sqlite3")
    try:
        recorded = store.count()
        counts = write_history_dataset(
            store, work / "train.ctds", DatasetOptions(), template=current.metadata.parsed_template(),
            l_max=current.model.cfg.l_max, holdout=opts.holdout, holdout_path=work / "heldout.ctds",
        )  # fmt: skip
    finally:
        store.close()
    if counts["sequences"] < opts.min_examples or counts["held_out"] == 0:
        result = {"state": "done", "swapped": False, "started": started, "finished": time.time(),
                  "reason": f"only {counts['sequences']} training examples (need {opts.min_examples})",
                  **counts}  # fmt: skip
        write_status(opts.data_dir, **result)
        return result
    candidate = opts.data_dir / f".shell.candidate.{os.getpid()}.cwgt"
    last_write = [0.0]

    def on_step(step: int, loss: float) -> None:
        if time.monotonic() - last_write[0] > 1.0:
            last_write[0] = time.monotonic()
            write_status(opts.data_dir, state="training", started=started, pid=os.getpid(), step=step,
                         loss=loss, base=str(base), **counts)  # fmt: skip

    try:
        cfg = TrainConfig(
            model=str(base), dataset=str(work / "train.ctds"), output=str(candidate), epochs=opts.epochs,
            lr=opts.lr, ewc_lambda=opts.ewc_lambda, threads=opts.threads, max_minutes=opts.max_minutes,
            val_fraction=0.0, quiet=True, force=True,
        )  # fmt: skip
        trained = train(cfg, on_step=on_step)
        write_status(opts.data_dir, state="evaluating", started=started, pid=os.getpid(), **counts)
        new = load_model(candidate)
        seqs = load_sequences(CtdsReader(work / "heldout.ctds"))
        cmp = compare(current.model, new.model, seqs, stops=current.metadata.stop_conditions(), ks=(0, 2))
        swapped = cmp.new.loss <= cmp.old.loss
        if swapped:
            if opts.weights.exists():  # keep the old weights for `calm rollback`
                prev = opts.weights.with_name("shell.prev.cwgt")
                tmp = prev.with_name(f".{prev.name}.tmp")
                shutil.copyfile(opts.weights, tmp)
                os.replace(tmp, prev)
            os.replace(candidate, opts.weights)
            reason = f"held-out loss {cmp.new.loss:.4f} <= {cmp.old.loss:.4f}: swapped in"
        else:
            reason = f"held-out loss {cmp.new.loss:.4f} > {cmp.old.loss:.4f}: kept the current model"
        result = {
            "state": "done", "swapped": swapped, "reason": reason, "started": started,
            "finished": time.time(),
            "recorded": recorded, "steps": trained.steps, "old_loss": cmp.old.loss, "new_loss": cmp.new.loss,
            "old_exact0": cmp.old.accuracy(0), "new_exact0": cmp.new.accuracy(0), **counts,
        }  # fmt: skip
    except BaseException as exc:
        result = {"state": "failed", "swapped": False, "reason": f"{type(exc).__name__}: {exc}",
                  "started": started, "finished": time.time()}  # fmt: skip
        write_status(opts.data_dir, **result)
        raise
    finally:
        candidate.unlink(missing_ok=True)
    write_status(opts.data_dir, **result)
    return result


def rollback(weights: Path) -> Path:
    """Put `shell.prev.cwgt` back as the serving weights (the current ones become the prev)."""
    from calmd.checkpoint import load_model
    from calmd.errors import CalmError

    prev = weights.with_name("shell.prev.cwgt")
    if not prev.exists():
        raise CalmError(f"{prev} does not exist: nothing to roll back to")
    load_model(prev)  # refuse to restore a file that does not load
    tmp = weights.with_name(f".{weights.name}.rollback")
    shutil.copyfile(prev, tmp)
    if weights.exists():
        os.replace(weights, prev)
    os.replace(tmp, weights)
    return weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calmd.continual", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=paths.data_dir())
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--epochs", type=int, default=RunOptions.epochs)
    parser.add_argument("--min-examples", type=int, default=RunOptions.min_examples)
    parser.add_argument("--holdout", type=int, default=RunOptions.holdout)
    parser.add_argument("--max-minutes", type=float, default=RunOptions.max_minutes)
    parser.add_argument("--threads", type=int, default=RunOptions.threads)
    args = parser.parse_args(argv)
    weights = args.weights or args.data_dir / "shell.cwgt"
    opts = RunOptions(args.data_dir, weights, min_examples=args.min_examples, holdout=args.holdout,
                      epochs=args.epochs, threads=args.threads, max_minutes=args.max_minutes)  # fmt: skip
    result = run(opts)
    print(json.dumps({k: v for k, v in result.items() if k != "state"} | {"state": result["state"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
