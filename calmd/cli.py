"""The `calm` (model toolbox) and `calmd` (daemon) command lines.

Every error a user can cause (a bad file, a bad id) prints one line `calm: error: ...` naming the
file and field, and exits 1; usage errors exit 2 (argparse). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from calmd import __version__, paths
from calmd.arguments import Flags, Parser, add_flags, config_from, number, whole
from calmd.daemon.config import ServerConfig
from calmd.errors import CalmError, SequenceTooLong
from calmd.shell import helper as shell_helper  # imports nothing heavy: the CLI's parsers name its commands
from calmd.shell import history_view, search_ui  # idem (`calm history` and `calm stats`; `calm search`)
from calmd.training import commands as training_commands  # idem (torch is imported by the handlers)
from calmd.training.options import DatasetOptions

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from calmd.daemon.server import Engine
    from calmd.shell.client import CalmClient


def _console(no_color: bool = False) -> Console:
    from rich.console import Console

    return Console(highlight=False, no_color=no_color, soft_wrap=True)


# --------------------------------------------------------------------------- calm tokenize / detokenize


def cmd_tokenize(args: argparse.Namespace) -> int:
    from calmd.formats.tokenizer import encode, frame, special_id

    ids = frame(special_id(args.frame), args.text) if args.frame else encode(args.text)
    print(json.dumps(ids.tolist()) if args.json else " ".join(map(str, ids.tolist())))
    return 0


def cmd_detokenize(args: argparse.Namespace) -> int:
    from calmd.formats.tokenizer import decode
    from calmd.formats.view import render

    values: list[int] = []
    for word in args.ids:
        try:
            value = int(word)
        except ValueError:
            raise CalmError(f"{word!r} is not a token id (an integer 0-277)") from None
        if not 0 <= value <= 0xFFFF:
            raise CalmError(f"token id {value} is out of range; valid ids are 0-277")
        values.append(value)
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
            f"--output {output}: a folder; give the dataset file to write, e.g. {output / 'train.ctds'}"
        )
    store = HistoryStore(db)
    try:
        counts = write_history_dataset(store, output, opts, l_max=args.l_max)
    finally:
        store.close()
    if not args.quiet:
        skipped = counts["skipped_too_long"]
        print(f"wrote {output}: {counts['sequences']:,} sequences from {db}"
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
            f"--output {output}: a folder; give the dataset file to write, e.g. {output / 'train.ctds'}"
        )
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
    from calmd.formats.ctds import CtdsReader
    from calmd.formats.view import legend, render

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

    from calmd.formats.cwgt import HEADER, read_cwgt

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
    """Each file in turn; one that is not a history (or cannot be read) is reported on one line
    and the others are still imported; exit 1 when any was refused. fish's history is told apart
    by its first entry (or --format fish) and read by calmd/history/fish.py."""
    from calmd.history.fish import import_fish_history, is_fish_history
    from calmd.history.store import HistoryStore, NotAHistory

    if args.max_mib <= 0:
        raise CalmError(f"--max-mib {args.max_mib}: give a positive number of MiB (default 16)")
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
                print(f"calm: error: {detail}", file=sys.stderr)
                refused += 1
                continue
            older = (
                f"; its oldest {result.skipped_bytes:,} bytes left out (--max-mib)"
                if result.skipped_bytes
                else ""
            )
            print(
                f"{result.path}: {result.imported} commands imported ({result.format} format), "
                f"{result.dropped_secrets} dropped as credentials, {result.skipped} empty or space-prefixed"
                + (
                    f", {result.undecodable} with bytes that are not UTF-8 (kept as U+FFFD)"
                    if result.undecodable
                    else ""
                )
                + older
            )
        print(f"history: {store.count()} commands in {store.path}")
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


# --------------------------------------------------------------------------- calm forget


def cmd_forget(args: argparse.Namespace) -> int:
    """Delete the history rows that match PATTERN, for good. The pattern is never written
    anywhere (it may be the secret); `-` reads it from standard input, so that it is not on a
    command line either."""
    import re

    from calmd.history.store import HistoryStore

    pattern = sys.stdin.readline().rstrip("\n") if args.pattern == "-" else args.pattern
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
            print(f"{n} command{'s' * (n != 1)} in {db} match (dry run: nothing deleted)")
            return 0
        n = store.forget(match)
    finally:
        store.close()
    print(f"forgot {n} command{'s' * (n != 1)} in {db}")
    if n:
        print("the training datasets built from them were removed; a running calmd stops suggesting them")
        built = paths.dataset_path()
        if built.exists():
            print(f"note: {built} (written by `calm dataset`) may hold them too: delete or rebuild it")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from calmd.formats.cwgt import Metadata
    from calmd.model.checkpoint import GenerationDefaults, save_model
    from calmd.model.mamba import SIZES, CalmModel

    if not args.output:
        raise CalmError(
            "calm init writes random weights: give the new file with -o FILE (the weights the daemon "
            f"serves, {paths.weights_path()}, are replaced only by -o that path --force)"
        )
    out = Path(args.output)
    if out.is_dir():
        raise CalmError(f"-o {out}: a folder; give the weight file to write, e.g. {out / 'my.cwgt'}")
    if out.exists() and not args.force:
        raise CalmError(f"{out} exists; pass --force to replace it (its weights would be lost)")
    cfg = SIZES[args.size]
    model = CalmModel(cfg)
    model.init_weights(args.seed)
    kept = out.name == paths.WEIGHTS and out.is_file()
    save_model(out, model, Metadata(), defaults=GenerationDefaults())
    print(f"wrote {out}: {args.size}, {cfg.param_count():,} parameters, {out.stat().st_size:,} bytes")
    if kept:
        prev = paths.prev_weights_path(out)
        print(f"the weights it replaced are in {prev}: `calm rollback` brings them back")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from calmd.model.checkpoint import load_model
    from calmd.model.generate import Generator, SamplingOptions

    model_path = Path(args.model) if args.model else paths.serving_weights()
    loaded = load_model(model_path)
    gen = Generator(loaded, trace=False)
    ctx: dict[str, object] = {"input": args.input}
    if args.cwd:
        ctx["cwd"] = args.cwd
    if args.git:
        ctx["git"] = args.git
    if args.env:
        ctx["env"] = args.env
    if args.history:
        ctx["history"] = [{"cmd": c, "exit": 0} for c in args.history]
    if args.sample:
        opts = SamplingOptions(args.temperature, args.top_k, args.top_p, args.min_p, args.max_tokens)
        cands = gen.sample(ctx, args.n, options=opts, seed=args.seed, raw=args.raw)
        cands.sort(key=lambda c: c.logprob, reverse=True)
    else:
        cands = list(gen.candidates(ctx, args.n, max_tokens=args.max_tokens, raw=args.raw))
    for cand in cands:
        print(f"{cand.logprob:8.3f}  {cand.text}" if args.scores else cand.text)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from calmd.training.background import rollback

    weights = Path(args.weights) if args.weights else paths.weights_path()
    prev = paths.prev_weights_path(weights)
    had_prev = prev.exists()
    rollback(weights)
    if had_prev:
        print(f"restored {weights} from {prev} (the daemon reloads it)")
    else:
        print(f"no previous weights: moved {weights} to {prev}; the packaged model serves now "
              "(`calm rollback` again brings them back)")  # fmt: skip
    return 0


def _probability(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def cmd_replay(args: argparse.Namespace) -> int:
    from calmd.history.store import check_history_file
    from calmd.quality import replay

    files = replay.expand(args.files)
    for file in files:
        check_history_file(file)  # a missing file, a folder, binary data: one line, before any work
    if args.held_out:
        from calmd.training.corpus import held_out

        files = [f for f in files if held_out(f.stem)]
    if not files:
        raise CalmError("no history files to replay")
    models = [Path(m) for m in args.model or []]
    from calmd.formats.cwgt import read_cwgt

    for m in models:
        if not m.is_file():
            raise CalmError(f"-m {m}: no such weight file")
        read_cwgt(m)  # a file that is no CWGT: said now, not after the warm-up
    if len(models) > 1 and args.with_training:
        raise CalmError("--with-training replays one model at a time")
    if args.search:
        return replay_search(files, args)
    model = models[0] if models else paths.serving_weights()
    from calmd.suggest.engine import RankWeights

    weights = RankWeights.overrides(args.weights or [])
    cfg = replay.ReplayConfig(model=model, positions=args.positions, warmup=args.warmup, seed=args.seed,
                              typing_positions=args.typing, weights=weights,
                              train_every=args.train_every if args.with_training else 0,
                              comp=args.comp, min_confidence=args.min_confidence,
                              models=replay.model_names(models) if len(models) > 1 else {},
                              ranker=args.ranker, refit=args.refit, jobs=args.jobs)  # fmt: skip
    result = replay.replay(files, cfg, progress=not args.quiet)
    print(replay.format_table(result))
    if args.json:
        replay.write_json(result, Path(args.json))
        print(f"wrote {args.json}")
    return 0


def replay_search(files: list[Path], args: argparse.Namespace) -> int:
    """`calm replay --search`: the history search's ranking against recency and frequency."""
    from calmd.quality import replay

    cfg = replay.ReplayConfig(model=Path(), positions=args.positions, warmup=args.warmup, seed=args.seed)
    result = replay.replay_search(files, cfg, progress=not args.quiet)
    print(replay.format_search_table(result))
    if args.json:
        replay.write_json(result, Path(args.json))
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- parsers


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


