"""A coloured terminal view of a token sequence, in the spirit of nanochat's visualize_tokenization.

Frame tokens (`<CWD>`, `<HIST>`, ...) are bold and coloured per frame; the bytes inside a frame take
the frame's colour; sub-tokens (`<EXIT>`, `<NEXT>`) and control tokens (`<BOS>`, `<ATN>`) stand out;
non-printable bytes show as escapes (`\\x07`, `\\n`: calmd/visible.py). Tokens the loss supervises
(everything after ATN) are underlined on a green background, so what the model learns to produce
is visible at a glance.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from rich.text import Text

from calmd.formats.tokenizer import BYTE_TOKENS, SPECIAL_NAMES, Special, validate_ids
from calmd.visible import visible

FRAME_STYLES: dict[int, str] = {
    Special.CWD: "cyan",
    Special.GIT: "magenta",
    Special.HIST: "yellow",
    Special.COMP: "blue",
    Special.ENV: "bright_cyan",
    Special.QUERY: "bright_magenta",
    Special.CMD: "bright_white",
}
CONTROL_STYLE = "bold red"
SUBTOKEN_STYLE = "bold bright_black"
SUPERVISED = " underline on dark_green"


def _byte_text(run: bytes) -> str:
    """Printable text for a run of bytes: valid UTF-8 shown as characters, the rest escaped as
    every view escapes what it prints (calmd/visible.py: `\\e`, `\\x07`, `\\u202e`, a byte that is
    not UTF-8 as `\\xff`)."""
    return visible(run.decode("utf-8", "surrogateescape"))


def render(ids: npt.ArrayLike, cmd_position: int | None = None) -> Text:
    """Rich Text for one sequence. `cmd_position` is the ATN index (CTDS); tokens after it are
    marked supervised. Without it the ATN is looked up in the sequence."""
    arr = validate_ids(ids)
    if cmd_position is None:
        where = np.flatnonzero(arr == Special.ATN)
        cmd_position = int(where[0]) if where.size else arr.size
    text = Text()
    frame_style = ""
    i = 0
    while i < arr.size:
        tok = int(arr[i])
        supervised = SUPERVISED if i > cmd_position else ""
        if tok < BYTE_TOKENS:
            j = i
            # A run of bytes on the same side of ATN renders as one piece (keeps UTF-8 whole).
            while j < arr.size and arr[j] < BYTE_TOKENS and (j > cmd_position) == (i > cmd_position):
                j += 1
            text.append(
                _byte_text(arr[i:j].astype(np.uint8).tobytes()), style=(frame_style or "white") + supervised
            )
            i = j
            continue
        name = f"<{SPECIAL_NAMES[tok]}>"
        if tok in FRAME_STYLES:
            frame_style = FRAME_STYLES[tok]
            text.append(name, style="bold " + frame_style + supervised)
        elif tok == Special.END:
            text.append(name, style="bold " + (frame_style or "white") + supervised)
            text.append("\n")
            frame_style = ""
        elif tok in (Special.EXIT, Special.NEXT, Special.POS, Special.NOTE, Special.IPA, Special.BY):
            text.append(name, style=SUBTOKEN_STYLE + supervised)
        else:
            text.append(name, style=CONTROL_STYLE + supervised)
            if tok == Special.BOS:
                text.append("\n")
            if tok == Special.ATN:
                text.append("\n")
        i += 1
    return text


def legend() -> Text:
    text = Text("legend: ")
    for tok, style in FRAME_STYLES.items():
        text.append(f"<{SPECIAL_NAMES[tok]}> ", style="bold " + style)
    text.append("control ", style=CONTROL_STYLE)
    text.append("sub-token ", style=SUBTOKEN_STYLE)
    text.append("supervised by the loss", style="white" + SUPERVISED)
    return text
