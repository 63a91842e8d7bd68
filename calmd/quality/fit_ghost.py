"""Fit the ghost rule (calmd/suggest/ghost.py): which candidate the shells draw, and when none.

    python -m calmd.quality.fit_ghost [--data ../shared/data] [--states states.json] [--jobs 2]

1. States: the training users of the public histories (never the held-out ones) are replayed as
   `calm replay` does (calmd/quality/replay.py); at each typed-out command every prefix is asked
   in order, as a user typing it character by character, and the early proposal and the five
   candidates with their calibrated confidences are kept (`--states FILE` caches them: the
   collection is the slow part).
2. Fit: the word-by-word user of the replay types each command with the ghosts a rule draws; a
   rule is scored by the keystrokes it saves minus the noise it shows (`NOISE`: each drawn ghost
   the user does not take costs a fraction of a key, more on the empty prompt), and the
   thresholds per context (`calmd.suggest.ghost.BUCKETS`) and the margin that lets a final answer
   replace the ghost already drawn are searched on a grid, one bucket at a time, until nothing
   changes. Deterministic for the same states.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd.quality.replay import next_word
from calmd.suggest.ghost import BUCKETS, GhostRule, bucket, packaged_rule, packaged_rule_path
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users


def _collect_user(args: tuple[Path, Path, int, int]) -> list[dict[str, Any]]:
    path, model, positions, seed = args
    from calmd.quality.replay import ReplayConfig, replay_user
    from calmd.suggest.calibration import packaged_calibrator
    from calmd.suggest.engine import ModelEngine

    cfg = ReplayConfig(model=model, positions=positions, typing_positions=positions, seed=seed)
    calibrator = packaged_calibrator()
    states: list[dict[str, Any]] = []
    replay_user(path, cfg, lambda w: ModelEngine(w, calibrator=calibrator), states=states)
    return states


def collect(
    files: Sequence[Path], model: Path, *, positions: int, seed: int, jobs: int
) -> list[dict[str, Any]]:
    """Every prefix of `positions` typed-out commands per user (module docstring), in file order."""
    out: list[dict[str, Any]] = []
    started = time.monotonic()
    work = [(f, model, positions, seed) for f in files]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for n, states in enumerate(pool.map(_collect_user, work), 1):
            out += states
            print(f"[{n}/{len(files)}] {len(out)} commands, {time.monotonic() - started:.0f} s", flush=True)
    return out


# --------------------------------------------------------------------------- simulation

NOISE = {"empty": 0.3, "k1": 0.1, "k2": 0.1, "k4": 0.1, "k8": 0.1}  # keys a wrong ghost costs (below)
MAX_REPLACED = 0.015  # of the requests, at most this share may replace the drawn early line
GRID = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01)
MARGINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass
class Outcome:
    """What a rule gives the word-by-word user over the states (`simulate`)."""

    chars: int = 0
    keys: int = 0
    wrong: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    requests: int = 0
    early: int = 0  # early lines drawn
    replaced: int = 0  # ... and replaced by the final answer within the keystroke

    @property
    def saved(self) -> float:
        return 1 - self.keys / self.chars if self.chars else 0.0

    def objective(self, noise: Mapping[str, float] = NOISE) -> float:
        """Keys saved less the noise: each key typed while a wrong ghost showed costs `noise[bucket]`
        of a key (a ghost the user reads and does not take; more on the empty prompt, where nothing is
        typed yet and a wrong line is all there is to read)."""
        return self.chars - self.keys - sum(noise[b] * n for b, n in self.wrong.items())


def _extends(line: str | None, typed: str) -> bool:
    return line is not None and len(line) > len(typed) and line.startswith(typed)


def simulate(items: Sequence[dict[str, Any]], rule: GhostRule) -> Outcome:
    """The zsh client's word-by-word user (calm replay's `keys_with_ghosts`) over the collected
    states, with `rule` deciding what each request draws: every key asks, with the line drawn so far
    as the incumbent while it still extends the buffer; else the early line is drawn when it
    reaches its threshold and is the incumbent; then the final answer's choice (`GhostRule.choose`)."""
    out = Outcome()
    for item in items:
        cmd, states = item["cmd"], item["states"]
        out.chars += len(cmd)
        typed, ghost = "", None
        while len(typed) < len(cmd):
            out.keys += 1
            state = states[len(typed)]
            candidates = [tuple(c) for c in state["cands"] if _extends(c[0], typed)]
            incumbent = ghost if _extends(ghost, typed) else None
            early = state["early"]
            drawn_early = early and _extends(early[0], typed) and rule.draws_early(typed, early[1])
            if incumbent is None and drawn_early:
                incumbent = early[0]
                out.early += 1
            pick = rule.choose(typed, candidates, incumbent)
            ghost = candidates[pick][0] if pick is not None else None
            out.requests += 1
            out.replaced += incumbent is not None and ghost != incumbent
            if ghost == cmd:
                break
            if ghost is not None:
                word = next_word(ghost[len(typed) :])
                if cmd.startswith(word, len(typed)):
                    typed += word
                    continue
                out.wrong[bucket(typed)] += 1
            typed = cmd[: len(typed) + 1]
    return out


