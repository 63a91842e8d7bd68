"""What `calm search` draws (calmd/shell/search_ui.py): text measured in terminal cells, and the
screen (the alternate screen of the controlling terminal, in raw mode, restored on every way out).
Every text drawn passes calmd/visible.py first."""

from __future__ import annotations

import math
import os
import termios
import unicodedata
from typing import TYPE_CHECKING, Any

from calmd.visible import hidden, visible

if TYPE_CHECKING:
    from calmd.shell.search_ui import State

KEYS = "Enter run · Tab edit · Esc cancel · Ctrl-R mode · Ctrl-D delete"
MODE_NAMES = {"global": "all", "host": "this machine", "folder": "this folder", "session": "this session",
              "success": "succeeded"}  # fmt: skip


# --------------------------------------------------------------------------- text on a terminal


def cells(ch: str) -> int:
    """Terminal cells a character takes: 2 for wide East Asian ones, 0 for combining marks."""
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def clip(text: str, width: int) -> str:
    """The start of `text` that fits in `width` cells (`…` ends it when cut)."""
    if sum(cells(c) for c in text) <= width:
        return text
    if width <= 0:
        return ""
    out, total = [], 0
    for ch in text:
        if total + cells(ch) > width - 1:  # the last cell is the `…`
            break
        out.append(ch)
        total += cells(ch)
    return "".join(out) + "…"


def clip_left(text: str, width: int) -> str:
    """The end of `text` that fits in `width` cells (`…` starts it when cut): for folders."""
    if sum(cells(c) for c in text) <= width:
        return text
    out, total = [], 1
    for ch in reversed(text):
        total += cells(ch)
        if total > width:
            break
        out.append(ch)
    return "…" + "".join(reversed(out))


def ago(ts: float, now: float) -> str:
    """How long ago, in a few characters: `now`, `42s`, `5m`, `3h`, `2d`, `6w`, `4mo`, `2y`."""
    s = max(0.0, now - ts)
    for limit, unit, label in ((60, 1, "s"), (3600, 60, "m"), (86400, 3600, "h"), (14 * 86400, 86400, "d"),
                               (60 * 86400, 7 * 86400, "w"), (730 * 86400, 30 * 86400, "mo")):  # fmt: skip
        if s < limit:
            return "now" if label == "s" and s < 1 else f"{int(s // unit)}{label}"
    return f"{int(s // (365 * 86400))}y"


def home_short(path: str, home: str) -> str:
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path


def highlight_spans(text: str, query: str) -> list[tuple[int, int]]:
    """Where the query's terms occur in `text` as typed (first occurrence each, any case)."""
    lowered = text.lower()
    spans = []
    for term in query.lower().split():
        at = lowered.find(term)
        if at >= 0:
            spans.append((at, at + len(term)))
    return spans


# --------------------------------------------------------------------------- drawing


class Screen:
    """The alternate screen of the controlling terminal, raw mode, restored on every way out."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved = termios.tcgetattr(fd)
        self.color = not os.environ.get("NO_COLOR")

    def __enter__(self) -> Screen:
        mode = termios.tcgetattr(self.fd)
        mode[0] &= ~(termios.ICRNL | termios.IXON | termios.INLCR | termios.IGNCR)  # iflag
        mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)  # lflag
        mode[6][termios.VMIN], mode[6][termios.VTIME] = 1, 0
        termios.tcsetattr(self.fd, termios.TCSADRAIN, mode)
        self.write("\x1b[?1049h\x1b[H\x1b[2J")  # the alternate screen, cleared
        return self

    def __exit__(self, *exc: object) -> None:
        self.write("\x1b[0m\x1b[?25h\x1b[?1049l")  # the shell's screen as it was
        termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(self.fd, data) :]

    def size(self) -> tuple[int, int]:
        try:
            columns, lines = os.get_terminal_size(self.fd)
        except OSError:
            columns, lines = 80, 24
        return max(columns, 20), max(lines, 4)

    def style(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def draw(self, state: State, now: float, home: str) -> None:
        width, height = self.size()
        rows = height - 3
        out = ["\x1b[?25l\x1b[H"]
        mode = visible(MODE_NAMES.get(state.mode, state.mode))  # the header, as every drawn text
        count = f"{state.matches} match{'es' * (state.matches != 1)}" + (" …" if state.waiting else "")
        head = f" calm search · {mode}"
        gap = " " * max(1, width - len(head) - len(count) - 1)
        out.append(self.style("2", clip(head + gap + count, width)))
        out.append("\x1b[K\r\n")
        prompt = "> "
        shown_query = visible(state.query)
        out.append(self.style("1", prompt) + clip(shown_query, width - len(prompt) - 1) + "\x1b[K\r\n")
        for row in range(rows):
            k = state.top + row
            if k < len(state.results):
                selected = k == state.selected
                out.append(self._result_line(state.results[k], selected, state.query, width, now, home))
            out.append("\x1b[K\r\n")
        status = state.status or KEYS
        out.append(self.style("2" if not state.status else "1", clip(status, width - 1)) + "\x1b[K")
        before = visible(state.query[: state.cursor], doubled=hidden(state.query))  # as drawn above
        cursor = len(prompt) + sum(cells(c) for c in before) + 1
        out.append(f"\x1b[2;{min(cursor, width)}H\x1b[?25h")
        self.write("".join(out))

    def _result_line(self, result: dict[str, Any], selected: bool, query: str, width: int, now: float,
                     home: str) -> str:  # fmt: skip
        ts = result.get("ts")
        when = ago(float(ts), now) if isinstance(ts, int | float) and 0 < ts < math.inf else "?"
        where = clip_left(visible(home_short(str(result.get("cwd") or ""), home)), 20)
        code = result.get("exit")
        failed = isinstance(code, int) and code != 0
        mark = f"✗{code}" if failed else ""
        prefix_plain = f"{'▶' if selected else ' '} {when:>4}  {where:<20}  {mark:<4} "
        room = width - sum(cells(c) for c in prefix_plain) - 1
        text = clip(visible(str(result.get("cmd", ""))), room)
        body = self._highlighted(text, query, selected)
        prefix = (f"{'▶' if selected else ' '} " + self.style("2", f"{when:>4}  {where:<20}") + "  "
                  + self.style("31", f"{mark:<4}") + " ")  # fmt: skip
        if selected and self.color:
            return "\x1b[7m" + prefix_plain + text + "\x1b[0m"
        return prefix + body if self.color else prefix_plain + text

    def _highlighted(self, text: str, query: str, selected: bool) -> str:
        if not self.color or selected:
            return text
        marks = [False] * len(text)
        for start, end in highlight_spans(text, query):
            for i in range(start, min(end, len(text))):
                marks[i] = True
        out, i = [], 0
        while i < len(text):
            j = i
            while j < len(text) and marks[j] == marks[i]:
                j += 1
            out.append(self.style("1;4", text[i:j]) if marks[i] else text[i:j])
            i = j
        return "".join(out)
