"""The training-source text format (docs/formats.md): one example per blank-line-separated block.

    <CWD>/home/user/lilush
    <GIT>main
    <HIST>git diff --stat<EXIT>0
    <COMP>commit<NEXT>checkout
    <ENV>venv:myproject
    <CMD>git commit -m "fix tokenizer"

Each line starts with a frame name; which context field it fills comes from the template
(`CWD:cwd` -> `cwd`). Decisions where the spec is silent (docs/formats.md):
- `<CMD>` is required, once per block; simple frames and `<COMP>` at most once; `<HIST>` repeats,
  oldest first, and `<EXIT>n` (a decimal integer) is optional.
- Only the line break is stripped: trailing spaces belong to the command.
- A line without a leading `<NAME>`, an unknown name, or a frame the template lacks is an error
  naming the file and line. Text is UTF-8; other bytes survive as surrogate escapes.
- The writer refuses values that cannot be written back unambiguously (a newline anywhere, a
  `<NEXT>` inside a completion item, `<EXIT>` inside a history command).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from calmd.atomic import atomic_write
from calmd.errors import FormatError
from calmd.formats.tokenizer import (
    DEFAULT_SHELL_TEMPLATE,
    SPECIAL_IDS,
    Example,
    HistoryEntry,
    Special,
    Template,
)

_LINE_RE = re.compile(r"^<([A-Z]+)>(.*)$", re.DOTALL)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class SourceParser:
    """Parses blocks one at a time, so a large file is never held in memory."""

    def __init__(self, template: Template = DEFAULT_SHELL_TEMPLATE, *, name: str = "<text>") -> None:
        self.template = template
        self.name = name

    def error(self, line_no: int, message: str) -> FormatError:
        return FormatError(message, path=self.name, field=f"line {line_no}")

    def parse_block(self, lines: list[tuple[int, str]]) -> Example:
        example = Example()
        have_cmd = False
        for line_no, line in lines:
            match = _LINE_RE.match(line)
            if not match:
                raise self.error(
                    line_no, f"expected a line starting with a frame name like <CMD>, got {line!r}"
                )
            name, body = match.groups()
            if name not in SPECIAL_IDS:
                raise self.error(line_no, f"unknown frame <{name}>")
            token = SPECIAL_IDS[name]
            fld = self.template.field_of(token)
            if fld is None:
                raise self.error(line_no, f"frame <{name}> is not part of the template {self.template}")
            if token == Special.CMD:
                if have_cmd:
                    raise self.error(
                        line_no, "a second <CMD> in one block (blocks are separated by a blank line)"
                    )
                have_cmd = True
                example.cmd = body
            elif token == Special.HIST:
                cmd, sep, code = body.rpartition("<EXIT>")
                if not sep:
                    cmd, code = body, ""
                if "<" in cmd and re.search(r"<(EXIT|NEXT|END)>", cmd):
                    raise self.error(line_no, f"<HIST> command holds a frame marker: {cmd!r}")
                exit_code: int | None = None
                if sep:
                    if not re.fullmatch(r"-?[0-9]+", code):
                        raise self.error(line_no, f"<EXIT> must be followed by an integer, got {code!r}")
                    exit_code = int(code)
                example.fields.setdefault(fld, []).append(HistoryEntry(cmd, exit_code))
            else:
                if fld in example.fields:
                    raise self.error(line_no, f"<{name}> given twice in one block")
                if token == Special.COMP:
                    example.fields[fld] = body.split("<NEXT>")
                else:
                    example.fields[fld] = body
        if not have_cmd:
            first = lines[0][0]
            raise self.error(first, f"the block starting at line {first} has no <CMD> line")
        return example

    def parse_stream(self, stream: Iterable[bytes]) -> Iterator[Example]:
        block: list[tuple[int, str]] = []
        for line_no, raw in enumerate(stream, start=1):
            line = _text(raw.rstrip(b"\n").removesuffix(b"\r"))
            if line.strip():
                block.append((line_no, line))
            elif block:
                yield self.parse_block(block)
                block = []
        if block:
            yield self.parse_block(block)


def parse_text(
    text: str, template: Template = DEFAULT_SHELL_TEMPLATE, *, name: str = "<text>"
) -> list[Example]:
    """Parse a whole training source held in a string: the spec's `parse_text_dataset`. Spec-only:
    `calm dataset` streams files through SourceParser instead."""
    return list(
        SourceParser(template, name=name).parse_stream(io.BytesIO(text.encode("utf-8", "surrogateescape")))
    )


def iter_file(path: str | os.PathLike[str], template: Template = DEFAULT_SHELL_TEMPLATE) -> Iterator[Example]:
    """Parse a training source file block by block (a library entry point; the CLI uses SourceParser)."""
    with open(path, "rb") as stream:
        yield from SourceParser(template, name=str(path)).parse_stream(stream)


def format_example(example: Example, template: Template = DEFAULT_SHELL_TEMPLATE) -> str:
    """One block, in template order, ending with the <CMD> line (no trailing blank line)."""
    lines: list[str] = []

    def check(value: str, what: str) -> str:
        if "\n" in value or "\r" in value:
            raise ValueError(f"{what} holds a line break, which the text format cannot hold: {value!r}")
        return value

    for item in template.items:
        if item.field is None or item.token == Special.CMD:
            continue
        name = f"<{Special(item.token).name}>"
        value = example.fields.get(item.field)
        if not value:
            continue
        if item.token == Special.HIST:
            for entry in value:
                cmd = check(entry.cmd, "history command")
                if "<EXIT>" in cmd:
                    raise ValueError(f"history command holds '<EXIT>': {cmd!r}")
                lines.append(name + cmd + ("" if entry.exit is None else f"<EXIT>{entry.exit}"))
        elif item.token == Special.COMP:
            for c in value:
                if "<NEXT>" in check(c, "completion"):
                    raise ValueError(f"completion holds '<NEXT>': {c!r}")
            lines.append(name + "<NEXT>".join(value))
        else:
            lines.append(name + check(value, item.field))
    lines.append("<CMD>" + check(example.cmd, "command"))
    return "\n".join(lines)


def format_text(examples: Iterable[Example], template: Template = DEFAULT_SHELL_TEMPLATE) -> str:
    """Blocks separated by one blank line, with a final newline (`write_text` streams the same)."""
    return "".join(format_example(e, template) + "\n\n" for e in examples).removesuffix("\n")


def write_text(
    path: str | os.PathLike[str], examples: Iterable[Example], template: Template = DEFAULT_SHELL_TEMPLATE
) -> Path:
    """Write a training source atomically."""
    with atomic_write(path) as out:
        first = True
        for example in examples:
            if not first:
                out.write(b"\n")
            out.write(format_example(example, template).encode("utf-8", "surrogateescape") + b"\n")
            first = False
    return Path(path)
