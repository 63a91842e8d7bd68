"""Text on its way to a terminal: the one rule for every view that prints what it did not write.

A stored command, a folder, a file name in an error, a field of a JSON file: any of them may hold
characters a terminal acts on instead of drawing (ESC starts OSC 52, which writes the clipboard,
or OSC 0, which sets the title; CSI 2J clears the screen; CR and BS draw over what came before;
U+009B is a one-character CSI) or that change what the eye reads (U+202E turns the rest of the
line right to left; U+200B is a character no one sees). `visible` writes each of them as an
escape, so the user sees what was stored and nothing of it reaches the terminal as it is:

    HIDDEN     C0 controls (U+0000-U+001F), DEL, C1 controls (U+0080-U+009F); the format
               characters (Unicode category Cf: U+00AD, U+0600-U+0605, U+061C, U+06DD, U+070F,
               U+0890-U+0891, U+08E2, U+180E, U+200B-U+200F, U+202A-U+202E, U+2060-U+2064,
               U+2066-U+206F, U+FEFF, U+FFF9-U+FFFB, and the supplementary ones up to the tags
               U+E0001, U+E0020-U+E007F) and the line and paragraph separators U+2028, U+2029;
               the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0: letters that draw nothing);
               surrogates (a byte that was not UTF-8, kept by Python's surrogateescape).
    escapes    `\\e` ESC, `\\n`, `\\t`, `\\r`; `\\xHH` another C0 control or DEL, and a byte
               that was not UTF-8 (U+DC80-U+DCFF: `\\x80`-`\\xff`); `\\uHHHH` any other in the
               BMP (`\\u009b`, `\\u202e`), `\\UHHHHHHHH` above it (`\\U000e0041`).
    backslash  a text that holds an escape has its own backslashes doubled (`\\\\`), so that in it
               every backslash starts an escape and each escape reads back as one character; a
               text that holds none is printed exactly as stored (`printf '%s\\n'` stays
               copyable). What is one text is the caller's: a line of `calm history`, a cell of
               `calm stats`, a field of a `calm search` result.

So the mapping is the identity on texts without a hidden character, and on texts with one it is
reversible (tests/test_visible.py reads every escape back). What it does not tell apart: a text
with no hidden character that spells an escape (`\\e`, typed) and a text that holds the character
(ESC) alone; a coloured view may mark which. JSON (`json_text`) is exact: the hidden characters
are written as JSON's `\\u` escapes, which a JSON reader reads back as they were.

At the bottom floor (pyproject.toml's import layers) so the daemon side and the shell side use the
same rule; it imports the standard library alone. The ghost text's own gate is
calmd/suggest/filters.py `sendable`: a candidate that holds a control character is never sent.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# The characters no terminal may receive raw, as a regular-expression class (see the docstring).
_C0 = "\x00-\x1f"
_NOT_C0 = (
    "\x7f-\x9f"  # DEL, C1
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"  # Cf
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"  # Cf: zero-width, bidi
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"  # Cf
    "\U000e0001\U000e0020-\U000e007f"  # Cf: language tags (invisible ASCII)
    "\u2028\u2029"  # Zl, Zp: line and paragraph separators
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers: letters that draw nothing
    "\ud800-\udfff"  # surrogates: bytes that were not UTF-8
)
HIDDEN_CLASS = _C0 + _NOT_C0
HIDDEN = re.compile(f"[{HIDDEN_CLASS}]")
_HIDDEN_OR_BACKSLASH = re.compile(f"[\\\\{HIDDEN_CLASS}]")
# In JSON made by json.dumps or SQLite's json_object a C0 control is already an escape inside a
# string; one left raw is the document's own whitespace (an indent's newline).
_HIDDEN_IN_JSON = re.compile(f"[{_NOT_C0}]")

_NAMED = {"\x1b": "\\e", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}
_ESCAPES: dict[str, str] = {}  # each character's escape, made once


def _escape(ch: str) -> str:
    found = _ESCAPES.get(ch)
    if found is None:
        code = ord(ch)
        if ch in _NAMED:
            found = _NAMED[ch]
        elif code < 0x80:
            found = f"\\x{code:02x}"
        elif 0xDC80 <= code <= 0xDCFF:  # surrogateescape's byte
            found = f"\\x{code - 0xDC00:02x}"
        elif code <= 0xFFFF:
            found = f"\\u{code:04x}"
        else:
            found = f"\\U{code:08x}"
        if len(_ESCAPES) < 4096:
            _ESCAPES[ch] = found
    return found


def _escape_match(found: re.Match[str]) -> str:
    return _escape(found.group(0))


def hidden(text: str) -> bool:
    """Whether `text` holds a character `visible` escapes."""
    return HIDDEN.search(text) is not None


def visible(text: str, *, doubled: bool | None = None) -> str:
    """`text` safe to print: every HIDDEN character as its escape and, when it held one, each
    backslash doubled. `doubled` overrides that choice, for a part of a text drawn on its own (the
    part of a query before the cursor: `doubled=hidden(query)`)."""
    if doubled is None:
        # most lines are printable ASCII: two C loops over it, against the regular expression's
        # set lookups (four times slower: 0.5 s on the 100,000 lines of `calm history`)
        if (text.isascii() and text.isprintable()) or HIDDEN.search(text) is None:
            return text
        doubled = True
    return (_HIDDEN_OR_BACKSLASH if doubled else HIDDEN).sub(_escape_match, text)


def quoted(text: str) -> str:
    """`text` between single quotes, `visible`: a value of the user's quoted in a message (`%r`
    showed the byte 0xff of an argument as `'\\udcff'`, Python's name for it, not `'\\xff'`)."""
    return f"'{visible(text)}'"


def visible_value(value: object) -> str:
    """Any value as `visible` text (`None` as empty): for fields read from a file or a reply."""
    return visible("" if value is None else value if isinstance(value, str) else str(value))


def _json_escape(found: re.Match[str]) -> str:
    code = ord(found.group(0))
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character above the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_escaped(text: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False, SQLite's json_object) with the HIDDEN
    characters it left raw written as `\\u` escapes: the same document, safe to print."""
    if (text.isascii() and "\x7f" not in text) or _HIDDEN_IN_JSON.search(text) is None:
        return text
    return _HIDDEN_IN_JSON.sub(_json_escape, text)


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, infinities) replaced by None, in lists,
    tuples and dicts at any depth: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def json_text(value: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """`value` as JSON for a terminal or a pipe: always valid JSON (a non-finite number is written
    null, never `NaN`), readable characters as they are, the HIDDEN ones as `\\u` escapes."""
    options: dict[str, Any] = {"ensure_ascii": False, "allow_nan": False, "indent": indent}
    if compact:
        options["separators"] = (",", ":")
    try:
        text = json.dumps(value, **options)
    except ValueError:  # a NaN or an infinity somewhere: written null
        text = json.dumps(finite(value), **options)
    return json_escaped(text)
