"""Times as the views read and show them: `--since`/`--until` from the command line
(`parse_when`), and a stored time as local text (`local_time`), or as unknown when it is not one
(`known_ts`; its twin in SQL, KNOWN_TS_SQL, for the lines SQLite makes).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re

from calmd.errors import CalmError
from calmd.history.recorded import valid_time
from calmd.protocol import TS_MAX
from calmd.visible import quoted

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hour|hours|d|day|days|w|week|weeks)\s*(?:ago)?\Z")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400,
          "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}  # fmt: skip


def parse_when(text: str, now: float) -> float:
    """A point in time from the command line, as seconds since the epoch: `30m`, `2h`, `3d`,
    `1w` (that long ago), `today`, `yesterday`, a local date or time in ISO form (`2025-11-24`,
    `2025-11-24 13:00`), or seconds since the epoch. CalmError names what is accepted."""
    value = text.strip().lower()
    match = _RELATIVE.match(value)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    midnight = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if value == "today":
        return midnight.timestamp()
    if value == "yesterday":
        return (midnight - dt.timedelta(days=1)).timestamp()
    if re.fullmatch(r"\d{9,11}(\.\d+)?", value):
        return float(value)
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise CalmError(
            f"{quoted(text)} is not a time: give e.g. 30m, 2h, 3d, 1w (ago), today, yesterday, "
            "2025-11-24, '2025-11-24 13:00' or seconds since the epoch"
        ) from None


# The times a view shows are the times a command can have run at: a number from 1970 to 2100
# (protocol.TS_MAX), the range every time is held to where it enters (`record`, the imports:
# recorded.valid_time). Anything else in `ts` (an older calmd's store not yet opened for writing,
# which repairs it; a hand-made one: NULL, text, an infinity, 1e300, a time before 1970 or after
# 2100) is shown as unknown, left out of `calm stats`'s times, never selected by --since or
# --until, and never raises: datetime cannot hold some of them, and a view must still show the rest.
# The one rule: `known_ts` here, KNOWN_TS_SQL for the lines SQLite makes.
UNKNOWN_TIME = "unknown time"
KNOWN_TS_SQL = f"typeof(ts) IN ('integer', 'real') AND ts BETWEEN 0 AND {TS_MAX:.0f}"  # known_ts in SQL


def known_ts(ts: object) -> float | None:
    """`ts` when it is a time a view can show (a number recorded.valid_time takes), else None."""
    if isinstance(ts, int | float) and valid_time(ts):  # NaN fails both comparisons
        return float(ts)
    return None


def iso_time(ts: float) -> str:
    """`2025-11-24T13:02:11`, local time (the JSON views' `time`)."""
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=4096)
def minute_text(minute: int) -> str:
    """`2025-11-24 13:02`, local time, of the `minute`-th minute since the epoch (kept: few differ)."""
    return dt.datetime.fromtimestamp(minute * 60).strftime("%Y-%m-%d %H:%M")


def local_time(ts: object) -> str:
    """`2025-11-24 13:02:11`, local time; `unknown time` when `ts` is not one (`known_ts`). The
    minute's text is kept (every time zone's offset is whole minutes): a history of 100,000 lines
    formats a few thousand minutes, not 100,000 times."""
    known = known_ts(ts)
    if known is None:
        return UNKNOWN_TIME
    whole = math.floor(known)
    return f"{minute_text(whole // 60)}:{whole % 60:02d}"
