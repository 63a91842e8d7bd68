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

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd.arguments import Parser, run_tool
from calmd.atomic import parse_json
from calmd.errors import FormatError
from calmd.quality.typist import extends, ghost_replaced, keys_with_ghosts, right_next_word
from calmd.suggest.ghost import BUCKETS, OLD, GhostRule, bucket, packaged_rule, packaged_rule_path
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users

PEER = "zsh-autosuggestions:match_prev_cmd"  # the peer the rule must beat (docs/quality.md)


def _collect_user(args: tuple[Path, Path, int, int, int]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    path, model, positions, seed, first = args
    from calmd.quality.replay import ReplayConfig, replay_user
    from calmd.suggest.calibration import packaged_calibrator
    from calmd.suggest.engine import ModelEngine

    cfg = ReplayConfig(model=model, positions=positions, typing_positions=positions, seed=seed, first=first,
                       anchor=False)  # fmt: skip
    calibrator = packaged_calibrator()
    states: list[dict[str, Any]] = []
    tallies = replay_user(path, cfg, lambda w: ModelEngine(w, calibrator=calibrator), states=states)
    peer = tallies[PEER]
    return states, {"chars": peer.chars, "keys": peer.keys_words_drawn, "states": peer.screen.states,
                    "drawn": peer.screen.drawn, "wrong": peer.screen.wrong}  # fmt: skip


def collect(
    files: Sequence[Path], model: Path, *, positions: int, seed: int, jobs: int, first: int = 0
) -> dict[str, Any]:
    """Every prefix of `positions` typed-out commands per user (module docstring), in file order,
    and what the peer (`PEER`) saved and showed on the same commands."""
    out: list[dict[str, Any]] = []
    peer: dict[str, int] = {}
    started = time.monotonic()
    work = [(f, model, positions, seed, first) for f in files]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for n, (states, theirs) in enumerate(pool.map(_collect_user, work), 1):
            out += states
            for key, value in theirs.items():
                peer[key] = peer.get(key, 0) + value
            print(f"[{n}/{len(files)}] {len(out)} commands, {time.monotonic() - started:.0f} s", flush=True)
    return {"states": out, "peer": peer, "first": first}


# --------------------------------------------------------------------------- simulation

NOISE = {"empty": 0.3, "k1": 0.1, "k2": 0.1, "k4": 0.1, "k8": 0.1}  # keys a wrong ghost costs (below)
MAX_REPLACED = 0.015  # of the requests, at most this share may replace the drawn early line


@dataclass
class Outcome:
    """What a rule gives the word-by-word user over the states (`simulate`)."""

    chars: int = 0
    keys: int = 0
    wrong: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    states: int = 0  # states the user passed through (calm replay's `Screen`)
    drawn: int = 0  # ... with a ghost drawn
    requests: int = 0
    early: int = 0  # early lines drawn
    replaced: int = 0  # ... and replaced by the final answer within the keystroke

    @property
    def saved(self) -> float:
        return 1 - self.keys / self.chars if self.chars else 0.0

    @property
    def wrong_share(self) -> float:
        return sum(self.wrong.values()) / self.states if self.states else 0.0

    def objective(self, noise: Mapping[str, float] = NOISE) -> float:
        """Keys saved less the noise: each state showing a wrong ghost costs `noise[bucket]` of a
        key (a ghost the user reads and does not take; more on the empty prompt, where nothing is
        typed yet and a wrong line is all there is to read)."""
        return self.chars - self.keys - sum(noise[b] * n for b, n in self.wrong.items())


def simulate(items: Sequence[dict[str, Any]], rule: GhostRule) -> Outcome:
    """The zsh client's word-by-word user (calm replay's `keys_with_ghosts`) over the collected
    states, with `rule` deciding what each request draws, as the engine does: every key asks,
    with what is drawn so far as the incumbent while it still extends the buffer; else the early
    line is drawn when it reaches its threshold and is the incumbent; then the final answer's
    choice (`GhostRule.draw`)."""
    out = Outcome()
    for item in items:
        cmd, states = item["cmd"], item["states"]
        history = item.get("history", OLD)

        def request(typed: str, incumbent: str | None, cmd: str = cmd, states: Any = states,
                    history: int = history) -> str | None:  # fmt: skip
            state = states[len(typed)]
            candidates = state.get("extending")
            if candidates is None:  # the same for every rule: the buffer at a state is always the same
                candidates = state["extending"] = [tuple(c) for c in state["cands"] if extends(c[0], typed)]
            early = state["early"]
            if (
                incumbent is None
                and early
                and extends(early[0], typed)
                and rule.draws_early(typed, early[1], history)
            ):
                incumbent = early[0]
                out.early += 1
            got = rule.draw(typed, candidates, incumbent, history)
            ghost = got[1] if got is not None else None
            out.states += 1
            out.requests += 1
            out.replaced += ghost_replaced(incumbent, ghost)
            if ghost is not None:
                out.drawn += 1
                if not right_next_word(cmd, typed, ghost):
                    out.wrong[bucket(typed)] += 1
            return ghost

        out.chars += len(cmd)
        out.keys += keys_with_ghosts(cmd, request, True)
    return out


GRID = (0.0, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.225, 0.25, 0.275, 0.3, 0.35, 0.4,
        0.45, 0.5, 0.6, 0.8, 1.01)  # fmt: skip
YOUNG = 100  # commands: below, a history is a new user's (the young rule, fitted on first commands)


def fit(
    items: Sequence[dict[str, Any]], noise: float | Mapping[str, float] = NOISE, *, heads: bool = True,
    rounds: int = 6, max_replaced: float = MAX_REPLACED,
) -> tuple[GhostRule, Outcome]:  # fmt: skip
    """The rule with the best objective on `items` (`Outcome.objective`: keys saved less `noise`
    keys per state showing a wrong ghost), among those that replace what is drawn in at most
    `max_replaced` of the requests: a coordinate search over GRID, per bucket, of the final
    thresholds for the model's lines and for the user's own (`known`) and of the early line's,
    from 0.2 and no early line, until nothing changes or `rounds` rounds. Deterministic."""
    per_bucket = noise if isinstance(noise, Mapping) else dict.fromkeys(BUCKETS, float(noise))
    tables = {"final": dict.fromkeys(BUCKETS, 0.2), "known": dict.fromkeys(BUCKETS, 0.2),
              "early": dict.fromkeys(BUCKETS, 1.01)}  # fmt: skip

    def rule_of(t: Mapping[str, Mapping[str, float]]) -> GhostRule:
        return GhostRule(t["final"], t["early"], 0.0, heads, t["known"])

    def score(t: Mapping[str, Mapping[str, float]]) -> float:
        out = simulate(items, rule_of(t))
        if out.replaced > max_replaced * out.requests:
            return -math.inf
        return out.objective(per_bucket)

    best = score(tables)
    for _ in range(rounds):
        changed = False
        for b in BUCKETS:
            for name in tables:
                for value in GRID:
                    if value == tables[name][b]:
                        continue
                    trial = {k: dict(v) for k, v in tables.items()}
                    trial[name][b] = value
                    got = score(trial)
                    if got > best + 1e-9:
                        best, tables, changed = got, trial, True
        if not changed:
            break
    rule = rule_of(tables)
    return rule, simulate(items, rule)


def peer_figures(collected: Mapping[str, Any]) -> tuple[float, float]:
    """What the peer (`PEER`) saved word by word and its share of states showing a wrong ghost,
    on the same commands as the collected states."""
    peer = collected["peer"]
    return 1 - peer["keys"] / peer["chars"], peer["wrong"] / peer["states"]


NOISES = (0.45, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2)  # the noise prices the fit tries (`fit_against_peer`)
TOLERANCE = 0.005  # a rule may show a wrong ghost at the peer's share plus this (sampling noise)


def _fit_at(args: tuple[Sequence[dict[str, Any]], float]) -> tuple[GhostRule, Outcome]:
    return fit(args[0], args[1])


def fit_against_peer(
    collected: Mapping[str, Any], *, tolerance: float = TOLERANCE, noises: Sequence[float] = NOISES,
    progress: bool = True, jobs: int = 2,
) -> tuple[GhostRule, Outcome, float]:  # fmt: skip
    """The rule to ship on these states: fitted at each noise price (`fit`), the one of the lowest
    price (the most keys saved) that shows a wrong ghost at no more than the peer's share plus
    `tolerance`; the highest price's when none does. Returns the rule, its outcome and its price."""
    states = collected["states"]
    _, peer_wrong = peer_figures(collected)
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        fitted = list(pool.map(_fit_at, [(states, price) for price in sorted(noises)]))
    chosen = None
    for price, (rule, out) in zip(sorted(noises), fitted, strict=True):
        if progress:
            report(f"  noise {price}", out)
            print(f"    {json.dumps(rule.to_json())}")
        if chosen is None and out.wrong_share <= peer_wrong + tolerance:
            chosen = (rule, out, price)
    return chosen if chosen is not None else (*fitted[-1], sorted(noises)[-1])


def load_or_collect(
    cache: Path | None, data: Path, model: Path, *, held: bool, positions: int, first: int, seed: int,
    jobs: int,
) -> dict[str, Any]:  # fmt: skip
    """The states of the training users (`held`: the held-out ones), read from `cache` when it
    exists, else collected (and written there)."""
    if cache is not None and cache.exists():
        collected = parse_json(cache.read_bytes(), cache)
        if (
            not isinstance(collected, dict)
            or not isinstance(collected.get("states"), list)
            or not isinstance(collected.get("peer"), dict)
        ):
            raise FormatError(f"{cache}: not states collected by this version of fit_ghost (no states, peer)")
        return collected
    users = history_users(data)
    files = [u for u in users if held_out(u.stem) == held]
    collected = collect(files, model, positions=positions, seed=seed, jobs=jobs, first=first)
    if cache is not None:
        from calmd.atomic import atomic_write

        with atomic_write(cache) as f:
            f.write(json.dumps(collected).encode())
    return collected


def add_collection_arguments(p: Parser) -> None:
    """The flags of the states' collection (`load_or_collect`), shared with ghost_curve: the same
    defaults, so that one command's caches serve the other."""
    from calmd import paths

    p.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data folder (histories/users)")
    p.add_argument("--model", default=str(paths.packaged_weights()), help="the weights to replay")
    p.add_argument(
        "--states", help="cache of the grown users' collected states (read if it exists, else written)"
    )
    p.add_argument("--young-states", help="the same for the new users' first commands")
    p.add_argument("--positions", type=int, default=12, help="typed-out commands per user (grown users)")
    p.add_argument("--young-positions", type=int, default=10, help="typed-out commands per user (first ones)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="users replayed in parallel")


def collected_pair(args: Any, *, held: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The grown users' states and their first commands' (`add_collection_arguments`'s flags)."""
    data, model = Path(args.data), Path(args.model)

    def states(cache: str | None, positions: int, first: int) -> dict[str, Any]:
        source = Path(cache) if cache else None
        return load_or_collect(
            source, data, model, held=held, positions=positions, first=first, seed=args.seed, jobs=args.jobs
        )

    return states(args.states, args.positions, 0), states(args.young_states, args.young_positions, YOUNG)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    add_collection_arguments(p)
    p.add_argument("--tolerance", type=float, default=TOLERANCE, help="wrong states past the peer's share")
    p.add_argument(
        "--held-out",
        action="store_true",
        help="the held-out users instead: report the packaged rule on them (a check, no fit)",
    )
    p.add_argument("--out", help="where the rule goes (default: the package's calmd/data/ghost.json)")
    args = p.parse_args(argv)
    started = time.monotonic()
    grown, young = collected_pair(args, held=args.held_out)
    for name, collected in (("grown users", grown), ("first commands", young)):
        peer_saved, peer_wrong = peer_figures(collected)
        n_states = sum(len(s["states"]) for s in collected["states"])
        print(f"{name}: {len(collected['states'])} commands, {n_states} states; {PEER} saves "
              f"{peer_saved * 100:.2f}%, a wrong ghost at {peer_wrong * 100:.2f}% of states")  # fmt: skip
    if args.held_out:
        rule = packaged_rule()
        report("the packaged rule, grown users", simulate(grown["states"], rule))
        report("the packaged rule, first commands", simulate(young["states"], rule))
        return 0
    rules: dict[str, tuple[GhostRule, Outcome, float]] = {}
    for name, collected in (("grown", grown), ("young", young)):
        print(f"fitting the {name} rule")
        rules[name] = fit_against_peer(collected, tolerance=args.tolerance, jobs=args.jobs)
        report(f"the {name} rule", rules[name][1])
    grown_rule, grown_out, grown_noise = rules["grown"]
    young_rule, young_out, young_noise = rules["young"]
    info = {
        "fitted_on": f"{len({s['user'] for s in grown['states']})} training users of the public histories: "
        f"{len(grown['states'])} typed-out commands (grown), {len(young['states'])} of their first {YOUNG} "
        "(young), every prefix",
        "command": "python -m calmd.quality.fit_ghost",
        "bar": {"peer": PEER, "tolerance": args.tolerance},
        "noise": {"grown": grown_noise, "young": young_noise},
        "max_replaced": MAX_REPLACED,
        "training": {
            name: figures(out, c)
            for name, out, c in (("grown", grown_out, grown), ("young", young_out, young))
        },
        "model": Path(args.model).name,
        "seconds": round(time.monotonic() - started, 1),
    }
    rule = GhostRule(grown_rule.final, grown_rule.early, grown_rule.margin, True, grown_rule.known, YOUNG,
                     young_rule, info)  # fmt: skip
    out = Path(args.out) if args.out else packaged_rule_path()
    from calmd.atomic import atomic_write

    with atomic_write(out) as f:
        f.write((json.dumps(rule.to_json(), indent=1) + "\n").encode())
    print(f"wrote {out}")
    return 0


def figures(out: Outcome, collected: Mapping[str, Any]) -> dict[str, float]:
    """The fitted rule's figures beside the peer's on the same states (the rule's `info`)."""
    peer_saved, peer_wrong = peer_figures(collected)
    return {"saved_words": round(out.saved, 4), "wrong_states": round(out.wrong_share, 4),
            "peer_saved_words": round(peer_saved, 4), "peer_wrong_states": round(peer_wrong, 4),
            "replaced": round(out.replaced / max(1, out.requests), 4)}  # fmt: skip


def report(name: str, out: Outcome) -> None:
    wrong = sum(out.wrong.values())
    print(
        f"{name}: {out.saved * 100:.2f}% of keys saved word by word; a ghost drawn at "
        f"{out.drawn / max(1, out.states) * 100:.1f}% of {out.states} states, a wrong one at "
        f"{out.wrong_share * 100:.2f}%: {wrong} states "
        f"({', '.join(f'{b} {n}' for b, n in out.wrong.items())}), {out.early} early lines drawn, "
        f"{out.replaced} replaced ({out.replaced / max(1, out.requests) * 100:.2f}% of "
        f"{out.requests} requests)"
    )


PROG = "python -m calmd.quality.fit_ghost"

if __name__ == "__main__":
    sys.exit(run_tool(PROG, main))
