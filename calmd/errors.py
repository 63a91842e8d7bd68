"""Typed errors for untrusted input.

Programmer mistakes are `assert`ed; anything that comes from a file, a user or a socket raises one
of these, with a message that names the file, the field or the line that is wrong.

`one_line` is how every tool prints an error (`calm`, `calmd`, `python -m calmd....`, bench/):
`PROG: error: FILE: what`, one line (calmd/arguments.py's `run_tool` prints it).
"""

from __future__ import annotations

import os

from calmd.visible import visible


class CalmError(Exception):
    """Base of every error calmd raises on purpose."""


class FormatError(CalmError, ValueError):
    """A file (CTDS, CWGT, training source) does not follow its format.

    `path` and `field` say where; the message already includes both.
    """

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        self.path = path
        self.field = field
        where = ": ".join(part for part in (path, field) if part)
        super().__init__(f"{where}: {message}" if where else message)


class TokenError(CalmError, ValueError):
    """A token id outside the 320-id vocabulary, or a special token where bytes were expected."""


class TemplateError(CalmError, ValueError):
    """A template spec or a context that does not fit its template."""


class SequenceTooLong(TemplateError):
    """A training sequence whose command alone does not fit in l_max."""


class DiskFull(CalmError, OSError):
    """The file system holding CALM_HOME is full: nothing was written (the daemon answers
    `disk_full`, and `calmd status` says so)."""


def one_line(exc: BaseException, *, named: bool = True) -> str:
    """The error as one line: an OSError as `FILE: what` (its own text is `[Errno 2] No such file
    or directory: 'FILE'`, Python's words for a programmer), anything else as its message, whose
    FormatError or CalmError already names the file and field. `named=False` leaves an OSError's
    file out, for a message that names it already (`FILE: cannot read the key: what`). What it
    quotes (a file name, a value) is `visible`: an error never drives the terminal."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, CalmError):
        # os.rename and the like name two files; for a folder in the way, the second is the one
        where = exc.filename2 if isinstance(exc, IsADirectoryError) and exc.filename2 else exc.filename
        if isinstance(where, bytes):  # a path given as bytes: its name, not b'...'
            where = os.fsdecode(where)
        text = f"{where}: {exc.strerror}" if where and named else exc.strerror
        return visible(" ".join(text.split()))
    return visible(" ".join(str(exc).split())) or type(exc).__name__
