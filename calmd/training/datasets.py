"""Training datasets from the history store: which commands become examples, with which context.

`calm dataset --history` and the background run (calmd/training/background.py) both call
`write_history_dataset`; each example's HIST frames come from `calmd.suggest.context.ContextTracker`,
the same rule the daemon applies when it serves, and its COMP and ENV frames are those the record
kept (calmd/history/store.py, schema 3: what the daemon computed for it), all put together by
`calmd.suggest.frames.context_frames`, so training and serving read the same frames. Records from
before schema 3 have none (their examples carry empty COMP and ENV, as they were served).

"Trivial" commands (dropped unless --include-trivial): a bare `ls`, `ll`, `la`, `l`, `pwd`,
`clear`, `reset`, `exit`, `history`, `jobs`, `fg`, `bg`, `cd` alone or with `..`, `-`, `~`, and
anything shorter than --min-cmd-len. They are cheap to type and frequent enough to swamp the
loss; they still appear as context (HIST frames) of the commands that follow them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from calmd.errors import SequenceTooLong
from calmd.formats.ctds import CtdsWriter
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, Template, build_sequence
from calmd.history.store import HistoryRow, HistoryStore
from calmd.suggest.context import ContextTracker
from calmd.suggest.frames import context_frames
from calmd.training.options import DatasetOptions

__all__ = ["DatasetOptions", "is_trivial", "store_examples", "write_history_dataset"]

TRIVIAL = frozenset({"ls", "ll", "la", "l", "pwd", "clear", "reset", "exit", "history", "jobs", "fg", "bg",
                     "cd", "cd ..", "cd -", "cd ~"})  # fmt: skip


def is_trivial(cmd: str) -> bool:
    return " ".join(cmd.split()) in TRIVIAL


def store_examples(store: HistoryStore, opts: DatasetOptions) -> list[tuple[dict[str, Any], str]]:
    """(context, command) pairs from the store, oldest first, filtered as `opts` says."""
    rows: list[HistoryRow] = list(store.all_rows())
    if opts.max_entries:
        rows = rows[-opts.max_entries :]
    contexts = ContextTracker(opts.hist_frames)  # what the daemon would have put in the context
    pairs: list[tuple[dict[str, Any], str]] = []
    for row in rows:
        context_rows = cast(list[HistoryRow], contexts.before(row.session))
        eligible = (
            len(row.cmd.strip()) >= opts.min_cmd_len
            and (opts.include_failed or not row.exit)
            and (opts.include_trivial or not is_trivial(row.cmd))
        )
        if eligible:
            ctx = context_frames(
                cwd=row.cwd, git=row.git, history=[(r.cmd, r.exit) for r in context_rows],
                completions=row.comp, env=row.env, comp_items=opts.comp_frames,
            )  # fmt: skip
            pairs.append((ctx, row.cmd))
        contexts.add(row)
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
    pairs = store_examples(store, opts)
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
