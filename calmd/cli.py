"""The `calm` (model toolbox) and `calmd` (daemon) command lines.

Every error a user can cause (a bad file, a bad id) prints one line `calm: error: ...` naming the
file and field, and exits 1; usage errors exit 2 (argparse). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from calmd import __version__, paths
from calmd.errors import CalmError, SequenceTooLong

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


def _console(no_color: bool = False) -> Console:
    from rich.console import Console

    return Console(highlight=False, no_color=no_color, soft_wrap=True)


# --------------------------------------------------------------------------- calm tokenize / detokenize


def cmd_tokenize(args: argparse.Namespace) -> int:
    from calmd.tokenizer import encode, frame, special_id

    ids = frame(special_id(args.frame), args.text) if args.frame else encode(args.text)
    print(json.dumps(ids.tolist()) if args.json else " ".join(map(str, ids.tolist())))
    return 0


def cmd_detokenize(args: argparse.Namespace) -> int:
    from calmd.tokenizer import decode
    from calmd.view import render

    values: list[int] = []
    for word in args.ids:
        try:
            values.append(int(word))
        except ValueError:
            raise CalmError(f"{word!r} is not a token id (an integer 0-277)") from None
    if args.view:
        _console(args.no_color).print(render(values))
        return 0
    sys.stdout.buffer.write(decode(values))
    if sys.stdout.isatty():
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    return 0


# --------------------------------------------------------------------------- calm dataset


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
        raise CalmError(
            "building a dataset from the shell history needs the history store, which arrives with the "
            "daemon; for now pass --from FILE (a training-source text file, see docs/formats.md)"
        )
    return dataset_from_text(args)


def dataset_from_text(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from calmd.ctds import CtdsWriter
    from calmd.source import SourceParser
    from calmd.tokenizer import DEFAULT_SHELL_TEMPLATE_SPEC, build_sequence, parse_template

    source = Path(args.source)
    output = Path(args.output) if args.output else paths.dataset_path()
    template = parse_template(args.template or DEFAULT_SHELL_TEMPLATE_SPEC)
    parser = SourceParser(template, name=str(source))
    try:
        stream = open(source, "rb")  # noqa: SIM115 - closed below, after the writer
    except OSError as exc:
        raise CalmError(f"{source}: cannot read: {exc.strerror}") from None
    skipped = 0
    console = _console(args.no_color)
    with (
        stream,
        Progress(
            TextColumn("[bold]building[/] {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=_console(args.no_color) if not args.quiet else None,
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
            f"wrote {count} sequences to {output} (longest {longest} tokens)"
            + (f"; skipped {skipped} whose command does not fit l_max {args.l_max}" if skipped else "")
        )
    return 0


def dataset_view(args: argparse.Namespace) -> int:
    from calmd.ctds import CtdsReader
    from calmd.view import legend, render

    path = Path(args.ds) if args.ds else paths.dataset_path()
    console = _console(args.no_color)
    with CtdsReader(path) as ds:
        total = ds.count()
        if total == 0:
            console.print(f"{path}: empty dataset")
            return 0
        if not 1 <= args.index <= total:
            raise CalmError(f"{path}: --index {args.index} is outside 1..{total}")
        last = min(total, args.index - 1 + args.count)
        console.print(f"{path}: {total} sequences, max_len {ds.max_len}")
        console.print(legend())
        for i in range(args.index - 1, last):
            seq = ds.sequence(i)
            cmd = int(ds.cmd_positions[i])
            console.print(
                f"\n[bold]#{i + 1}[/]  {seq.size} tokens, ATN at {cmd}, {seq.size - cmd - 1} supervised"
            )
            console.print(render(seq, cmd))
    return 0


# --------------------------------------------------------------------------- calm inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    from rich.table import Table

    from calmd.cwgt import HEADER, read_cwgt

    f = read_cwgt(args.file)
    h = f.header
    if args.check:
        f.check_finite()
    size = f.path.stat().st_size
    if args.json:
        from dataclasses import asdict

        doc = {
            "path": str(f.path),
            "file_bytes": size,
            "header": asdict(h),
            "metadata": None if f.metadata is None else asdict(f.metadata),
            "tied": h.tied,
            "has_ewc": h.has_ewc,
        }
        print(json.dumps(doc, indent=2))
        return 0
    table = Table(title=str(f.path), show_header=True)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("arch_version", str(h.arch_version)),
        ("flags", f"0x{h.flags:04x} (tied={h.tied}, has_ewc={h.has_ewc})"),
        ("vocab_size", str(h.vocab_size)),
        ("d_model", str(h.d_model)),
        ("n_layers", str(h.n_layers)),
        ("ffn_expand", str(h.ffn_expand)),
        ("expand / d_state / d_conv / dt_rank", f"{h.expand} / {h.d_state} / {h.d_conv} / {h.dt_rank}"),
        ("l_max", str(h.l_max)),
        ("param_count", f"{h.param_count:,}"),
        ("temperature", "unset" if h.temperature is None else f"{h.temperature:g}"),
        ("top_k", "unset" if not h.def_top_k else str(h.def_top_k)),
        ("top_p", "unset" if h.top_p is None else f"{h.top_p:g}"),
        ("min_p", "unset" if h.min_p is None else f"{h.min_p:g}"),
        ("max_tokens", "unset" if not h.def_max_tokens else str(h.def_max_tokens)),
        ("candidates", "unset" if not h.def_candidates else str(h.def_candidates)),
        ("meta_size", f"{h.meta_size} bytes"),
    ]
    if f.metadata is not None:
        rows += [
            ("domain", f.metadata.domain),
            ("template", f.metadata.template),
            ("stop conditions", f.metadata.stops or "(none)"),
        ]
    weights_bytes = 4 * h.param_count
    rows += [
        ("file size", f"{size:,} bytes"),
        (
            "layout",
            f"header {HEADER.size} + metadata {h.meta_size}"
            + (f" + EWC {2 * weights_bytes:,}" if h.has_ewc else "")
            + f" + weights {weights_bytes:,}",
        ),
    ]
    if args.check:
        rows.append(("check", "all values finite"))
    for name, value in rows:
        table.add_row(name, value)
    _console(args.no_color).print(table)
    return 0


# --------------------------------------------------------------------------- calm import


def cmd_import(args: argparse.Namespace) -> int:
    from calmd.history import HistoryStore

    store = HistoryStore(Path(args.db) if args.db else paths.history_path())
    try:
        for name in args.files:
            result = store.import_file(name, args.format)
            print(
                f"{result.path}: {result.imported} commands imported ({result.format} format), "
                f"{result.dropped_secrets} dropped as credentials, {result.skipped} empty or space-prefixed"
            )
        print(f"history: {store.count()} commands in {store.path}")
    finally:
        store.close()
    return 0


# --------------------------------------------------------------------------- parsers


def calm_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calm", description="CALM model toolbox: tokenizer, datasets, weights."
    )
    parser.add_argument("--version", action="version", version=f"calm {__version__}")
    parser.add_argument("--no-color", action="store_true", help="plain output (NO_COLOR is honoured too)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tokenize", help="print the token ids of TEXT")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--frame", metavar="NAME", help="wrap as a frame: NAME ids... END (e.g. CWD)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("detokenize", help="print the bytes of token ids (specials skipped)")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--view", action="store_true", help="show the coloured token view instead")
    p.set_defaults(func=cmd_detokenize)

    p = sub.add_parser("dataset", help="build a CTDS dataset, or view one")
    p.add_argument("--from", "-f", dest="source", metavar="FILE", help="training-source text file")
    p.add_argument("--output", "-o", metavar="OUT", help=f"CTDS path (default {paths.dataset_path()})")
    p.add_argument("--template", metavar="SPEC", help="template spec (default: the shell template)")
    p.add_argument("--l-max", type=int, default=768, help="skip sequences longer than this (default 768)")
    p.add_argument("--view", "-V", action="store_true", help="view dataset contents")
    p.add_argument("--ds", metavar="FILE", help="CTDS file for --view (default: the output path)")
    p.add_argument(
        "--index", "-i", type=int, default=1, help="first sequence for --view, 1-based (default 1)"
    )
    p.add_argument("--count", "-c", type=int, default=5, help="sequences to show with --view (default 5)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=cmd_dataset)

    p = sub.add_parser("inspect", help="show a CWGT weight file's header, metadata and sizes")
    p.add_argument("file", metavar="FILE.cwgt")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="also read every weight and check it is finite")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("import", help="import bash or zsh history files into the history store")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--format", choices=["auto", "bash", "zsh"], default="auto")
    p.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    p.set_defaults(func=cmd_import)
    return parser


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (CalmError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130


def calm_main(argv: Sequence[str] | None = None) -> int:
    return _run(calm_parser(), argv)


def cmd_serve(args: argparse.Namespace) -> int:
    print(
        "calmd serve: the daemon arrives with a later change (issue 4); "
        f"it will listen on {args.socket or paths.socket_path()} and serve {paths.weights_path()}."
    )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    print("calmd status: no daemon is running (the daemon arrives with a later change).", file=sys.stderr)
    return 3


def calmd_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calmd", description="calmd: the CALM suggestion daemon.")
    parser.add_argument("--version", action="version", version=f"calmd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.add_argument("--socket", metavar="PATH", help="socket path (default $CALMD_SOCKET or the runtime dir)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("status", help="show the daemon's state (exit 3 when none runs)")
    p.set_defaults(func=cmd_status)
    return parser


def calmd_main(argv: Sequence[str] | None = None) -> int:
    return _run(calmd_parser(), argv)
