"""`calmd status` as a table: the daemon's status reply (server.status()) rendered for a person.

The reply carries text the daemon read from files (ranker.json's name, a weights path, a refused
history file's name, a training run's reason; sync's folder, the hosts' names, a refused
segment's name and why): each cell is `visible` (calmd/visible.py) and given to rich as Text,
never as markup. The sync cell is several lines, each made `visible` by `calm sync`'s own
status_lines."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table
from rich.text import Text

from calmd.cli.sync import status_lines
from calmd.visible import visible


def status_table(status: dict[str, Any]) -> Table:
    """The status reply as rows of a rich Table (`calmd status --json` prints the reply itself)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    model = status.get("model") or {}
    lat = status["latency_ms"]
    hist = status["history"]
    model_path = str(model.get("path", "-"))
    if status.get("serving_fallback"):
        yours = status.get("weights_path", "your weights")
        why = "did not load" if status.get("last_reload_error") else "does not exist yet"
        if status.get("rolled_back") and not status.get("last_reload_error"):
            why = "was rolled back: `calm rollback` again brings it back from shell.prev.cwgt"
        model_path += f" (the packaged model: {yours} {why})"
    table = Table(title="calmd status", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("model", model_path),
        ("size", f"{model.get('size', '-')} ({model.get('parameters', 0):,} parameters)"),
        ("domain", str(model.get("domain", "-"))),
        ("ranking", f"{model.get('ranker', '-')}; {model.get('indexed_commands', 0)} commands indexed"),
        ("loaded at", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["loaded_at"]))
         if status.get("loaded_at") else "-"),
        ("last reload error", status.get("last_reload_error") or "none"),
        ("requests served", f"{status['requests']} ({status['errors']} errors)"),
        ("first line", _percentiles(lat, "first")),  # early or candidate: what a shell draws
        ("done", _percentiles(lat, "done")),
        ("history", f"{hist['commands']} commands, {hist['dropped_secrets']} dropped as credentials, "
                    f"{hist['since_last_training']} since last training"),
        ("import", _import_line(hist.get("import") or {})),
        ("search", _search_line(status.get("search") or {})),
        ("sync", status_lines(status.get("sync") or {"enabled": False})),  # lines, each visible
        ("training", _training_line(status.get("training") or {})),
        ("disk", _disk_line(status.get("disk") or {})),
        ("uptime", f"{status['uptime_s']:.0f} s"),
        ("version / protocol", f"{status['version']} / {status['protocol']}"),
        ("socket", status.get("socket", "-")),
    ]  # fmt: skip
    for name, value in rows:
        shown = "\n".join(value) if isinstance(value, list) else visible(str(value))
        table.add_row(name, Text(shown))
    return table


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _disk_line(disk: dict[str, object]) -> str:
    """Free space of the data dir's file system, and when a write last found it full."""
    free, total, last = disk.get("free_bytes"), disk.get("total_bytes"), disk.get("last_full")
    parts = ["free space unknown"]
    if isinstance(free, int | float) and isinstance(total, int | float):
        parts = [f"{_bytes(free)} free of {_bytes(total)}"]
    if isinstance(last, int | float):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last))
        parts.append(f"last full at {stamp} (what could not be written was refused, nothing half-written)")
    else:
        parts.append("not full since the daemon started")
    return f"{disk.get('path', '-')}: " + "; ".join(parts)


def _training_line(training: dict[str, object]) -> str:
    """State, progress while running (step of total, time left), the last run's result (held-out
    loss before and after, swapped in or not, why), and what the next automatic run waits for."""
    parts = [str(training.get("state", "-"))]
    if training.get("pid"):
        parts[0] += f" (pid {training['pid']})"
    progress = training.get("progress")
    if training.get("pid") and isinstance(progress, dict) and "step" in progress:
        parts.append(progress_words(progress))
    last = training.get("last_result")
    if isinstance(last, dict) and last.get("reason"):
        when = last.get("finished")
        stamp = ""
        if isinstance(when, int | float):
            stamp = " " + time.strftime("%Y-%m-%d %H:%M", time.localtime(float(when)))
        parts.append(f"last run{stamp}: {last['reason']}")  # before -> after, and why
    threshold, pending = training.get("threshold"), training.get("pending")
    if training.get("waiting"):
        parts.append(f"due ({pending} new commands), waiting: {training['waiting']}")
    elif threshold and not training.get("pid"):
        so_far = f" ({pending} so far)" if pending is not None else ""
        parts.append(f"next after {threshold} new commands{so_far}")
    elif not threshold:
        parts.append("runs only on request (`calmd train`)")
    return "; ".join(parts)


def progress_words(progress: dict[str, object]) -> str:
    """`step 12/74, loss 0.847, about 40 s left` (`calmd status`, `calmd train`)."""
    total = progress.get("total_steps")
    text = f"step {progress.get('step')}" + (f"/{total}" if total else "")
    text += f", loss {float(progress.get('loss') or 0):.3f}"  # type: ignore[arg-type]
    eta = progress.get("eta_s")
    if isinstance(eta, int | float):
        text += f", about {_duration(float(eta))} left"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _search_line(search: dict[str, Any]) -> str:
    """The history search (Ctrl-R): its index, and what it answered."""
    if not search.get("ready"):
        return "index being built"
    last = search.get("last_ms")
    timing = f", the last {last:.1f} ms" if last is not None else ""
    indexed = f"{search.get('commands', 0):,} commands ({search.get('distinct', 0):,} distinct) indexed"
    return f"{indexed}; {search.get('searches', 0)} searches{timing}; {search.get('forgotten', 0)} forgotten"


def _import_line(imported: dict[str, Any]) -> str:
    """The first start's import, and the history files imports refused or could not read."""
    parts = ["importing ~/.bash_history and ~/.zsh_history" if imported.get("running") else "idle"]
    refused, failures = imported.get("refused") or 0, imported.get("failures") or 0
    if refused:
        last = f" (last: {imported['last_refused']})" if imported.get("last_refused") else ""
        parts.append(f"{refused} file{'s' * (refused != 1)} refused as not a shell history{last}")
    if failures:
        parts.append(f"{failures} could not be read (the daemon's log says which)")
    bad_times = imported.get("bad_times") or 0
    if bad_times:
        plural = "s" * (bad_times != 1)
        parts.append(f"{bad_times} imported command{plural} had an impossible time (kept without it)")
    damaged = imported.get("damaged") or 0
    if damaged:
        plural = "y was" if damaged == 1 else "ies were"
        parts.append(f"{damaged} entr{plural} damaged by NUL bytes, as a crash leaves them (skipped)")
    return "; ".join(parts)


def _percentiles(lat: dict[str, Any], what: str) -> str:
    """p50, p90 (a daemon from before it has none) and p99 of one of `latency_ms`'s figures."""
    ms = lambda v: "-" if v is None else f"{v:.1f} ms"  # noqa: E731
    return ", ".join(f"p{q} {ms(lat.get(f'{what}_p{q}'))}" for q in (50, 90, 99) if f"{what}_p{q}" in lat)
