"""Fit the reranker (calmd/suggest/rerank.py), the learned order of everything a keystroke proposes:

    python -m calmd.quality.fit_reranker [--data ../shared/data] [--rows rows.npz] [--jobs 2]

1. Rows: the training users of the public histories (never the held-out ones) are replayed as
   `calm replay` does (calmd/quality/replay.py) with the packaged model and ranker and the
   mixture's order (no reranker: the fit does not read its own output); at each sampled query
   the engine's reranker rows are kept: the lines it would order (the likeliest history
   proposals, the model's lines, COMP's) with RERANK_FEATURES, and which one the user ran. A
   training user's `log_users` counts the other training users only, as a new user's will.
   `--rows FILE` caches them (the collection is the slow part: the model runs at every query).
2. Fit: a LightGBM lambdarank forest learns to put the line the user ran first, over the queries
   whose lines hold it. Its feature importances (gain) are printed and kept in `info`.

`--check-held-out` also replays the held-out users' own positions (the replay's, seed 0) and
prints the top-1 of the reranker's order against the mixture's on the same lines: a measurement,
never fitted on. Needs LightGBM (the `dev` and `fit` extras); deterministic for the same rows, a
seed and a thread count.
"""

from __future__ import annotations

import json
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.arguments import Parser, run_tool, whole
from calmd.atomic import atomic_write
from calmd.errors import CalmError, FormatError
from calmd.formats.cwgt import read_cwgt
from calmd.quality.fit_anchor import popular, user_counts
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.forest import Forest
from calmd.suggest.rerank import RERANK_FEATURES, Reranker, packaged_reranker_path
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users, read_history

PROG = "python -m calmd.quality.fit_reranker"
MIXTURE_RANK = RERANK_FEATURES.index("mixture_rank")


@dataclass
class Collected:
    """Reranker rows of many queries, concatenated: `x` (rows, F), per query its size, whether and
    where it holds the line the user ran (`target`, -1: not), its k and its user."""

    x: np.ndarray
    sizes: np.ndarray
    target: np.ndarray
    k: np.ndarray
    user: np.ndarray
    users: list[str]

    def queries(self) -> list[tuple[np.ndarray, int, int]]:
        """(rows, target, k) per query."""
        ends = np.cumsum(self.sizes)
        starts = ends - self.sizes
        return [
            (self.x[a:b], int(t), int(k))
            for a, b, t, k in zip(starts, ends, self.target, self.k, strict=True)
        ]

    def save(self, path: Path) -> None:
        with atomic_write(path, mode=0o644) as out:
            np.savez_compressed(out, x=self.x, sizes=self.sizes, target=self.target, k=self.k, user=self.user,
                                users=np.array(self.users), features=np.array(RERANK_FEATURES))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Collected:
        try:
            with np.load(path) as data:
                features = [str(f) for f in data["features"]]
                found = cls(data["x"], data["sizes"], data["target"], data["k"], data["user"],
                            [str(u) for u in data["users"]])  # fmt: skip
        except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # an OSError names the file
            raise FormatError(f"{path}: not the rows this tool writes ({exc})") from None
        if features != list(RERANK_FEATURES):
            raise FormatError(f"{path}: rows of other features: collect them again (another --rows)")
        return found


def _collect_user(
    args: tuple[Path, Path, int, int, dict[str, int], int],
) -> list[tuple[np.ndarray, int, int]]:
    """One user's queries as rows: (rows, the target's index or -1, k)."""
    path, model, positions, seed, table, frames = args
    from calmd.quality.replay import ReplayConfig, replay_user
    from calmd.quality.systems import Rows
    from calmd.suggest.calibration import uncalibrated
    from calmd.suggest.engine import ModelEngine

    cfg = ReplayConfig(model=model, positions=positions, typing_positions=0, seed=seed, anchor=False,
                       history_frames=frames)  # fmt: skip
    calibrator = uncalibrated()  # the rows do not depend on it (the fit of the calibration comes after)

    def engine(weights: Path) -> ModelEngine:
        made = ModelEngine(weights, calibrator=calibrator, reranker=None)
        made.popular = table  # the other training users' lines
        return made

    rows = Rows(collect_rerank=True)
    replay_user(path, cfg, engine, rows)
    return [(x.astype(np.float32), lines.index(target) if target in lines else -1, k)
            for lines, x, target, k in rows.rerank]  # fmt: skip


