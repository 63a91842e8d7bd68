"""The CALM byte tokenizer: 320 ids, frames, templates and stop conditions.

Vocabulary (docs/formats.md, "Tokenizer"):
    0-255    raw bytes, token id == byte value (encoding is uint8 -> uint16 widening)
    256-277  22 named special tokens (PAD, BOS, EOS, ATN, frame tokens, sub-tokens)
    278-319  reserved; never produced, rejected by `decode`

A model's input is built from a *template spec* (CWGT metadata line 2), e.g.
    BOS;CWD:cwd;GIT:git;HIST:history;COMP:completions;ENV:env;ATN;CMD:input
and a *context* mapping (cwd, git, history, completions, env, input). `build_sequence` turns the two
into token ids, applying the 15-item caps and the l_max truncation policy (docs/formats.md).

Generation stops on EOS or PAD always, and on the metadata's stop patterns (`| ; && ||` for the
shell) unless in raw mode; `StopMatcher` checks them one generated token at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from calmd.errors import SequenceTooLong, TemplateError, TokenError
from calmd.visible import quoted

VOCAB_SIZE = 320
BYTE_TOKENS = 256
SPECIAL_BASE = 256
MAX_FRAME_ITEMS = 15  # cap of repeated (HIST) and list (COMP) frames
DEFAULT_L_MAX = 768

TokenArray = npt.NDArray[np.uint16]


class Special(IntEnum):
    """The 22 special tokens, ids 256-277, in the order of the spec's table."""

    PAD = 256
    BOS = 257
    EOS = 258
    ATN = 259
    CWD = 260
    GIT = 261
    HIST = 262
    EXIT = 263
    CMD = 264
    ENV = 265
    COMP = 266
    QUERY = 267
    NEXT = 268
    END = 269
    WORD = 270
    POS = 271
    NOTE = 272
    IPA = 273
    DEF = 274
    QUOTE = 275
    BY = 276
    REF = 277


NUM_SPECIALS = len(Special)
assert NUM_SPECIALS == 22 and max(Special) == 277
SPECIAL_NAMES: dict[int, str] = {int(s): s.name for s in Special}  # id -> "CWD"
SPECIAL_IDS: dict[str, int] = {s.name: int(s) for s in Special}  # "CWD" -> id

# Tokens that open a frame closed by END (everything except control tokens and sub-tokens).
FRAME_TOKENS = frozenset(
    {Special.CWD, Special.GIT, Special.HIST, Special.CMD, Special.ENV, Special.COMP, Special.QUERY}
    | {Special.WORD, Special.DEF, Special.QUOTE, Special.REF}
)
# The specification's two other classes, kept as its token table states them (spec-only: no
# calmd code branches on them).
SUBTOKENS = frozenset({Special.EXIT, Special.NEXT, Special.POS, Special.NOTE, Special.IPA, Special.BY})
CONTROL_TOKENS = frozenset({Special.PAD, Special.BOS, Special.EOS, Special.ATN})


def special_name(token_id: int) -> str:
    """`260 -> "CWD"`; raises TokenError for ids that are not special tokens. Spec-only (the C API's
    special_names table): views and tests use it, the daemon does not."""
    try:
        return SPECIAL_NAMES[token_id]
    except KeyError:
        raise TokenError(f"token id {token_id} is not a special token (256-277)") from None


def special_id(name: str) -> int:
    """`"CWD"` or `"<CWD>"` -> 260; raises TokenError for unknown names."""
    bare = name[1:-1] if name.startswith("<") and name.endswith(">") else name
    try:
        return SPECIAL_IDS[bare]
    except KeyError:
        raise TokenError(f"unknown special token name {quoted(name)}") from None


# --------------------------------------------------------------------------- encoding


def to_bytes(text: str | bytes | bytearray | memoryview) -> bytes:
    """Text as the bytes the model sees. `str` is UTF-8; lone surrogates from
    `surrogateescape` decoding map back to the original bytes, so any byte string round-trips."""
    if isinstance(text, str):
        return text.encode("utf-8", "surrogateescape")
    return bytes(text)


