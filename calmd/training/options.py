"""Options of the training commands that the CLI's parsers read before any handler runs.

Kept apart from calmd/training/datasets.py so that building `calm`'s parser imports no numpy:
the shell hooks run the CLI at every prompt (docs/performance.md, startup).
"""

from __future__ import annotations

from dataclasses import dataclass

from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.frames import COMP_ITEMS


@dataclass(frozen=True)
class DatasetOptions:
    """`calm dataset` options for the shell-history path (docs/training.md)."""

    max_entries: int = 0  # latest N history entries; 0: all
    hist_frames: int = HISTORY_FRAMES
    comp_frames: int = COMP_ITEMS  # COMP items per example (what the daemon serves; 0: none)
    max_dup: int = 3  # a distinct command is a target at most this many times (its latest uses)
    min_cmd_len: int = 2
    include_failed: bool = False
    include_trivial: bool = False