def collect(files: Sequence[Path], model: Path, *, positions: int, seed: int, jobs: int,
            tables: Sequence[dict[str, int]], history_frames: int = HISTORY_FRAMES) -> Collected:  # fmt: skip
    """The rows of every user's sampled queries (module docstring), in file order, the model
    seeing `history_frames` past commands."""
    xs: list[np.ndarray] = []
    sizes: list[int] = []
    targets: list[int] = []
    ks: list[int] = []
    users: list[int] = []
    started = time.monotonic()
    work = [
        (f, model, positions, seed, table, history_frames) for f, table in zip(files, tables, strict=True)
    ]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for n, queries in enumerate(pool.map(_collect_user, work)):
            for x, target, k in queries:
                xs.append(x)
                sizes.append(len(x))
                targets.append(target)
                ks.append(k)
                users.append(n)
            print(f"[{n + 1}/{len(files)}] {files[n].stem}: {len(sizes)} queries, "
                  f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    x = np.concatenate(xs) if xs else np.zeros((0, len(RERANK_FEATURES)), dtype=np.float32)
    sized, targeted, typed, whose = (np.array(a, dtype=np.int64) for a in (sizes, targets, ks, users))
    return Collected(x, sized, targeted, typed, whose, [f.stem for f in files])


def fit_forest(rows: Collected, *, rounds: int, leaves: int, rate: float, threads: int,
               seed: int) -> tuple[Forest, dict[str, float]]:  # fmt: skip
    """A LightGBM lambdarank forest over the queries whose lines hold the user's and something
    else, and its features' importances (share of the total gain)."""
    import lightgbm

    usable = [(x, t) for x, t, _ in rows.queries() if t >= 0 and len(x) > 1]
    if not usable:
        raise CalmError("no query whose lines hold the line the user ran: nothing to fit")
    x = np.concatenate([q for q, _ in usable])
    y = np.zeros(len(x))
    at = 0
    for q, t in usable:
        y[at + t] = 1
        at += len(q)
    params = {"objective": "lambdarank", "num_leaves": leaves, "learning_rate": rate,
              "min_data_in_leaf": 50, "lambdarank_truncation_level": 10, "num_threads": threads,
              "seed": seed, "deterministic": True, "force_row_wise": True, "verbosity": -1}  # fmt: skip
    data = lightgbm.Dataset(x, y, group=[len(q) for q, _ in usable], feature_name=list(RERANK_FEATURES))
    booster = lightgbm.train(params, data, num_boost_round=rounds)
    gain = booster.feature_importance("gain")
    importance = {f: round(float(g / gain.sum()), 4) for f, g in zip(RERANK_FEATURES, gain, strict=True)}
    return Forest.from_lightgbm(booster.dump_model(), RERANK_FEATURES), importance


def top1(forest: Forest | None, rows: Collected) -> dict[int, float]:
    """Share of queries (per k) whose first line is the user's: in the forest's order, or (None)
    in the mixture's (the lines it ranked; its rank 0)."""
    hits: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for x, target, k in rows.queries():
        total[k] += 1
        if target < 0 or not len(x):
            continue
        first = int(np.argmax(forest.scores(x))) if forest is not None else int(np.argmin(x[:, MIXTURE_RANK]))
        hits[k] += first == target
    return {k: hits[k] / total[k] for k in sorted(total)}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--model", type=Path, default=None, help="weights (default: the packaged model)")
    parser.add_argument("--output", type=Path, default=packaged_reranker_path())
    parser.add_argument("--positions", type=whole(1, 100_000), default=60,
                        help="sampled positions per training user (default 60)")  # fmt: skip
    parser.add_argument("--seed", type=whole(0, 2**31 - 1), default=1,
                        help="positions differ from the replay's (seed 0)")  # fmt: skip
    parser.add_argument(
        "--rows", type=Path, help="cache of the collected rows (read if present, else written)"
    )
    parser.add_argument("--jobs", type=whole(1, 64), default=1, help="users collected at once")
    parser.add_argument("--rounds", type=whole(1, 10_000), default=200, help="trees (default 200)")
    parser.add_argument("--leaves", type=whole(2, 1024), default=15, help="leaves per tree (default 15)")
    parser.add_argument("--rate", type=float, default=0.1, help="learning rate (default 0.1)")
    parser.add_argument("--threads", type=whole(1, 64), default=1)
    parser.add_argument("--check-held-out", metavar="ROWS",
                        help="also replay the held-out users' positions (cached in ROWS) and print the top-1 "
                        "of the reranker's order against the mixture's (measuring only)")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.monotonic()
    files = history_users(args.data)
    if not files:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    model = args.model or paths.packaged_weights()
    read_cwgt(model)  # a bad file named as given: the replay reads a copy
    histories = {p.stem: read_history(p) for p in files}
    train = [p for p in files if not held_out(p.stem)]
    counts = user_counts({p.stem: histories[p.stem] for p in train})
    table = popular(counts)
    if args.rows is not None and args.rows.exists():
        rows = Collected.load(args.rows)
    else:
        tables = [popular(counts, histories[p.stem]) for p in train]
        rows = collect(train, model, positions=args.positions, seed=args.seed, jobs=args.jobs, tables=tables)
        if args.rows is not None:
            rows.save(args.rows)
    gathered = time.monotonic() - started
    forest, importance = fit_forest(rows, rounds=args.rounds, leaves=args.leaves, rate=args.rate,
                                    threads=args.threads, seed=args.seed)  # fmt: skip
    info: dict[str, Any] = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "training_users": len(train),
        "training_queries": len(rows.sizes),
        "positions": args.positions,
        "rounds": args.rounds,
        "leaves": args.leaves,
        "rate": args.rate,
        "seed": args.seed,
        "importance_gain": importance,
        "popular_lines": len(table),
    }
    print(f"fitted on {len(rows.sizes)} queries of {len(train)} users in {time.monotonic() - started:.0f} s "
          f"({gathered:.0f} s gathering)")  # fmt: skip
    ordered = sorted(importance.items(), key=lambda kv: -kv[1])
    print("importance (gain): " + ", ".join(f"{f} {v:.3f}" for f, v in ordered if v > 0))
    if args.check_held_out:
        held_path = Path(args.check_held_out)
        if held_path.exists():
            held = Collected.load(held_path)
        else:
            test = [p for p in files if held_out(p.stem)]
            held = collect(test, model, positions=40, seed=0, jobs=args.jobs, tables=[table] * len(test))
            held.save(held_path)
        ours, mixture = top1(forest, held), top1(None, held)
        info["held_out_top1"] = {str(k): round(v, 4) for k, v in ours.items()}
        print("held-out top-1, reranker / mixture, on the same lines: "
              + ", ".join(f"k={k}: {100 * ours[k]:.1f} / {100 * mixture[k]:.1f}" for k in ours))  # fmt: skip
    with atomic_write(args.output, mode=0o644) as out:
        out.write((json.dumps(Reranker(forest, table, info).to_json()) + "\n").encode())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
