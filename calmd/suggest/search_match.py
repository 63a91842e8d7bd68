"""The history search's matching: which commands a query finds, and how each was found (the
features of the match that the search's ranking reads: calmd/suggest/search.py).

Matching. The query is cut into terms at whitespace; a command matches when every term is found
in it, in any order, ignoring case: as typed (a substring), or else as its letters in order with
others between them (`gco` in `git checkout`: the fuzzy match of fzf and atuin). All distinct
commands are one lowercased byte string, one per line; for each byte value the index keeps where
it occurs, so a term is found with a few vectorised steps over those positions (numpy), never a
loop over commands: the first letter's positions, narrowed by the next letters (substrings), or a
binary search per line for each next letter after the previous one (scattered letters). A
keystroke on 100,000 commands costs a few milliseconds (bench/search_latency.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_TERMS = 16  # terms of a query looked at (the protocol caps the query at 1,024 bytes)
MAX_TERM_BYTES = 256
# A term found right after one of these starts a word: `pu` in `git push`, `log` in `/var/log`.
WORD_SEPARATORS = frozenset(b" \n/\\-_.=:,;'\"`()[]{}|&<>@+")


class Column:
    """A numpy array that grows by doubling: appends cost O(1), `view` no copy."""

    def __init__(self, dtype: Any, fill: Any = 0, capacity: int = 1024) -> None:
        self.fill = fill
        self.data = np.full(capacity, fill, dtype=dtype)
        self.n = 0

    def append(self, value: Any) -> None:
        if self.n == len(self.data):
            bigger = np.full(2 * len(self.data), self.fill, dtype=self.data.dtype)
            bigger[: self.n] = self.data
            self.data = bigger
        self.data[self.n] = value
        self.n += 1

    def view(self) -> np.ndarray:
        return self.data[: self.n]


def parse_query(text: str) -> list[bytes]:
    """The terms of a query, lowercased UTF-8 (the matching is by bytes; the first MAX_TERMS)."""
    terms = [t.lower().encode("utf-8", "replace")[:MAX_TERM_BYTES] for t in text.split()]
    return [t for t in terms if t][:MAX_TERMS]


@dataclass
class Matches:
    """The commands a query matched (distinct ids, ascending) and how each matched."""

    ids: np.ndarray  # int64
    substrings: np.ndarray  # float: share of terms found as typed
    word_starts: np.ndarray  # float: share of terms found as typed at a word start
    prefix: np.ndarray  # bool
    first_word: np.ndarray  # bool
    gap: np.ndarray  # float: letters skipped by the terms found scattered

    @staticmethod
    def everything(ids: np.ndarray) -> Matches:
        zeros = np.zeros(len(ids))
        no = np.zeros(len(ids), dtype=bool)
        return Matches(ids, zeros, zeros, no, no, zeros)


class _Byte:
    """Where one byte value occurs in the text: positions (ascending) and the line of each."""

    def __init__(self, positions: np.ndarray, lines: np.ndarray) -> None:
        self.positions = positions
        self.lines = lines
        self._first: tuple[np.ndarray, np.ndarray] | None = None

    def first(self) -> tuple[np.ndarray, np.ndarray]:
        """(lines holding the byte, ascending; the position of its first occurrence in each)."""
        if self._first is None:
            head = _firsts(self.lines)
            self._first = self.lines[head], self.positions[head]
        return self._first


def _firsts(values: np.ndarray) -> np.ndarray:
    """Positions where a non-decreasing array takes a new value (its first occurrence)."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))