def fit(items: Sequence[dict[str, Any]], noise: Mapping[str, float] = NOISE) -> tuple[GhostRule, Outcome]:
    """The rule with the best objective on `items` (coordinate search over GRID per bucket, for the
    final thresholds, then the margin, then the early thresholds, until nothing changes), among
    those that replace the drawn early line in at most MAX_REPLACED of the requests."""
    final = dict.fromkeys(BUCKETS, 0.0)
    early = dict.fromkeys(BUCKETS, 1.01)  # nothing drawn early: nothing replaced, to start from
    margin = 0.0

    def score(rule: GhostRule) -> float:
        out = simulate(items, rule)
        if out.replaced > MAX_REPLACED * out.requests:
            return -math.inf
        return out.objective(noise)

    best = score(GhostRule(final, early, margin))
    for _ in range(4):
        changed = False
        for b in BUCKETS:
            for table in (final, early):
                for value in GRID:
                    trial = dict(table)
                    trial[b] = value
                    got = score(GhostRule(trial if table is final else final,
                                          trial if table is early else early, margin))  # fmt: skip
                    if got > best + 1e-9 or (got == best and table is early and value < table[b]):
                        best, changed = got, changed or value != table[b]
                        table[b] = value
        for value in MARGINS:
            got = score(GhostRule(final, early, value))
            if got > best + 1e-9:
                best, margin, changed = got, value, True
        if not changed:
            break
    rule = GhostRule(final, early, margin)
    return rule, simulate(items, rule)


def main(argv: list[str] | None = None) -> int:
    from calmd import paths

    p = argparse.ArgumentParser(prog="python -m calmd.quality.fit_ghost", description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data folder (histories/users)")
    p.add_argument("--model", default=str(paths.packaged_weights()), help="the weights to replay")
    p.add_argument("--states", help="cache of the collected states (read when it exists, else written)")
    p.add_argument("--positions", type=int, default=20, help="typed-out commands per user")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="users replayed in parallel")
    p.add_argument(
        "--held-out",
        action="store_true",
        help="the held-out users instead: report the packaged rule on them (a check, no fit)",
    )
    p.add_argument("--out", help="where the rule goes (default: the package's calmd/data/ghost.json)")
    args = p.parse_args(argv)
    cache = Path(args.states) if args.states else None
    if cache is not None and cache.exists():
        states = json.loads(cache.read_text())
    else:
        users = history_users(Path(args.data))
        files = [u for u in users if held_out(u.stem) == args.held_out]
        states = collect(files, Path(args.model), positions=args.positions, seed=args.seed, jobs=args.jobs)
        if cache is not None:
            from calmd.atomic import atomic_write

            with atomic_write(cache) as f:
                f.write(json.dumps(states).encode())
    print(f"{len(states)} commands, {sum(len(s['states']) for s in states)} states")
    if args.held_out:
        rule = packaged_rule()
        report("the packaged rule on the held-out users", simulate(states, rule))
        return 0
    started = time.monotonic()
    rule, outcome = fit(states)
    report("fitted", outcome)
    for threshold in (0.0, 0.5):
        report(f"every threshold {threshold}", simulate(states, GhostRule.uniform(threshold)))
    info = {
        "fitted_on": f"{len({s['user'] for s in states})} training users of the public histories, "
        f"{len(states)} typed-out commands, every prefix",
        "command": "python -m calmd.quality.fit_ghost",
        "noise": NOISE,
        "max_replaced": MAX_REPLACED,
        "saved_words": round(outcome.saved, 4),
        "replaced": round(outcome.replaced / max(1, outcome.requests), 4),
        "model": Path(args.model).name,
        "seconds": round(time.monotonic() - started, 1),
    }
    rule = GhostRule(rule.final, rule.early, rule.margin, info)
    out = Path(args.out) if args.out else packaged_rule_path()
    from calmd.atomic import atomic_write

    with atomic_write(out) as f:
        f.write((json.dumps(rule.to_json(), indent=1) + "\n").encode())
    print(f"wrote {out}: final {rule.final}, early {rule.early}, margin {rule.margin}")
    return 0


def report(name: str, out: Outcome) -> None:
    wrong = sum(out.wrong.values())
    print(
        f"{name}: {out.saved * 100:.2f}% of keys saved word by word, {wrong} keys typed past a wrong ghost "
        f"({', '.join(f'{b} {n}' for b, n in out.wrong.items())}), {out.early} early lines drawn, "
        f"{out.replaced} replaced ({out.replaced / max(1, out.requests) * 100:.2f}% of "
        f"{out.requests} requests)"
    )


if __name__ == "__main__":
    sys.exit(main())