def encode(text: str | bytes | bytearray | memoryview) -> TokenArray:
    """Bytes -> token ids (uint16). Vectorised: one widening copy, no Python loop."""
    raw = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    src = np.frombuffer(raw, dtype=np.uint8)
    out = np.empty(src.size, dtype=np.uint16)
    np.copyto(out, src, casting="safe")  # measured ~15% faster than astype() (bench/tokenizer_encode.py)
    return out


def validate_ids(ids: npt.ArrayLike) -> TokenArray:
    """Token ids as a uint16 array; TokenError naming the first id outside 0-277."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise TokenError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint16)
    if arr.dtype.kind not in "iu":
        raise TokenError(f"token ids must be integers, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= SPECIAL_BASE + NUM_SPECIALS)
    if bad.any():
        pos = int(np.argmax(bad))
        value = int(arr[pos])
        why = "reserved (278-319)" if SPECIAL_BASE + NUM_SPECIALS <= value < VOCAB_SIZE else "out of range"
        raise TokenError(f"token id {value} at position {pos} is {why}; valid ids are 0-277")
    return arr.astype(np.uint16, copy=False)


def decode(ids: npt.ArrayLike) -> bytes:
    """Token ids -> bytes. Special tokens are skipped; reserved or out-of-range ids raise TokenError."""
    arr = validate_ids(ids)
    return arr[arr < BYTE_TOKENS].astype(np.uint8).tobytes()


def decode_text(ids: npt.ArrayLike) -> str:
    """`decode` as str; invalid UTF-8 survives as surrogate escapes (see `to_bytes`). Spec-only
    (the tokenizer spec's decode-to-string): calmd itself decodes to bytes."""
    return decode(ids).decode("utf-8", "surrogateescape")


def frame(token: int, content: str | bytes = b"") -> TokenArray:
    """calm_tokenize_frame: `[token] content-bytes [END]`."""
    body = encode(content)
    out = np.empty(body.size + 2, dtype=np.uint16)
    out[0] = token
    out[1:-1] = body
    out[-1] = Special.END
    return out


def hist_frame(cmd: str | bytes, exit_code: int | None) -> TokenArray:
    """`HIST cmd [EXIT digits] END`; the EXIT part is omitted when the exit code is unknown."""
    parts = [np.array([Special.HIST], dtype=np.uint16), encode(cmd)]
    if exit_code is not None:
        parts += [np.array([Special.EXIT], dtype=np.uint16), encode(str(int(exit_code)))]
    parts.append(np.array([Special.END], dtype=np.uint16))
    return np.concatenate(parts)


def list_frame(token: int, items: Sequence[str | bytes]) -> TokenArray:
    """`token item NEXT item ... END` (the COMP frame)."""
    parts: list[TokenArray] = [np.array([token], dtype=np.uint16)]
    for i, item in enumerate(items):
        if i:
            parts.append(np.array([Special.NEXT], dtype=np.uint16))
        parts.append(encode(item))
    parts.append(np.array([Special.END], dtype=np.uint16))
    return np.concatenate(parts)


# --------------------------------------------------------------------------- templates

_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TemplateItem:
    """One `;`-separated item: a bare token (`BOS`) or a frame filled from a field (`CWD:cwd`)."""

    token: int
    field: str | None = None

    def spec(self) -> str:
        name = SPECIAL_NAMES[self.token]
        return f"{name}:{self.field}" if self.field else name


@dataclass(frozen=True)
class Template:
    """A parsed template spec. `str(template)` gives the spec back."""

    items: tuple[TemplateItem, ...]

    def __str__(self) -> str:
        return ";".join(item.spec() for item in self.items)

    def field_of(self, token: int) -> str | None:
        for item in self.items:
            if item.token == token and item.field:
                return item.field
        return None


DEFAULT_SHELL_TEMPLATE_SPEC = "BOS;CWD:cwd;GIT:git;HIST:history;COMP:completions;ENV:env;ATN;CMD:input"
DEFAULT_SHELL_STOPS = "| ; && ||"


def parse_template(spec: str) -> Template:
    """Parse `BOS;CWD:cwd;...;ATN;CMD:input`. Rules (docs/formats.md): known token names only, ATN exactly
    once, a CMD item last when present, frame items need a field, each field used once."""
    spec = spec.strip()
    if not spec:
        raise TemplateError("template spec is empty")
    items: list[TemplateItem] = []
    seen_fields: set[str] = set()
    for position, raw in enumerate(spec.split(";"), start=1):
        name, sep, fld = raw.strip().partition(":")
        if name not in SPECIAL_IDS:
            raise TemplateError(f"template item {position} {quoted(raw)}: unknown token name {quoted(name)}")
        token = SPECIAL_IDS[name]
        if sep:
            if not _FIELD_RE.match(fld):
                raise TemplateError(f"template item {position} {quoted(raw)}: bad field name {quoted(fld)}")
            if token not in FRAME_TOKENS:
                raise TemplateError(f"template item {position} {quoted(raw)}: {name} is not a frame token")
            if fld in seen_fields:
                raise TemplateError(f"template item {position} {quoted(raw)}: field {quoted(fld)} used twice")
            seen_fields.add(fld)
            items.append(TemplateItem(token, fld))
        else:
            if token in FRAME_TOKENS:
                raise TemplateError(f"template item {position} {quoted(raw)}: frame {name} needs a field")
            items.append(TemplateItem(token))
    if sum(item.token == Special.ATN for item in items) != 1:
        raise TemplateError(f"template {quoted(spec)}: ATN must appear exactly once")
    cmd_items = [i for i, item in enumerate(items) if item.token == Special.CMD]
    if cmd_items and cmd_items != [len(items) - 1]:
        raise TemplateError(f"template {quoted(spec)}: CMD must be the last item, once")
    return Template(tuple(items))


DEFAULT_SHELL_TEMPLATE = parse_template(DEFAULT_SHELL_TEMPLATE_SPEC)


@dataclass(frozen=True)
class HistoryEntry:
    """One executed command in a HIST frame; `exit` None means the exit code is unknown."""

    cmd: str
    exit: int | None = None


def _history_entries(value: Any, fld: str) -> list[HistoryEntry]:
    if isinstance(value, str | bytes):
        raise TemplateError(f"context field {quoted(fld)} must be a list of commands, got a string")
    entries: list[HistoryEntry] = []
    for i, item in enumerate(value):
        if isinstance(item, HistoryEntry):
            entries.append(item)
        elif isinstance(item, str):
            entries.append(HistoryEntry(item))
        elif isinstance(item, Mapping) and isinstance(item.get("cmd"), str):
            code = item.get("exit")
            if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
                raise TemplateError(f"context field {quoted(fld)}[{i}].exit must be an integer or absent")
            entries.append(HistoryEntry(item["cmd"], code))
        else:
            raise TemplateError(f"context field {quoted(fld)}[{i}] must be a command or {{cmd, exit}}")
    return entries


def _string_list(value: Any, fld: str) -> list[str]:
    if isinstance(value, str | bytes) or not all(isinstance(v, str) for v in value):
        raise TemplateError(f"context field {quoted(fld)} must be a list of strings")
    return list(value)


def _frame_len(item: TemplateItem, value: Any) -> int:
    if item.field is None:
        return 1
    if item.token == Special.HIST:
        return sum(2 + len(to_bytes(e.cmd)) + (0 if e.exit is None else 1 + len(str(e.exit))) for e in value)
    if item.token == Special.COMP:
        return 2 + sum(len(to_bytes(c)) for c in value) + max(len(value) - 1, 0) if value else 0
    if item.token == Special.CMD:
        return 1 + len(to_bytes(value))
    return 2 + len(to_bytes(value)) if value else 0


def _utf8_boundary(raw: bytes) -> bytes:
    """Drop leading UTF-8 continuation bytes so a left-truncated path starts on a character."""
    start = 0
    while start < len(raw) and start < 3 and 0x80 <= raw[start] < 0xC0:
        start += 1
    return raw[start:]


def build_sequence(
    template: Template | str,
    ctx: Mapping[str, Any],
    *,
    l_max: int | None = DEFAULT_L_MAX,
    training: bool = False,
) -> TokenArray:
    """Build a model input from a template and a context (docs/formats.md, "Tokenizer").

    - Frames are emitted only when their field is present and non-empty.
    - HIST: one frame per entry, oldest first, the newest 15 kept. COMP: one list frame, first 15.
    - `training=True` appends EOS after the CMD frame (the input is then the whole command).
    - Over `l_max` tokens: drop the oldest history frames, then completion items from the end,
      then truncate the cwd from the left, then drop the other optional frames from the last one
      back. The CMD frame is never dropped: at inference its input keeps its newest bytes (the
      model only continues from them); in training a command that cannot fit raises
      SequenceTooLong so that dataset builders skip and count it.
    """
    tpl = parse_template(template) if isinstance(template, str) else template
    values: list[Any] = []
    for item in tpl.items:
        raw = ctx.get(item.field) if item.field else None
        if item.field is None:
            values.append(None)
        elif item.token == Special.HIST:
            values.append(_history_entries(raw, item.field)[-MAX_FRAME_ITEMS:] if raw else [])
        elif item.token == Special.COMP:
            values.append(_string_list(raw, item.field)[:MAX_FRAME_ITEMS] if raw else [])
        elif raw is None:
            values.append("")
        elif isinstance(raw, str | bytes):
            values.append(raw)
        else:
            kind = type(raw).__name__
            raise TemplateError(f"context field {quoted(item.field)} must be a string, got {kind}")
    tail = 1 if training else 0  # the EOS

    if l_max is not None:
        lengths = [_frame_len(item, v) for item, v in zip(tpl.items, values, strict=True)]
        excess = sum(lengths) + tail - l_max
        if excess > 0:
            _truncate(tpl, values, lengths, excess, training, l_max)

    parts: list[TokenArray] = []
    for item, value in zip(tpl.items, values, strict=True):
        if item.field is None:
            parts.append(np.array([item.token], dtype=np.uint16))
        elif item.token == Special.HIST:
            parts.extend(hist_frame(e.cmd, e.exit) for e in value)
        elif item.token == Special.COMP:
            if value:
                parts.append(list_frame(item.token, value))
        elif item.token == Special.CMD:
            parts.append(np.array([Special.CMD], dtype=np.uint16))
            parts.append(encode(value))
        elif value:
            parts.append(frame(item.token, value))
    if training:
        parts.append(np.array([Special.EOS], dtype=np.uint16))
    seq = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
    assert l_max is None or seq.size <= l_max, (seq.size, l_max)
    return seq


def _truncate(
    tpl: Template, values: list[Any], lengths: list[int], excess: int, training: bool, l_max: int
) -> None:
    """Cut `excess` tokens following the policy of `build_sequence`, editing `values` in place."""
    items = tpl.items

    def cut(index: int, new_value: Any) -> None:
        nonlocal excess
        values[index] = new_value
        new_len = _frame_len(items[index], new_value)
        excess -= lengths[index] - new_len
        lengths[index] = new_len

    for i, item in enumerate(items):  # 1. oldest history first
        if item.token == Special.HIST and item.field:
            while excess > 0 and values[i]:
                cut(i, values[i][1:])
    for i, item in enumerate(items):  # 2. completion items, least likely (last) first
        if item.token == Special.COMP and item.field:
            while excess > 0 and values[i]:
                cut(i, values[i][:-1])
    for i, item in enumerate(items):  # 3. the cwd, from the left
        if item.token == Special.CWD and item.field and excess > 0 and values[i]:
            raw = to_bytes(values[i])
            keep = len(raw) - excess
            cut(i, _utf8_boundary(raw[len(raw) - keep :]) if keep > 0 else b"")
    for i in reversed(range(len(items))):  # 4. any other optional frame, last first
        item = items[i]
        if excess > 0 and item.field and item.token != Special.CMD and values[i]:
            cut(i, [] if item.token in (Special.HIST, Special.COMP) else "")
    if excess > 0:
        cmd_index = next((i for i, item in enumerate(items) if item.token == Special.CMD), None)
        if training or cmd_index is None:
            raise SequenceTooLong(f"sequence needs {l_max + excess} tokens, l_max is {l_max}")
        raw = to_bytes(values[cmd_index])
        if excess > len(raw):
            raise SequenceTooLong(f"template's fixed tokens alone exceed l_max {l_max}")
        cut(cmd_index, raw[excess:])


def atn_position(seq: npt.ArrayLike) -> int:
    """0-indexed position of the single ATN token (the CTDS cmd_position)."""
    where = np.flatnonzero(np.asarray(seq) == Special.ATN)
    if where.size != 1:
        raise TokenError(f"a sequence must hold exactly one ATN token, found {where.size}")
    return int(where[0])


# --------------------------------------------------------------------------- parsing sequences back


@dataclass
class Example:
    """A context plus the command, as in a training-source block or a CTDS sequence."""

    fields: dict[str, Any] = field(default_factory=dict)  # cwd, git, history, completions, env, ...
    cmd: str = ""

    def context(self) -> dict[str, Any]:
        """Context for `build_sequence(..., training=True)`: the fields with the command as input."""
        return {**self.fields, "input": self.cmd}


def parse_sequence(seq: npt.ArrayLike, template: Template = DEFAULT_SHELL_TEMPLATE) -> Example:
    """Token ids -> Example: the inverse of `build_sequence(template, ctx, training=True)`. Spec-only
    (the round trip the dataset spec promises); tests check every CTDS we write with it."""
    ids = validate_ids(seq).tolist()
    example = Example()
    i = 0
    n = len(ids)

    def read_bytes(stop: set[int]) -> tuple[bytes, int]:
        j = i
        while j < n and ids[j] not in stop:
            if ids[j] >= BYTE_TOKENS:
                raise TokenError(f"position {j}: unexpected <{SPECIAL_NAMES[ids[j]]}> inside a frame")
            j += 1
        return bytes(ids[i:j]), j

    def text(raw: bytes) -> str:
        return raw.decode("utf-8", "surrogateescape")

    while i < n:
        tok = ids[i]
        if tok < BYTE_TOKENS:
            raise TokenError(f"position {i}: byte {tok} outside any frame")
        i += 1
        if tok in (Special.BOS, Special.ATN, Special.PAD):
            continue
        if tok == Special.EOS:
            break
        fld = template.field_of(tok)
        if fld is None:
            raise TokenError(f"position {i - 1}: <{SPECIAL_NAMES[tok]}> is not a frame of the template")
        if tok == Special.CMD:
            raw, i = read_bytes({Special.EOS})
            example.cmd = text(raw)
        elif tok == Special.HIST:
            raw, i = read_bytes({Special.EXIT, Special.END})
            code: int | None = None
            if i < n and ids[i] == Special.EXIT:
                i += 1
                digits, i = read_bytes({Special.END})
                try:
                    code = int(digits.decode("ascii"))
                except (UnicodeDecodeError, ValueError):
                    raise TokenError(f"position {i}: exit code {digits!r} is not a number") from None
            example.fields.setdefault(fld, []).append(HistoryEntry(text(raw), code))
            i = _expect_end(ids, i)
        elif tok == Special.COMP:
            items: list[str] = []
            while True:
                raw, i = read_bytes({Special.NEXT, Special.END})
                items.append(text(raw))
                if i < n and ids[i] == Special.NEXT:
                    i += 1
                    continue
                break
            example.fields[fld] = items
            i = _expect_end(ids, i)
        else:
            raw, i = read_bytes({Special.END})
            example.fields[fld] = text(raw)
            i = _expect_end(ids, i)
    return example


def _expect_end(ids: list[int], i: int) -> int:
    if i >= len(ids) or ids[i] != Special.END:
        raise TokenError(f"position {i}: frame not closed by <END>")
    return i + 1


# --------------------------------------------------------------------------- stop conditions


@dataclass(frozen=True)
class StopConditions:
    """Byte patterns that end a generated candidate (CWGT metadata line 3, space separated).
    EOS and PAD always stop and are not listed here."""

    patterns: tuple[bytes, ...] = ()

    def __str__(self) -> str:
        return " ".join(p.decode("utf-8", "surrogateescape") for p in self.patterns)


def parse_stop_conditions(line: str) -> StopConditions:
    """`"| ; && ||"` -> patterns; duplicates removed, order kept. Separated by spaces, as the
    specification says: only U+0020 separates (str.split() would also split on \x1c-\x1f, \x85,
    \xa0 and the other Unicode spaces, which a pattern may hold)."""
    patterns: list[bytes] = []
    for word in line.split(" "):
        if not word:
            continue
        raw = to_bytes(word)
        if raw not in patterns:
            patterns.append(raw)
    return StopConditions(tuple(patterns))


class StopMatcher:
    """Checks generated tokens one at a time against the stop conditions.

    `feed(token)` returns True when generation must stop; `output` holds the accepted bytes, with a
    matched multi-byte pattern rolled back (for `&&`, the first `&` emitted a step earlier is
    removed again). Special tokens other than EOS/PAD are not output and break byte adjacency.
    Only generated bytes are matched, never the user's input. `raw=True` keeps only EOS/PAD.
    """

    __slots__ = ("_ends", "_longest", "_patterns", "_run", "output", "stopped")

    def __init__(self, conditions: StopConditions, *, raw: bool = False) -> None:
        self._patterns = () if raw else conditions.patterns
        self._longest = max((len(p) for p in self._patterns), default=0)
        # the bytes a pattern ends with: no other byte can complete one (feed skips the patterns)
        ends = {p[-1] for p in self._patterns if p}
        self._ends = frozenset(range(BYTE_TOKENS) if not all(self._patterns) else ends)
        self._run = 0  # bytes generated since the last special token
        self.output = bytearray()
        self.stopped = False

    def copy(self) -> StopMatcher:
        """An independent matcher in the same position (beam search forks one per hypothesis)."""
        twin = StopMatcher.__new__(StopMatcher)
        twin._patterns, twin._longest, twin._run = self._patterns, self._longest, self._run
        twin._ends, twin.output, twin.stopped = self._ends, bytearray(self.output), self.stopped
        return twin

    def stops_at(self, token: int) -> bool:
        """Whether `feed(token)` would return True, without feeding it (the beam search asks
        before forking a matcher for a hypothesis it would otherwise drop)."""
        if token == Special.EOS or token == Special.PAD:
            return True
        if token >= BYTE_TOKENS or token not in self._ends:
            return False
        return self.copy().feed(token)

    def feed(self, token: int) -> bool:
        assert not self.stopped, "feed() after stop"
        if token == Special.EOS or token == Special.PAD:
            self.stopped = True
            return True
        if token >= BYTE_TOKENS:
            self._run = 0
            return False
        self.output.append(token)
        self._run += 1
        if token not in self._ends:
            return False
        for pattern in self._patterns:
            if len(pattern) <= self._run and self.output.endswith(pattern):
                del self.output[len(self.output) - len(pattern) :]
                self.stopped = True
                return True
        return False


def apply_stop_conditions(tokens: Iterable[int], conditions: StopConditions, *, raw: bool = False) -> bytes:
    """Run a whole generated token list through a StopMatcher and return the accepted bytes."""
    matcher = StopMatcher(conditions, raw=raw)
    for token in tokens:
        if matcher.feed(int(token)):
            break
    return bytes(matcher.output)
