"""What `calm replay` prints (calmd/quality/replay.py): the table of every system's figures, the
screen the word-by-word user saw, the ceiling, calmd's ghosts, and with training the learning
curve; the JSON written as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calmd.quality.systems import PACKAGED_SYSTEM
from calmd.quality.tally import KS


def format_table(result: dict[str, Any]) -> str:
    """Top-1 per k and top-5 at k = 0; keystrokes saved by the whole-line and the word-by-word
    user, first with every system's top suggestion whatever its confidence, then with only what
    the shell draws (calmd: its ghost rule; the baselines draw theirs always); then the ceiling,
    each calmd system's top-1 as a share of it, and what calmd's ghosts did."""
    head = f"{'system':<36}" + "".join(f"{'k=' + str(k):>7}" for k in KS)
    lines = [head + f"{'top5':>7}{'line':>7}{'word':>7}{'drawn:':>8}{'line':>6}{'word':>7}{'ms p50/p99':>14}"]

    def pct(v: float | None, width: int = 6) -> str:
        return f"{(v or 0) * 100:>{width}.1f}%"

    for system, t in result["totals"].items():
        top1 = "".join(pct(t["top1"][k]) for k in KS)
        saved = pct(t.get("keystrokes_saved_lines")) + pct(t.get("keystrokes_saved_words"))
        drawn = " " * 8 + pct(t.get("keystrokes_saved_lines_drawn"), 5)
        drawn += pct(t.get("keystrokes_saved_words_drawn"))
        ms = t.get("latency_ms")
        timing = f"{ms['done_p50']:>7.1f}/{ms['done_p99']:<6.1f}" if ms else ""
        lines.append(f"{system:<36}{top1}{pct(t['top5'][0])}{saved}{drawn}{timing}")
    lines.append("")
    lines.append(f"{'the screen, drawn ghosts word by word':<36}{'keys saved':>11}{'ghost drawn':>13}"
                 f"{'wrong of drawn':>16}{'states wrong':>14}")  # fmt: skip
    for system, t in result["totals"].items():
        sc = t.get("screen") or {}
        if not sc.get("states"):
            continue
        shares = pct(sc["drawn_share"], 12) + pct(sc["wrong_of_drawn"], 15) + pct(sc["wrong_share"], 13)
        lines.append(f"{system:<36}{pct(t.get('keystrokes_saved_words_drawn'), 10)}{shares}")
    lines.append("")
    # the same for every system: the share of queries whose command had been run before
    first = next(iter(result["totals"].values()))
    seen = first["seen_before"]
    lines.append(f"{'(ceiling) run before':<36}" + "".join(pct(seen[k]) for k in KS))
    for system, t in result["totals"].items():
        if system.startswith("calmd"):
            share = "".join(pct(t["top1"][k] / seen[k] if seen[k] else None) for k in KS)
            lines.append(f"{(system + ' top-1 / ceiling'):<36}{share}")
    ours = result["totals"].get("calmd") or next(
        (t for s, t in result["totals"].items() if s.startswith("calmd")), None
    )
    if ours is not None and "coverage" in ours:
        for name, key in (("calmd ghost drawn (coverage)", "coverage"),
                          ("calmd ghost right (precision)", "precision")):  # fmt: skip
            lines.append(f"{name:<36}" + "".join(pct(ours[key][k]) for k in KS))
        g = ours["ghosts"]
        lines.append(
            f"calmd ghosts while typing out: {g['requests']} requests, {g['early_drawn']} early lines drawn, "
            f"{g['replaced']} replaced within the keystroke ({g['replaced_share'] * 100:.1f}% of requests; "
            f"the new line was the command {g['replaced_by_the_command']} times, the old one "
            f"{g['replaced_the_command']})"
        )
    lines.append("line / word: keystrokes saved taking the top suggestion always; drawn: only what is drawn")
    lines += format_curve(result)
    if any("latency_ms" in t for t in result["totals"].values()):
        lines.append("ms p50/p99: in-process request -> last of 5 candidates at the sampled queries")
    return "\n".join(lines)


def _at_k(per_k: dict[Any, Any], k: int) -> Any:
    """A per-k figure of a result, in memory (int keys) or read back from JSON (str keys)."""
    return per_k[k] if k in per_k else per_k[str(k)]


def format_curve(result: dict[str, Any]) -> list[str]:
    """With training: per stretch of commands after j runs, the calmd that learns against the
    packaged one on the same queries (top-1 at k = 0, 1 and over every k; drawn-ghost keystrokes
    saved word by word), then the same over every stretch; nothing without training."""
    totals = result["totals"]
    learner = next((s for s in totals if s.startswith("calmd") and s != PACKAGED_SYSTEM), None)
    if learner is None or PACKAGED_SYSTEM not in totals or "curve" not in totals[learner]:
        return []
    metrics = (("top-1 k=0", lambda t: _at_k(t["top1"], 0)),
               ("top-1 k=1", lambda t: _at_k(t["top1"], 1)),
               ("top-1 all", lambda t: t["top1_all"]),
               ("drawn word", lambda t: t["keystrokes_saved_words_drawn"]))  # fmt: skip

    def row(name: str, learnt: dict[str, Any], packaged: dict[str, Any]) -> str:
        cells = []
        for _, value in metrics:
            a, b = value(learnt), value(packaged)
            cells.append(f"{(a or 0) * 100:>7.1f}{(b or 0) * 100:>7.1f}{((a or 0) - (b or 0)) * 100:>+7.1f}")
        return f"{name:<24}{learnt['typed_commands']:>7}" + "".join(cells)

    head = f"{'learning curve':<24}{'typed':>7}" + "".join(f"{name + ' (+/-)':>21}" for name, _ in metrics)
    every = f"{result.get('refit', '?')} refitted every {result.get('train_every', '?')} commands"
    lines = ["", f"{learner} ({every}) against {PACKAGED_SYSTEM}, the same queries: learnt, packaged, "
             "difference", head]  # fmt: skip
    for j, (learnt, packaged) in enumerate(zip(totals[learner]["curve"], totals[PACKAGED_SYSTEM]["curve"],
                                               strict=True)):  # fmt: skip
        if learnt["top1_all"] is not None:
            lines.append(row(f"after {j} runs", learnt, packaged))
    lines.append(row("every stretch", totals[learner], totals[PACKAGED_SYSTEM]))
    return lines


def write_json(result: dict[str, Any], path: Path) -> None:
    from calmd.atomic import atomic_write

    with atomic_write(path) as f:
        f.write(json.dumps(result, indent=1).encode())
