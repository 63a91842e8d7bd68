"""Typed errors for untrusted input.

Programmer mistakes are `assert`ed; anything that comes from a file, a user or a socket raises one
of these, with a message that names the file, the field or the line that is wrong.
"""

from __future__ import annotations


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