def calm_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="calm", description="CALM model toolbox: tokenizer, datasets, weights.")
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

    p = sub.add_parser("inspect", help="show a CWGT weight file's header, metadata and sizes")
    p.add_argument("file", metavar="FILE.cwgt")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="also read every weight and check it is finite")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("import", help="import bash, zsh or fish history files into the history store")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--format", choices=["auto", "bash", "zsh", "fish"], default="auto")
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
    p.set_defaults(func=search_ui.cmd_search)

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
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows per table (default 10)")
    p.set_defaults(func=history_view.cmd_stats)

    p = sub.add_parser(
        "forget",
        help="delete history commands that contain PATTERN (for good), e.g. a password typed by mistake",
        description="Delete every stored command that contains PATTERN (plain text, case-sensitive; "
        "--regex for a Python regular expression), and the datasets built from them. The pattern is "
        "not stored anywhere; type the command with a leading space so that your shell does not keep "
        "it either, or give - and type the pattern on standard input.",
    )
    p.add_argument("pattern", metavar="PATTERN", help="text to look for in commands; - reads it from stdin")
    p.add_argument("--regex", "-E", action="store_true", help="PATTERN is a regular expression")
    p.add_argument("--dry-run", "-n", action="store_true", help="only count the matching commands")
    p.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("init", help="write a randomly initialised model (CWGT v5, shell metadata)")
    p.add_argument("--size", choices=["nano", "micro", "mini"], default="nano")
    p.add_argument("-o", "--output", metavar="PATH", help="the new weight file (required)")
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("generate", help="print completions of a context, best first")
    p.add_argument("-m", "--model", metavar="FILE.cwgt", help="weights (default: yours, else the packaged)")
    p.add_argument("--input", "-i", default="", help="what the user typed so far")
    p.add_argument("--cwd")
    p.add_argument("--git", help="git branch")
    p.add_argument("--env", help="environment note (e.g. venv:proj)")
    p.add_argument("--history", nargs="*", metavar="CMD", help="previous commands, oldest first")
    p.add_argument("-n", type=whole(1, 32), default=5, help="candidates, 1 to 32 (default 5)")
    p.add_argument("--raw", action="store_true", help="ignore the stop conditions (EOS only)")
    p.add_argument("--sample", action="store_true", help="sample instead of beam search")
    p.add_argument("--temperature", type=number(0, 100), help="sampling temperature (default: the header's)")
    p.add_argument("--top-k", type=whole(0, 320))
    p.add_argument("--top-p", type=number(0, 1))
    p.add_argument("--min-p", type=number(0, 1))
    p.add_argument("--max-tokens", type=whole(1, 768))
    p.add_argument("--seed", type=whole(0, 2**32 - 1), help="sampling seed")
    p.add_argument("--scores", action="store_true", help="print each candidate's log-probability")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("rollback", help="restore the weights a background training run replaced")
    p.add_argument("--weights", metavar="FILE.cwgt", help=f"(default {paths.weights_path()})")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("replay", help="replay shell histories and score suggestions against baselines")
    p.add_argument("files", nargs="+", metavar="HISTORY", help="bash/zsh history files, or folders of *.txt")
    p.add_argument("-m", "--model", metavar="FILE.cwgt", action="append",
                   help="weights (default: yours, else the packaged); several -m compare the models in one "
                   "run, each answering every query, with its latency")  # fmt: skip
    p.add_argument(
        "--positions", type=whole(1, 100_000), default=40, help="sampled positions per user (default 40)"
    )
    p.add_argument(
        "--typing", type=whole(0, 100_000), default=15, help="positions typed out for keystrokes saved"
    )
    p.add_argument(
        "--warmup", type=whole(0, 10**6), default=50, help="commands replayed before sampling starts"
    )
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    p.add_argument("--held-out", action="store_true", help="only the users the default model never saw")
    p.add_argument(
        "--with-training",
        action="store_true",
        help="let background training happen during the replay, as in real use",
    )
    p.add_argument(
        "--train-every",
        type=whole(1, 10**6),
        default=500,
        metavar="N",
        help="with --with-training: a training run after every N commands (default 500)",
    )
    p.add_argument(
        "--weight",
        dest="weights",
        action="append",
        metavar="NAME=VALUE",
        help="override a ranking weight (calmd.suggest.engine.RankWeights), to measure an idea",
    )
    p.add_argument(
        "--comp",
        action="store_true",
        help="also replay calmd+comp: COMP/ENV from the files the earlier commands created or named",
    )
    p.add_argument("--min-confidence", type=_probability, metavar="P",
                   help="draw a ghost at this confidence or more, in place of the fitted ghost rule "
                   "(as the shells' CALM_MIN_CONFIDENCE)")  # fmt: skip
    p.add_argument("--ranker", choices=("mixture", "history", "model"), default="mixture",
                   help="which predictors rank: the daemon's mixture (default), or one of its parts alone "
                   "(history: the history ranker, no model; model: the model's beams, no history "
                   "proposals)")  # fmt: skip
    p.add_argument("--refit", choices=("model", "ranker", "both"), default="model",
                   help="with --with-training: what a run refits: the model (the background fine-tuning, "
                   "default), the history ranker on the user's commands (seconds), or both")  # fmt: skip
    p.add_argument("--jobs", type=whole(1, 64), default=1, metavar="N",
                   help="replay N users at once, each in a process of its own (default 1)")  # fmt: skip
    p.add_argument("--search", action="store_true",
                   help="replay history searches instead (Ctrl-R: the first word or a fragment of a "
                   "command run before) and rank the right line: calmd, recency, frequency")  # fmt: skip
    p.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "train",
        help="train or fine-tune a model on a CTDS dataset (also under torchrun)",
        description="Train on the command part of each sequence (tokens after ATN). Runs unchanged "
        "under `torchrun --nproc_per_node N`; --batch-size is then the global batch.",
    )
    for flags, kwargs in training_commands.TRAIN_FLAGS.values():  # one per TrainConfig field
        p.add_argument(*flags, **{"default": None, **kwargs})
    p.set_defaults(func=training_commands.cmd_train)

    p = sub.add_parser("evaluate", help="loss, bits per byte and greedy exact-match accuracy on a dataset")
    p.add_argument(
        "-m", "--model", type=Path, metavar="MODEL", help="weights (default: yours, else the packaged model)"
    )
    p.add_argument(
        "-d", "--dataset", type=Path, metavar="DATASET", help=f"CTDS file ({paths.dataset_path()})"
    )
    p.add_argument(
        "--limit", "-n", type=whole(0, 10**9), default=0, metavar="N", help="a random sample of N sequences"
    )
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0, help="for the --limit sample (default 0)")
    p.add_argument("--raw", action="store_true", help="match whole commands, ignoring the stop conditions")
    p.add_argument(
        "--batch-size", type=whole(1, 4096), default=32, help="sequences per forward pass (default 32)"
    )
    p.add_argument("--threads", type=whole(0, 1024), default=0, help="torch threads, 0 = default")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=training_commands.cmd_evaluate)

    # suggestions on or off in every shell, no rc edit
    p = sub.add_parser("enable", help="turn shell suggestions back on in every shell")
    p.set_defaults(func=shell_helper.cmd_enable)
    p = sub.add_parser("disable", help="turn shell suggestions off in every shell")
    p.set_defaults(func=shell_helper.cmd_disable)
    return parser


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):
        return False


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    paths.set_private_umask()  # what calm and calmd write holds history: 0600 files, 0700 folders
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError as exc:
        if _stdout_closed():  # `calm ... | head`: the reader of our output left; say no more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)  # a socket, not our stdout
        return 1
    except (CalmError, OSError) as exc:
        print(f"{parser.prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{parser.prog}: error: out of memory; give smaller counts or files", file=sys.stderr)
        return 1
    except Exception as exc:
        # A bug, not the user's input (every input has its own message): still one line, and
        # CALM_DEBUG=1 shows where.
        if os.environ.get("CALM_DEBUG"):
            raise
        print(f"{parser.prog}: error: unexpected {type(exc).__name__}: {_one_line(exc)} (a bug in calm; "
              "run again with CALM_DEBUG=1 and report what it prints)", file=sys.stderr)  # fmt: skip
        return 1


