"""The panel: no absurd ghost (issue 31). What a person meets in a small Python project.

    python -m calmd.quality.panel [--weights FILE] [--json FILE] [--min-confidence P] [--random-folder]

A real project folder is built in TMPDIR/calm-panel/weather, the same folder every run (the model
reads the cwd; `--random-folder` shows the spread a folder's name makes): README.md,
pyproject.toml, src/weather/, tests/, docs/, a Makefile, a Dockerfile, data.csv, a virtualenv's
activate script, a git repository with two branches when git is there. Two users type in it: a new
user with an empty history, and the same user after the few dozen ordinary commands of `HISTORY`
(tests run, files edited, commits pushed, an image built, a host reached). For each user calmd's
engine (the packaged model, the packaged ranker, calibration and ghost rule) is asked, as the
daemon asks it, for each of the `PREFIXES` people type every day: the input, the shell's cwd and
branch, the history frames (calmd/suggest/context.py `recent_context`), and the COMP and ENV frames
the daemon fills (calmd/daemon/comp_state.py) from the real folder.

Each prefix is written down with the KIND of a sensible next word (a module after `python3 -m`, an
operation after `tar`, a resource after `kubectl get`, a variable after `export`, an existing path
where a path belongs ...), and the ghost drawn (the candidate flagged `ghost`; its `draw` where the
engine draws only the first words of it) is judged past the typed prefix by that kind's judge:
- `placeholder`: it holds a documentation stand-in (calmd/suggest/filters.py `PLACEHOLDERS`:
  `example.com`, `user@`, `<file>`, `path/to/` ...): never to be drawn;
- `absurd`: its next word is not of the kind (`tar README.md`, `kill -9 Documents`, a folder that
  is not there);
- `sensible`: it is.
The judges are written from what the project holds and what the commands take, independently of
the engine's filters (calmd/suggest/kinds.py), which they check.

Three modules: calmd/quality/panel_project.py is the project and the user (the folder, `HISTORY`,
the store), calmd/quality/panel_judges.py the prefixes and their judges, and this one the run and
what it prints.

Targets (issue 31): at most 1 drawn ghost in 20 absurd, at least 40% of the (prefix, user) pairs
drawing one, no placeholder drawn. tests/quality/test_panel.py runs it and asserts them.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.quality.panel_judges import PREFIXES, Judge, Prefix, judge
from calmd.quality.panel_project import (
    BRANCH,
    HISTORY,
    SESSION,
    Project,
    build_project,
    judged_project,
    panel_home,
    user_history,
)
from calmd.suggest.context import HISTORY_FRAMES, recent_context
from calmd.suggest.disk import Disk
from calmd.suggest.frames import short_env

# what the tests and tools take from the panel
__all__ = ["BRANCH", "HISTORY", "PREFIXES", "Judge", "Prefix", "Project", "Report", "Row", "build_project",
           "judge", "judged_project", "render", "run_panel", "user_history"]  # fmt: skip

# --------------------------------------------------------------------------- the run


@dataclass
class Row:
    prefix: str
    kind: str
    user: str
    drawn: str | None  # the text drawn, None when no ghost
    verdict: str  # sensible / absurd / placeholder / none
    why: str = ""
    top: str | None = None  # the top candidate, drawn or not
    ms: float = 0.0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    weights: str = ""

    def pairs(self, user: str | None = None) -> list[Row]:
        return [r for r in self.rows if user is None or r.user == user]

    def figures(self, user: str | None = None) -> dict[str, Any]:
        rows = self.pairs(user)
        drawn = [r for r in rows if r.drawn is not None]
        absurd = sum(r.verdict == "absurd" for r in drawn)
        return {
            "prefixes": len(rows),
            "drawn": len(drawn),
            "drawn_share": len(drawn) / len(rows) if rows else 0.0,
            "absurd": absurd,
            "absurd_share": absurd / len(drawn) if drawn else 0.0,
            "placeholders": sum(r.verdict == "placeholder" for r in drawn),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "figures": {"all": self.figures(), **{u: self.figures(u) for u in USERS}},
            "rows": [asdict(r) for r in self.rows],
            "seconds": round(self.seconds, 1),
            "weights": self.weights,
        }


USERS = ("new", "returning")


def run_panel(
    weights: Path | None = None, prefixes: tuple[Prefix, ...] = PREFIXES, min_confidence: float | None = None,
    where: Path | None = None,
) -> Report:  # fmt: skip
    """The panel (the module docstring) with the model `weights` (default: the packaged one) and
    the packaged ghost rule, or one threshold everywhere (`min_confidence`: CALM_MIN_CONFIDENCE).
    The project is built in `where` (default: the same folder every run, `panel_home`)."""
    from calmd.daemon.comp_state import SessionComp
    from calmd.suggest.engine import ModelEngine

    started = time.monotonic()
    report = Report(weights=str(weights or paths.packaged_weights()))
    engine = ModelEngine(weights or paths.packaged_weights())
    # Listings waited for (the daemon waits 2 ms and uses them from the next keystroke on): the
    # panel judges what a user sees once the folder is known, not the first keystroke's race.
    disk = Disk(budget=1.0)
    engine.attach_disk(disk)
    never = threading.Event()
    home_folder = panel_home() if where is None else nullcontext(where)
    with home_folder as home, tempfile.TemporaryDirectory(prefix="calm-panel-data-") as tmp:
        root = build_project(home)
        for user in USERS:
            history = HISTORY if user == "returning" else ()
            folder = Path(tmp) / f"data-{user}"
            folder.mkdir()
            with user_history(folder, history, root) as store:
                engine.attach_history(store)
                comp = SessionComp(disk)
                project = judged_project(root, history)
                frames = [
                    {"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, SESSION, HISTORY_FRAMES)
                ]
                env = short_env(str(root / ".venv")) if user == "returning" else ""
                for i, prefix in enumerate(prefixes):
                    ctx: dict[str, Any] = {"input": prefix.typed, "cwd": str(root), "git": BRANCH,
                                           "history": frames, **({"env": env} if env else {})}  # fmt: skip
                    session = f"{user}-{i}"  # each prefix a fresh keystroke (no typing through)
                    comp.fill(ctx, session, engine.followers)
                    t0 = time.perf_counter()
                    got = list(engine.complete(ctx, 5, session, never, lambda *_: None,
                                               min_confidence=min_confidence))  # fmt: skip
                    ms = (time.perf_counter() - t0) * 1e3
                    ghost = next((s for s in got if s.ghost), None)
                    row = Row(prefix.typed, prefix.kind, user, None, "none", top=got[0].text if got else None,
                              ms=round(ms, 1))  # fmt: skip
                    if ghost is not None:
                        row.drawn = getattr(ghost, "draw", None) or ghost.text
                        row.verdict, row.why = judge(prefix, row.drawn, project)
                    report.rows.append(row)
    disk.close()
    report.seconds = time.monotonic() - started
    return report


def render(report: Report) -> str:
    """The readable report: one line per prefix with each user's ghost and verdict, then the totals."""
    lines = [f"The panel: no absurd ghost ({report.weights}, {report.seconds:.0f} s)", ""]
    by_prefix: dict[str, dict[str, Row]] = {}
    for row in report.rows:
        by_prefix.setdefault(row.prefix, {})[row.user] = row
    width = max(len(p) for p in by_prefix) + 2
    for typed, users in by_prefix.items():
        kind = next(iter(users.values())).kind
        lines.append(f"{typed!r:<{width}} ({kind})")
        for name in USERS:
            found = users.get(name)
            if found is None:
                continue
            if found.drawn is None:
                lines.append(f"    {name:<10} -  no ghost (top: {found.top!r})")
            else:
                mark = {"sensible": "ok", "absurd": "ABSURD", "placeholder": "PLACEHOLDER"}[found.verdict]
                why = f"  ({found.why})" if found.why and found.verdict != "sensible" else ""
                lines.append(f"    {name:<10} {mark:<11} {found.drawn!r}{why}")
    lines.append("")
    for who in (None, *USERS):
        f = report.figures(who)
        lines.append(
            f"{who or 'both users':<11} ghost drawn for {f['drawn']}/{f['prefixes']} prefixes "
            f"({f['drawn_share']:.0%}); absurd {f['absurd']}/{f['drawn']} drawn ({f['absurd_share']:.1%}); "
            f"placeholders drawn {f['placeholders']}"
        )
    lines.append("targets: absurd <= 5% of drawn, drawn >= 40% of prefixes, no placeholder")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, default=None, help="a model file (default: the packaged one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and figures here")
    parser.add_argument("--min-confidence", type=float, default=None, metavar="P",
                        help="one threshold in place of the rule (CALM_MIN_CONFIDENCE)")  # fmt: skip
    parser.add_argument("--random-folder", action="store_true",
                        help="build the project in a new temporary folder, not the same one")  # fmt: skip
    args = parser.parse_args(argv)
    if args.random_folder:  # the spread a folder's name makes (the model reads the cwd)
        with tempfile.TemporaryDirectory(prefix="calm-panel-") as tmp:
            report = run_panel(args.weights, min_confidence=args.min_confidence, where=Path(tmp))
    else:
        report = run_panel(args.weights, min_confidence=args.min_confidence)
    print(render(report))
    if args.json is not None:
        from calmd.atomic import atomic_write

        with atomic_write(args.json) as f:
            f.write((json.dumps(report.to_json(), indent=1) + "\n").encode())
    return 0


PROG = "python -m calmd.quality.panel"

if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
