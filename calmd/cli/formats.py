"""`calm tokenize`, `calm detokenize` and `calm inspect`: the byte tokenizer and the CWGT header, shown."""

from __future__ import annotations

import argparse
import json
import sys

from calmd.arguments import Parser
from calmd.cli.common import new_console
from calmd.errors import CalmError
from calmd.visible import quoted


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
            raise CalmError(f"{quoted(word)} is not a token id (an integer 0-277)") from None
        if not 0 <= value <= 0xFFFF:
            raise CalmError(f"token id {value} is out of range; valid ids are 0-277")
        values.append(value)
    if args.view:
        new_console(args.no_color).print(render(values))
        return 0
    sys.stdout.buffer.write(decode(values))
    if sys.stdout.isatty():
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    return 0


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
    new_console(args.no_color).print(table)
    return 0


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """tokenize, detokenize, inspect"""
    p = sub.add_parser("tokenize", help="print the token ids of TEXT")
    p.add_argument("text", metavar="TEXT", help="the text to encode (UTF-8)")
    p.add_argument("--frame", metavar="NAME", help="wrap as a frame: NAME ids... END (e.g. CWD)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("detokenize", help="print the bytes of token ids (specials skipped)")
    p.add_argument("ids", nargs="+", metavar="ID", help="token ids, 0 to 319")
    p.add_argument("--view", action="store_true", help="show the coloured token view instead")
    p.set_defaults(func=cmd_detokenize)

    p = sub.add_parser("inspect", help="show a CWGT weight file's header, metadata and sizes")
    p.add_argument("file", metavar="FILE.cwgt", help="a weight file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="also read every weight and check it is finite")
    p.set_defaults(func=cmd_inspect)
