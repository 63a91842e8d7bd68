"""What a record is made of before the store takes it, for every way in (the hooks, imports,
sync): its text as SQLite can store it (`clean_text`), a time a command can have run at
(`valid_time`), and what it carries besides its command line, the ENV text and the COMP items of
the context it was typed in (the store keeps them for the datasets, calmd/suggest/frames.py
builds them for the model), cleaned and bounded here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from calmd.protocol import TS_MAX
from calmd.secrets import find_secret

COMP_ITEMS = 6  # items per COMP frame: each costs ~8 tokens of prefill per keystroke (the spec caps 15)
ENV_MAX_BYTES = 64
_GENERIC_VENV = frozenset({".venv", "venv", "env", ".env", "virtualenv", ".virtualenv"})
VERDICT_CACHE = 100_000  # distinct commands whose check an import (or a sync) remembers


def short_env(virtual_env: str = "", conda_env: str = "") -> str:
    """The ENV frame's text: `venv:NAME` for an active virtualenv (NAME its directory, or the
    project's for a generic `.venv`), `conda:NAME` for a conda env other than `base`, joined by a
    space; empty when neither is active."""
    parts: list[str] = []
    venv = virtual_env.rstrip("/")
    if venv:
        head, name = os.path.split(venv)
        if name in _GENERIC_VENV and os.path.basename(head):
            name = os.path.basename(head)
        parts.append(f"venv:{name}")
    if conda_env and conda_env != "base":
        parts.append(f"conda:{os.path.basename(conda_env.rstrip('/'))}")
    return clean_env(" ".join(parts))


def clean_env(env: str) -> str:
    """An ENV value as stored and framed: one line, at most `ENV_MAX_BYTES`, never a credential."""
    env = " ".join(env.split())
    env = env.encode("utf-8", "surrogatepass")[:ENV_MAX_BYTES].decode("utf-8", "ignore")
    return "" if not env or find_secret(env) is not None else env


def valid_time(ts: float | None) -> bool:
    """Whether `ts` is a time a command can have run at: seconds since the epoch from 1970 to 2100
    (protocol.TS_MAX). A negative, infinite or NaN time is not, nor one read from a digit string
    too long to be a time (`#999999999999` is the year 33658): an import keeps such a command
    without its time (`ImportResult.bad_times`), as sync keeps such a record from another machine
    (calmd/sync/ `parse_record`, `sync_bad_times`)."""
    return ts is not None and 0.0 <= ts <= TS_MAX


def comp_items(text: str) -> tuple[str, ...]:
    """The stored COMP column: items separated by newlines (a name with a newline is never stored)."""
    return tuple(text.split("\n")) if text else ()


def comp_text(items: Sequence[str]) -> str:
    """What is stored of a COMP frame: at most COMP_ITEMS items, none with a newline, none flagged as
    a credential. Only these few matching names are kept, never the directory listing."""
    kept = [i for i in items if i and "\n" not in i and find_secret(i) is None][:COMP_ITEMS]
    return "\n".join(clean_text(i)[0] for i in kept)


@dataclass(frozen=True)
class RecordResult:
    stored: bool
    reason: str = ""  # why not: "empty", "leading-space", "secret:<rule>"


def clean_text(text: str) -> tuple[str, bool]:
    """`text` as SQLite can store it: lone surrogates (undecodable bytes kept by surrogateescape)
    and NULs become U+FFFD. Returns (text, whether anything was replaced)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape" if _only_escapes(text) else "surrogatepass").decode(
            "utf-8", "replace"
        )
        return text.replace("\0", "\ufffd"), True
    if "\0" in text:
        return text.replace("\0", "\ufffd"), True
    return text, False


def _only_escapes(text: str) -> bool:
    """Whether every surrogate in `text` is a surrogateescape'd byte (U+DC80-U+DCFF)."""
    return all(not ("\ud800" <= c <= "\udfff") or "\udc80" <= c <= "\udcff" for c in text)
