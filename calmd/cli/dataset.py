"""`calm dataset`: a CTDS dataset from the history store or a training-source file, or a view of one."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from calmd import paths
from calmd.arguments import Flags, Parser, add_flags, config_from, whole
from calmd.cli.common import new_console
from calmd.errors import CalmError, SequenceTooLong
from calmd.training.options import DatasetOptions
from calmd.visible import visible

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


# `calm dataset`'s flags for DatasetOptions' fields (the shell-history path): its defaults
DATASET_FLAGS: Flags = {
    "max_entries": (("--max-entries", "-n"), {"type": whole(0, 10**9),
                    "help": "latest N history entries (0: all)"}),
    "hist_frames": (("--hist-frames", "-H"), {"type": whole(0, 15), "help": "history frames per sequence"}),
    "comp_frames": (("--comp-frames",), {"type": whole(0, 15),
                    "help": "completion items per sequence, of those each record kept (as served)"}),
    "max_dup": (("--max-dup",), {"type": whole(1, 10**6), "help": "max uses of one command as a target"}),
    "min_cmd_len": (("--min-cmd-len",), {"type": whole(0, 65536), "help": "min command length in chars"}),
    "include_failed": (("--include-failed",), {"action": "store_true",
                       "help": "include non-zero exit commands"}),
    "include_trivial": (("--include-trivial",), {"action": "store_true",
                        "help": "include trivial commands (ls, cd, ...)"}),
}  # fmt: skip


def _counting_lines(stream: BinaryIO, progress: Progress, task: TaskID) -> Iterator[bytes]:
    done = 0
    for n, line in enumerate(stream, start=1):
        done += len(line)
        if n % 4096 == 0:
            progress.update(task, completed=done)
        yield line
    progress.update(task, completed=done)


def cmd_dataset(args: argparse.Namespace) -> int:
    if args.view:
        return dataset_view(args)
    if args.source is None:
        return dataset_from_history(args)
    return dataset_from_text(args)


def dataset_from_history(args: argparse.Namespace) -> int:
    """The shell-history path of `calm dataset` (docs/training.md): the history store -> CTDS."""
    from calmd.history.store import HistoryStore
    from calmd.training.datasets import write_history_dataset

    db = Path(args.db) if args.db else paths.history_path()
    if not db.exists():
        raise CalmError(f"{db}: no history store yet (the daemon creates it; or run calm import FILE)")
    opts = config_from(DatasetOptions, args, DATASET_FLAGS)
    output = Path(args.output) if args.output else paths.dataset_path()
    if output.is_dir():
        raise CalmError(
            f"--output {output}: a folder; give the dataset file to write, e.g. {output / paths.DATASET}"
        )
    store = HistoryStore(db)
    try:
        counts = write_history_dataset(store, output, opts, l_max=args.l_max)
    finally:
        store.close()
    if not args.quiet:
        skipped = counts["skipped_too_long"]
        print(f"wrote {visible(str(output))}: {counts['sequences']:,} sequences from {visible(str(db))}"
              + (f" ({skipped} too long, skipped)" if skipped else ""))  # fmt: skip
    return 0


def dataset_from_text(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from calmd.formats.ctds import CtdsWriter
    from calmd.formats.source import SourceParser
    from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE_SPEC, build_sequence, parse_template

    source = Path(args.source)
    output = Path(args.output) if args.output else paths.dataset_path()
    if output.is_dir():
        raise CalmError(
            f"--output {output}: a folder; give the dataset file to write, e.g. {output / paths.DATASET}"
        )
    template = parse_template(args.template or DEFAULT_SHELL_TEMPLATE_SPEC)
    parser = SourceParser(template, name=str(source))
    try:
        stream = open(source, "rb")  # noqa: SIM115 - closed below, after the writer
    except OSError as exc:
        raise CalmError(f"{source}: cannot read: {exc.strerror}") from None
    skipped = 0
    console = new_console(args.no_color)
    with (
        stream,
        Progress(
            TextColumn("[bold]building[/] {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=new_console(args.no_color) if not args.quiet else None,
            disable=args.quiet,
            transient=True,
        ) as progress,
        CtdsWriter(output) as writer,
    ):
        task = progress.add_task(source.name, total=source.stat().st_size)
        for example in parser.parse_stream(_counting_lines(stream, progress, task)):
            try:
                seq = build_sequence(template, example.context(), l_max=args.l_max, training=True)
            except SequenceTooLong:
                skipped += 1
                continue
            writer.add(seq)
        count, longest = len(writer), writer.max_len
    if not args.quiet:
        console.print(
            f"wrote {count} sequences to {visible(str(output))} (longest {longest} tokens)"
            + (f"; skipped {skipped} whose command does not fit l_max {args.l_max}" if skipped else ""),
            markup=False,  # a file name is the user's text, never rich's markup
        )
    return 0


def dataset_view(args: argparse.Namespace) -> int:
    from calmd.formats.ctds import CtdsReader
    from calmd.formats.view import legend, render

    path = Path(args.ds) if args.ds else paths.dataset_path()
    console = new_console(args.no_color)
    with CtdsReader(path) as ds:
        total = ds.count()
        if total == 0:
            console.print(f"{visible(str(path))}: empty dataset", markup=False)
            return 0
        if not 1 <= args.index <= total:
            raise CalmError(f"{path}: --index {args.index} is outside 1..{total}")
        last = min(total, args.index - 1 + args.count)
        console.print(f"{visible(str(path))}: {total} sequences, max_len {ds.max_len}", markup=False)
        console.print(legend())
        for i in range(args.index - 1, last):
            seq = ds.sequence(i)
            cmd = int(ds.cmd_positions[i])
            console.print(
                f"\n[bold]#{i + 1}[/]  {seq.size} tokens, ATN at {cmd}, {seq.size - cmd - 1} supervised"
            )
            console.print(render(seq, cmd))
    return 0


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """dataset"""
    p = sub.add_parser("dataset", help="build a CTDS dataset, or view one")
    p.add_argument("--from", "-f", dest="source", metavar="FILE", help="training-source text file")
    p.add_argument("--output", "-o", metavar="OUT", help=f"CTDS path (default {paths.dataset_path()})")
    p.add_argument("--template", metavar="SPEC", help="template spec (default: the shell template)")
    p.add_argument(
        "--l-max", type=whole(8, 65535), default=768, help="skip sequences longer than this (default 768)"
    )
    p.add_argument("--view", "-V", action="store_true", help="view dataset contents")
    p.add_argument("--ds", metavar="FILE", help="CTDS file for --view (default: the output path)")
    p.add_argument(
        "--index",
        "-i",
        type=whole(1, 10**9),
        default=1,
        help="first sequence for --view, 1-based (default 1)",
    )
    p.add_argument(
        "--count", "-c", type=whole(1, 10**6), default=5, help="sequences to show with --view (default 5)"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    g = p.add_argument_group("from the shell history (without --from)")
    g.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    add_flags(g, DatasetOptions, DATASET_FLAGS)
    p.set_defaults(func=cmd_dataset)