def _one_line(exc: BaseException) -> str:
    """The error as one line; an OSError as `FILE: what` (its text would be `[Errno 21] ...`)."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, CalmError):
        where = exc.filename2 if isinstance(exc, IsADirectoryError) and exc.filename2 else exc.filename
        text = f"{where}: {exc.strerror}" if where else exc.strerror
        return " ".join(text.split())
    return " ".join(str(exc).split()) or type(exc).__name__


def calm_main(argv: Sequence[str] | None = None) -> int:
    return _run(calm_parser(), argv)


def cmd_serve(args: argparse.Namespace, engine_loader: Callable[[Path], Engine] | None = None) -> int:
    """`calmd serve`. `engine_loader` replaces the model for tests (tests/serve_scripted.py)."""
    import logging

    from calmd.daemon.server import run_server

    if engine_loader is None:  # the model's engine: torch and the model (1.5 s of imports) only here
        from calmd.suggest.engine import load_engine

        engine_loader = load_engine

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    config = config_from(
        ServerConfig, args, SERVE_FLAGS,
        socket_path=Path(args.socket) if args.socket else paths.socket_path(),
        data_dir=paths.data_dir(),
        weights_path=Path(args.model) if args.model else paths.weights_path(),
        import_shell_history=not args.no_import,
        train_args=tuple(args.train_arg or ()),
        prefetch=not args.no_prefetch,
    )  # fmt: skip
    return run_server(config, engine_loader)


def _client(args: argparse.Namespace) -> CalmClient:
    from calmd.shell.client import CalmClient

    return CalmClient(Path(args.socket) if args.socket else None, timeout=args.timeout)


def cmd_status(args: argparse.Namespace) -> int:
    from calmd.shell.client import DaemonNotRunning

    try:
        with _client(args) as client:
            status = client.status()["status"]
    except DaemonNotRunning as exc:
        if args.json:
            print(json.dumps({"running": False, "error": str(exc)}))
        else:
            print(f"calmd is not running ({exc})", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps({"running": True, **status}, indent=2))
        return 0
    from calmd.daemon.status_view import status_table

    _console(args.no_color).print(status_table(status))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from calmd.shell.client import DaemonNotRunning

    try:
        with _client(args) as client:
            pid = client.status()["status"]["pid"]
            client.shutdown()
    except DaemonNotRunning as exc:
        print(f"calmd is not running ({exc})", file=sys.stderr)
        return 3
    # Stopped means: nothing accepts connections on the socket any more (a pid may linger as a
    # zombie of whoever started the daemon).
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            _client(args).close()
        except (DaemonNotRunning, OSError):
            print(f"calmd (pid {pid}) stopped")
            return 0
        time.sleep(0.05)
    print(f"calmd (pid {pid}) did not stop within {args.timeout:g} s", file=sys.stderr)
    return 1


def cmd_complete(args: argparse.Namespace) -> int:
    from calmd.protocol import MAX_INPUT_BYTES
    from calmd.shell.client import DaemonError, DaemonNotRunning
    from calmd.suggest.filters import visible

    if len(args.text.encode("utf-8", "surrogateescape")) > MAX_INPUT_BYTES:
        raise CalmError(f"TEXT is longer than {MAX_INPUT_BYTES} bytes, what a line may hold: give its end")
    history = [{"cmd": h, "exit": 0} for h in args.history] if args.history else None
    try:
        with _client(args) as client:
            ctx = {"cwd": args.cwd or os.getcwd(), "git": args.git, "history": history}
            # asked as the zsh hook asks (the early line first; a multi-line entry too), so the
            # daemon's ghost rule shows what a shell draws: with --scores, the drawn line is marked
            # `ghost`. Printed escaped, never raw: `\n`, `\e` ...
            for message in client.complete(args.text, n=args.n, session=args.session, early=True,
                                           multiline=True, **ctx):  # fmt: skip
                if "early" in message and args.scores:
                    drawn = "ghost" if message.get("ghost") else "     "
                    early = visible(str(message["early"]))
                    print(f"   early  {message.get('confidence', 0):5.3f}  {drawn}  {early}")
                elif "candidate" in message:
                    drawn = "ghost" if message.get("ghost") else "     "
                    text = visible(str(message["candidate"]))
                    print(
                        f"{message['score']:8.3f}  {message.get('confidence', 0):5.3f}  {drawn}  {text}"
                        if args.scores
                        else text
                    )
                elif args.scores:
                    print(
                        f"done in {message['ms']:.1f} ms"
                        + (" (cancelled)" if message.get("cancelled") else "")
                    )
    except DaemonNotRunning as exc:
        print(f"calmd is not running ({exc})", file=sys.stderr)
        return 3
    except DaemonError as exc:
        raise CalmError(f"the daemon refused the request: {exc}") from None
    return 0


def cmd_install_systemd(args: argparse.Namespace) -> int:
    import shutil

    from calmd.daemon.systemd import install_units, user_manager_problem

    target = Path(args.dir).expanduser() if args.dir else Path.home() / ".config" / "systemd" / "user"
    if target.exists() and not target.is_dir():
        raise CalmError(f"--dir {target}: not a folder; give the folder for the unit files")
    calmd_bin = shutil.which("calmd") or str(Path(sys.argv[0]).resolve())
    for path in install_units(target, calmd_bin):
        print(f"wrote {path}")
    problem = user_manager_problem()
    if problem is not None:
        # `systemctl --user` would fail ("Failed to connect to bus"): say so, not "enable with".
        raise CalmError(
            f"the units are written, but they cannot be enabled here: {problem}. Start the daemon "
            "with `calmd serve` (or CALM_AUTOSTART=1 in your shell), or log in with a systemd user "
            "session (`loginctl enable-linger $USER`) and run `systemctl --user daemon-reload && "
            "systemctl --user enable --now calmd.socket`"
        )
    print("enable with:\n  systemctl --user daemon-reload\n  systemctl --user enable --now calmd.socket")
    print("or, without socket activation:\n  systemctl --user enable --now calmd.service")
    return 0


# `calmd serve`'s flags for ServerConfig's fields: their defaults are the dataclass's
SERVE_FLAGS: Flags = {
    "train_threshold": (("--train-threshold",), {"type": whole(0, 10**9), "metavar": "N",
                        "help": "new commands before a background training run (0: only on request)"}),
    "train_max_load": (("--train-max-load",), {"type": number(0, 10**6), "metavar": "LOAD",
                       "help": "start a run automatically only below this 1-minute load average"}),
    "max_connections": (("--max-connections",), {"type": whole(0, 65536), "metavar": "N",
                        "help": "concurrent clients; more are refused with an error (0: 256, fewer under a "
                        "low fd limit)"}),
    "reply_timeout_s": (("--reply-timeout",), {"type": number(0, 86400, above=True), "metavar": "SECONDS",
                        "help": "close a client that leaves 256 KiB of replies unread this long"}),
    "graceful_timeout": (("--graceful-timeout",), {"type": number(0, 3600, above=True), "metavar": "SECONDS",
                         "help": "SIGTERM/SIGINT to exit, at most: in-flight answers, the run's stop"}),
}  # fmt: skip


def calmd_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="calmd", description="calmd: the CALM suggestion daemon.")
    parser.add_argument("--version", action="version", version=f"calmd {__version__}")
    parser.add_argument("--no-color", action="store_true", help="plain output (NO_COLOR is honoured too)")
    parser.add_argument(
        "--socket", metavar="PATH", help="socket path (default $CALMD_SOCKET or the runtime dir)"
    )
    parser.add_argument(
        "--timeout", type=number(0, 86400, above=True), default=10.0, help="seconds to wait for the daemon"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="run the daemon in the foreground")
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="socket path")
    p.add_argument("--model", metavar="FILE.cwgt", help=f"weights (default {paths.weights_path()})")
    p.add_argument(
        "--no-import", action="store_true", help="do not import ~/.bash_history and ~/.zsh_history"
    )
    p.add_argument(
        "--no-prefetch",
        action="store_true",
        help="do not prepare a session's next line after each record (to measure what it saves)",
    )
    add_flags(p, ServerConfig, SERVE_FLAGS)
    p.add_argument(
        "--train-arg",
        action="append",
        metavar="ARG",
        help="extra argument for the training process (python -m calmd.training.background --help)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("status", help="show the daemon's state (exit 3 when none runs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("stop", help="stop the daemon gracefully")
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("complete", help="print streamed candidates for TEXT (a debugging client)")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("-n", type=whole(0, 32), default=5, help="candidates, 0 to 32 (default 5)")
    p.add_argument("--cwd")
    p.add_argument("--git")
    p.add_argument("--session", default="calmd-complete")
    p.add_argument("--history", nargs="*", metavar="CMD", help="context commands (default: the store's)")
    p.add_argument("--scores", action="store_true", help="show scores and timing")
    p.set_defaults(func=cmd_complete)
    p = sub.add_parser("install-systemd", help="copy the user units to ~/.config/systemd/user")
    p.add_argument("--dir", metavar="DIR", help="unit folder (default ~/.config/systemd/user)")
    p.set_defaults(func=cmd_install_systemd)

    p = sub.add_parser("init", help="print the shell hook (for ~/.zshrc, ~/.bashrc, fish's config.fish)")
    p.add_argument("shell", choices=shell_helper.SHELLS)
    p.set_defaults(func=shell_helper.cmd_init)
    p = sub.add_parser("shell-helper", help="the per-shell helper the hooks start (line protocol)")
    p.add_argument("--session", default="", help="session id (default: from the parent pid)")
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="socket path")
    p.add_argument("--autostart", action="store_true", help="start `calmd serve` once when no daemon answers")
    p.add_argument("--format", type=int, choices=(1, 2), default=1, help="line format (the hooks use 2)")
    p.add_argument("--shell", choices=shell_helper.SHELLS, help="the hook file to rewrite when calmd changes")
    p.add_argument("--spool", metavar="DIR",
                   help="read requests from files in DIR and answer through DIR/reply (fish, which "
                   "cannot keep a pipe open: calmd/shell/spool.py)")  # fmt: skip
    p.set_defaults(func=cmd_shell_helper)
    return parser


def cmd_shell_helper(args: argparse.Namespace) -> int:
    """The per-shell helper: fish's (request files, `--spool`) or bash's and zsh's (pipes)."""
    if args.spool:
        from calmd.shell import spool

        return spool.cmd_fish_helper(args)
    return shell_helper.cmd_shell_helper(args)


def calmd_main(argv: Sequence[str] | None = None) -> int:
    return _run(calmd_parser(), argv)
