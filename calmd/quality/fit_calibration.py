"""Fit the daemon's confidence calibration (calmd/suggest/calibration.py) on the public histories:

    python -m calmd.quality.fit_calibration [--data ../shared/data]

The rows are the replay's candidates on the *training* users (calmd/quality/replay.py,
`collect_rows`), labelled by whether each was the line the user ran; deterministic for a seed.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.atomic import atomic_write
from calmd.errors import CalmError
from calmd.formats.cwgt import read_cwgt
from calmd.suggest.calibration import (
    EARLY_FEATURES,
    FEATURES,
    Calibrator,
    Head,
    packaged_calibration_path,
    uncalibrated,
)
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users

PROG = "python -m calmd.quality.fit_calibration"

# --------------------------------------------------------------------------- fitting


def fit_head(features: tuple[str, ...], x: np.ndarray, y: np.ndarray, *, l2: float = 1.0,
             iterations: int = 50) -> Head:  # fmt: skip
    """Logistic regression by Newton's method (IRLS) with an L2 penalty on the weights, on
    standardised features: deterministic, no learning rate to tune."""
    mean = x.mean(0)
    scale = x.std(0)
    scale[scale < 1e-9] = 1.0
    z = (x - mean) / scale
    a = np.hstack([z, np.ones((len(z), 1))])  # (n, F + 1), the last column is the bias
    theta = np.zeros(a.shape[1])
    penalty = np.full(a.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ theta, -700, 700)))
        grad = a.T @ (p - y) + penalty * theta
        hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    head = Head(features, mean, scale, theta[:-1].copy(), float(theta[-1]))
    kx, ky = isotonic(head.logistic(x), y)
    return Head(features, mean, scale, head.w, head.b, kx, ky)


def isotonic(p: np.ndarray, y: np.ndarray, bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Knots of the isotonic regression of y on p (pool adjacent violators), on `bins` quantile
    bins of p so that the map stays small; anchored at 0 and 1."""
    order = np.argsort(p, kind="stable")
    p, y = p[order], y[order]
    edges = np.unique(np.quantile(p, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    blocks: list[list[float]] = []  # [sum of p, sum of y, count]
    for b in range(len(edges) - 1):
        inside = which == b
        if inside.any():
            blocks.append([float(p[inside].sum()), float(y[inside].sum()), float(inside.sum())])
    merged: list[list[float]] = []
    for block in blocks:  # pool adjacent violators: merge while the means go down
        merged.append(block)
        while len(merged) > 1 and merged[-2][1] / merged[-2][2] >= merged[-1][1] / merged[-1][2]:
            last = merged.pop()
            merged[-1] = [a + b for a, b in zip(merged[-1], last, strict=True)]
    xs = [0.0] + [m[0] / m[2] for m in merged] + [1.0]
    ys = [0.0] + [m[1] / m[2] for m in merged] + [1.0]
    ys[-1] = max(ys[-1], ys[-2])
    kx, ky = np.array(xs), np.maximum.accumulate(np.array(ys))
    keep = np.concatenate([[True], np.diff(kx) > 1e-9])  # strictly increasing x
    return kx[keep], ky[keep]


def reliability(p: np.ndarray, y: np.ndarray, edges: Sequence[float] = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7,
                0.8, 0.9, 1.0001)) -> list[dict[str, float]]:  # fmt: skip
    """Per confidence bin: how many, the mean confidence, the share that were right."""
    out = []
    for lo, hi in itertools.pairwise(edges):
        inside = (p >= lo) & (p < hi)
        if inside.any():
            out.append({"from": lo, "to": min(hi, 1.0), "n": int(inside.sum()),
                        "confidence": float(p[inside].mean()), "right": float(y[inside].mean())})  # fmt: skip
    return out


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def main(argv: list[str] | None = None) -> int:
    from calmd.quality.replay import ReplayConfig, collect_rows

    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--model", type=Path, default=None, help="weights (default: the packaged model)")
    parser.add_argument("--output", type=Path, default=packaged_calibration_path())
    parser.add_argument("--positions", type=int, default=40, help="sampled positions per training user")
    parser.add_argument("--seed", type=int, default=1, help="positions differ from the replay's (seed 0)")
    parser.add_argument("--check-held-out", action="store_true",
                        help="also print the reliability on the held-out users (measuring only)")  # fmt: skip
    args = parser.parse_args(argv)

    started = time.monotonic()
    users = history_users(args.data)
    train = [p for p in users if not held_out(p.stem)]
    if not train:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    cfg = ReplayConfig(model=args.model or paths.packaged_weights(), positions=args.positions, seed=args.seed,
                       typing_positions=0, anchor=False)  # fmt: skip
    read_cwgt(cfg.model)  # a bad file named as given: the replay reads a copy in a temporary folder
    rows = collect_rows(train, cfg, uncalibrated())
    if not len(rows.candidate_y) or not len(rows.early_y):  # fit_head has nothing to fit
        raise CalmError(f"{args.data}: the replay of {len(train)} training users gave no candidates to fit "
                        "on; give longer histories or more --positions")  # fmt: skip
    cand = fit_head(FEATURES, rows.candidate_x, rows.candidate_y)
    early = fit_head(EARLY_FEATURES, rows.early_x, rows.early_y)
    fitted_p = cand.probabilities(rows.candidate_x)
    info = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "training_users": len(train),
        "candidate_rows": len(rows.candidate_y),
        "early_rows": len(rows.early_y),
        "positions": args.positions,
        "seed": args.seed,
        "train_log_loss": round(log_loss(fitted_p, rows.candidate_y), 4),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    calibrator = Calibrator(cand, early, info)
    with atomic_write(args.output, mode=0o644) as out:
        out.write((json.dumps(calibrator.to_json(), indent=1) + "\n").encode())
    print(f"fitted on {len(rows.candidate_y)} candidates and {len(rows.early_y)} early proposals of "
          f"{len(train)} users in {time.monotonic() - started:.0f} s; wrote {args.output}")  # fmt: skip
    for name, head, x, y in (("candidate", cand, rows.candidate_x, rows.candidate_y),
                             ("early", early, rows.early_x, rows.early_y)):  # fmt: skip
        print(
            f"{name}: weights "
            + ", ".join(f"{f} {w:+.2f}" for f, w in zip(head.features, head.w, strict=True))
        )
        print_reliability(f"{name}, training users", head.probabilities(x), y)
    if args.check_held_out:
        test = [p for p in users if held_out(p.stem)]
        held_cfg = ReplayConfig(model=cfg.model, positions=40, seed=0, typing_positions=0, anchor=False)
        held = collect_rows(test, held_cfg, uncalibrated())
        print_reliability("candidate, held-out users", cand.probabilities(held.candidate_x), held.candidate_y)
        print_reliability("early, held-out users", early.probabilities(held.early_x), held.early_y)
    return 0


def print_reliability(title: str, p: np.ndarray, y: np.ndarray) -> None:
    print(f"{title}: {len(y)} rows, log loss {log_loss(p, y):.4f}")
    for b in reliability(p, y):
        span = f"{b['from']:.1f}-{b['to']:.1f}"
        print(f"  {span}: n {b['n']:>6}  confidence {b['confidence']:.3f}  right {b['right']:.3f}")


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