class CommandText:
    """The distinct commands as one lowercased byte string, one per line, with where each byte
    value occurs (rebuilt after new commands, a counting sort of the bytes: tens of ms on
    100,000 commands, done by `prepare` before a search needs it)."""

    def __init__(self) -> None:
        self.blob = bytearray(b"\n")  # every line starts after a newline: "start of a word" holds there
        self.starts = Column(np.int64)
        self.ends = Column(np.int64)
        self._arrays: tuple[np.ndarray, list[_Byte]] | None = None
        self.separators = np.zeros(256, dtype=bool)
        self.separators[list(WORD_SEPARATORS)] = True

    def add(self, text: str) -> None:
        line = text.lower().encode("utf-8", "replace").replace(b"\n", b" ")
        self.starts.append(len(self.blob))
        self.blob += line
        self.ends.append(len(self.blob))
        self.blob += b"\n"
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, list[_Byte]]:
        """(the bytes, padded so that a term read past the end meets zeros; per byte value,
        where it occurs)."""
        if self._arrays is None:
            data = np.frombuffer(bytes(self.blob) + bytes(MAX_TERM_BYTES + 1), dtype=np.uint8)
            used = data[: len(self.blob)]
            small = np.int32 if len(used) < 1 << 31 else np.int64
            order = np.argsort(used, kind="stable").astype(small)
            marks = np.zeros(len(used), dtype=small)
            marks[self.starts.view()] = 1
            line_at = np.cumsum(marks, dtype=small) - 1  # each position's line (-1: the first newline)
            edges = np.concatenate([[0], np.cumsum(np.bincount(used, minlength=256))])
            by_byte = []
            for b in range(256):
                positions = order[edges[b] : edges[b + 1]]
                by_byte.append(_Byte(positions, line_at[positions]))
            self._arrays = data, by_byte
        return self._arrays

    def find(self, term: bytes, alive: np.ndarray, first: bool) -> tuple[np.ndarray, ...]:
        """Where `term` matches among the lines `alive` (bool per line): (lines found as typed,
        of those at a word start, at the line's start, as the line's first word; lines found
        scattered, with the letters skipped)."""
        data, by_byte = self.arrays()
        # as typed: the positions of the term's rarest byte, checked for the other bytes around
        anchor = min(range(len(term)), key=lambda j: len(by_byte[term[j]].positions))
        where = by_byte[term[anchor]]
        keep = alive[where.lines]
        pos = where.positions[keep].astype(np.int64) - anchor
        lines = where.lines[keep].astype(np.int64)
        ok = pos >= 0
        pos, lines = pos[ok], lines[ok]
        for j in range(len(term)):
            if j != anchor:
                ok = data[pos + j] == term[j]
                pos, lines = pos[ok], lines[ok]
        typed = lines[_firsts(lines)]
        at_word = self.separators[data[pos - 1]]
        word = lines[at_word]
        word = word[_firsts(word)]
        no = np.zeros(0, dtype=np.int64)
        prefix = whole = no
        if first:
            at_start = pos == self.starts.view()[lines]
            prefix = lines[at_start]  # one start per line: already distinct
            after = data[pos[at_start] + len(term)]
            whole = prefix[(after == ord(" ")) | (after == ord("\n"))]
        if len(term) == 1:
            return typed, word, prefix, whole, no, np.zeros(0)
        # scattered: from each remaining line's first occurrence of the first letter, each next
        # letter's first occurrence after the previous one, within the line
        rest = alive.copy()
        rest[typed] = False
        first_lines, first_pos = by_byte[term[0]].first()
        chosen = rest[first_lines]
        lines, cur = first_lines[chosen].astype(np.int64), first_pos[chosen].astype(np.int64)
        begin = cur
        ends = self.ends.view()[lines]
        for byte in term[1:]:
            after_pos = by_byte[byte].positions
            if len(after_pos) == 0:
                return typed, word, prefix, whole, no, np.zeros(0)
            k = np.searchsorted(after_pos, cur, side="right")
            nxt = after_pos[np.minimum(k, len(after_pos) - 1)].astype(np.int64)
            ok = (k < len(after_pos)) & (nxt < ends)
            lines, cur, begin, ends = lines[ok], nxt[ok], begin[ok], ends[ok]
        return typed, word, prefix, whole, lines, (cur - begin + 1 - len(term)).astype(np.float64)

    def match(self, terms: Sequence[bytes], alive: np.ndarray) -> Matches:
        """The lines of `alive` that every term matches, with how they matched."""
        n = len(alive)
        if not terms:
            return Matches.everything(np.flatnonzero(alive))
        alive = alive.copy()
        substrings = np.zeros(n)
        word_starts = np.zeros(n)
        gap = np.zeros(n)
        prefix = whole = np.zeros(0, dtype=np.int64)
        for i, term in enumerate(terms):
            typed, word, p, w, scattered, skipped = self.find(term, alive, i == 0)
            if i == 0:
                prefix, whole = p, w
            hit = np.zeros(n, dtype=bool)
            hit[typed] = True
            hit[scattered] = True
            substrings[typed] += 1
            word_starts[word] += 1
            gap[scattered] += skipped
            alive &= hit
        ids = np.flatnonzero(alive)
        flags = np.zeros(n, dtype=bool)
        flags[prefix] = True
        is_prefix = flags[ids]
        flags[:] = False
        flags[whole] = True
        return Matches(ids, substrings[ids] / len(terms), word_starts[ids] / len(terms), is_prefix,
                       flags[ids], gap[ids])  # fmt: skip
