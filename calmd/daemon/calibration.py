"""Confidence: the calibrated probability that a suggestion is the whole line the user runs.

The engine's scores rank candidates but are not probabilities one can threshold: a mixture
score of -2 means "likely" after `git pus` and little on an empty prompt. The shells show
ghost text only when the top candidate's confidence reaches `calmd.daemon.protocol.DEFAULT_MIN_CONFIDENCE`
(silence beats noise), so the confidence has to mean what it says: of the suggestions given
confidence 0.7, about 70% are right.

A logistic regression on a few signals the engine knows when it streams a candidate (FEATURES:
the mixture's log-probability, the history probability and the best one of the keystroke,
whether only the model proposed it, its rank, the typed length, the model's belief that the
input is already complete, ...), followed by an isotonic map (the logistic orders, the map
makes the numbers mean what they say), and another for the `early` proposal, made before the
model runs (EARLY_FEATURES: the history side alone). They are fitted by maximum likelihood on
the engine's own suggestions at the replay positions of the *training* users (never the
held-out ones that `calm replay --held-out` measures):

    python -m calmd.daemon.calibration [--data ../shared/data] [--output calmd/data/calibration.json]

(about 5 min on one core; deterministic: the same data, model and ranker give the same file).
Commands that never succeeded (or whose latest run was "not found") get confidence 0: the
public histories carry no exit codes to calibrate them on, and a failed line is never worth
a ghost.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import atomic_write
from calmd.errors import FormatError

CALIBRATION_VERSION = 1
LOG_P_FLOOR = -30.0  # mixture log-probabilities below this are all "hopeless" alike
FEATURES = (
    "log_p",  # the mixture's log-probability of the whole line (the ranking score), >= LOG_P_FLOOR
    "p_hist",  # its history probability P_hist (0: not a history proposal)
    "top_p_hist",  # the best history probability of this keystroke
    "model_only",  # neither the user's history nor a carry-over proposed it
    "carry",  # a carry-over (a new line made of a past head and the previous command's words)
    "first",  # it is the top candidate
    "log_rank",  # log(1 + rank)
    "log_k",  # log(1 + characters typed)
    "empty_input",
    "p_end",  # the model's P(end of line) right after the input: is the input complete already?
    "input_run_before",  # the input itself is a command the user ran
    "log_count",  # log(1 + times the user ran it)
    "log_history",  # log(1 + commands in the history)
    # an empty prompt is another game (nothing typed narrows it down): its own slopes
    "empty_x_log_p",
    "empty_x_p_hist",
    "empty_x_top_p_hist",
    "empty_x_log_count",
    "p",  # the mixture's probability itself, and sqrt(P_hist): curvature the logistic lacks
    "sqrt_p_hist",
)
EARLY_FEATURES = (
    "p_hist",  # the proposal's history probability (the best of the keystroke)
    "second_p_hist",  # the runner-up's
    "carry",
    "log_k",
    "empty_input",
    "input_run_before",
    "log_count",
    "log_history",
)


def candidate_row(
    *, log_p: float, p_hist: float, top_p_hist: float, model_only: bool, carry: bool, rank: int, k: int,
    p_end: float, input_run_before: bool, count: int, history: int,
) -> np.ndarray:  # fmt: skip
    """FEATURES for one candidate   (len(FEATURES),)"""
    log_p = max(log_p, LOG_P_FLOOR)
    empty = float(k == 0)
    return np.array(
        [log_p, p_hist, top_p_hist, model_only, carry, rank == 0, math.log1p(rank), math.log1p(k), empty,
         p_end, input_run_before, math.log1p(count), math.log1p(history), empty * log_p, empty * p_hist,
         empty * top_p_hist, empty * math.log1p(count), math.exp(log_p), math.sqrt(max(p_hist, 0.0))],
        dtype=np.float64,
    )  # fmt: skip


def early_row(
    *,
    p_hist: float,
    second_p_hist: float,
    carry: bool,
    k: int,
    input_run_before: bool,
    count: int,
    history: int,
) -> np.ndarray:
    """EARLY_FEATURES for the early proposal   (len(EARLY_FEATURES),)"""
    return np.array(
        [p_hist, second_p_hist, carry, math.log1p(k), k == 0, input_run_before, math.log1p(count),
         math.log1p(history)],
        dtype=np.float64,
    )  # fmt: skip


@dataclass(frozen=True)
class Head:
    """One logistic regression, p = sigmoid(w . (x - mean) / scale + b), then an isotonic
    (monotonic, piecewise linear) map of p through the knots (knots_x -> knots_y): the logistic
    orders the suggestions, the map corrects the S-shape a linear score cannot follow."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    w: np.ndarray
    b: float
    knots_x: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0]))
    knots_y: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0]))

    def logistic(self, rows: np.ndarray) -> np.ndarray:
        z = ((rows - self.mean) / self.scale) @ self.w + self.b
        return 1.0 / (1.0 + np.exp(-np.clip(z, -700, 700)))

    def probability(self, row: np.ndarray) -> float:
        return float(self.probabilities(row[None])[0])

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        return np.interp(self.logistic(rows), self.knots_x, self.knots_y)

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "w": self.w.tolist(), "b": self.b, "knots_x": [round(float(x), 5) for x in self.knots_x],
                "knots_y": [round(float(y), 5) for y in self.knots_y]}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, features: tuple[str, ...], source: str) -> Head:
        if not isinstance(data, dict):
            raise FormatError(f"{source}: a head must be a map")
        if data.get("features") != list(features):
            raise FormatError(
                f"{source}: features differ from this calmd's (python -m calmd.daemon.calibration refits)"
            )
        try:
            arrays = {k: np.asarray(data[k], dtype=np.float64) for k in ("mean", "scale", "w")}
            b = float(data["b"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{source}: bad or missing field: {exc}") from exc
        for key, array in arrays.items():
            if array.shape != (len(features),) or not np.isfinite(array).all():
                raise FormatError(f"{source}: field {key!r} must be {len(features)} finite numbers")
        if (arrays["scale"] <= 0).any() or not math.isfinite(b):
            raise FormatError(f"{source}: 'scale' must be positive and 'b' finite")
        try:
            kx = np.asarray(data["knots_x"], dtype=np.float64)
            ky = np.asarray(data["knots_y"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"{source}: bad or missing knots: {exc}") from exc
        shaped = kx.ndim == 1 and kx.shape == ky.shape and len(kx) >= 2
        if (not shaped or not (np.isfinite(kx).all() and np.isfinite(ky).all()) or (np.diff(kx) <= 0).any()
                or (np.diff(ky) < 0).any() or ky.min() < 0 or ky.max() > 1):  # fmt: skip
            raise FormatError(f"{source}: the knots must be increasing x and non-decreasing y in [0, 1]")
        return cls(features, arrays["mean"], arrays["scale"], arrays["w"], b, kx, ky)


@dataclass(frozen=True)
class Calibrator:
    candidate: Head
    early: Head
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": "calm-calibration", "version": CALIBRATION_VERSION,
                "candidate": self.candidate.to_json(), "early": self.early.to_json(),
                "info": self.info}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, source: str = "calibration") -> Calibrator:
        if not isinstance(data, dict) or data.get("format") != "calm-calibration":
            raise FormatError(f"{source}: not a calm-calibration file")
        if data.get("version") != CALIBRATION_VERSION:
            raise FormatError(
                f"{source}: version {data.get('version')!r}, this calmd reads {CALIBRATION_VERSION}"
            )
        return cls(Head.from_json(data.get("candidate"), FEATURES, f"{source}: candidate"),
                   Head.from_json(data.get("early"), EARLY_FEATURES, f"{source}: early"),
                   dict(data.get("info") or {}))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Calibrator:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{path}: cannot read the calibration: {exc}") from exc
        return cls.from_json(data, str(path))


def packaged_calibration_path() -> Path:
    return paths.PACKAGE_DATA / "calibration.json"


_PACKAGED: Calibrator | None = None


def packaged_calibrator() -> Calibrator:
    global _PACKAGED
    if _PACKAGED is None:
        _PACKAGED = Calibrator.load(packaged_calibration_path())
    return _PACKAGED


def uncalibrated() -> Calibrator:
    """Before any fit: every confidence 0.5. The fitting command collects its rows with it (the
    features do not depend on the calibration); the package ships a fitted file."""
    cand = np.zeros(len(FEATURES))
    early = np.zeros(len(EARLY_FEATURES))
    return Calibrator(
        Head(FEATURES, cand, np.ones(len(FEATURES)), cand, 0.0),
        Head(EARLY_FEATURES, early, np.ones(len(EARLY_FEATURES)), early, 0.0),
        {"uncalibrated": True},
    )


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
    from calmd.training.recipe import DEFAULT_DATA, held_out, history_users

    parser = argparse.ArgumentParser(
        prog="python -m calmd.daemon.calibration", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--model", type=Path, default=None, help="weights (default: the packaged model)")
    parser.add_argument("--output", type=Path, default=packaged_calibration_path())
    parser.add_argument("--positions", type=int, default=40, help="sampled positions per training user")
    parser.add_argument("--seed", type=int, default=1, help="positions differ from the replay's (seed 0)")
    parser.add_argument("--check-held-out", action="store_true",
                        help="also print the reliability on the held-out users (measuring only)")  # fmt: skip
    args = parser.parse_args(argv)
    from calmd.daemon.engine import packaged_model

    started = time.monotonic()
    users = history_users(args.data)
    train = [p for p in users if not held_out(p.stem)]
    if not train:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    cfg = ReplayConfig(model=args.model or packaged_model(), positions=args.positions, seed=args.seed,
                       typing_positions=0)  # fmt: skip
    rows = collect_rows(train, cfg, uncalibrated())
    cand = fit_head(FEATURES, rows.candidate_x, rows.candidate_y)
    early = fit_head(EARLY_FEATURES, rows.early_x, rows.early_y)
    fitted_p = cand.probabilities(rows.candidate_x)
    info = {
        "command": " ".join(
            ["python -m calmd.daemon.calibration", *(sys.argv[1:] if argv is None else argv)]
        ),
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
        held = collect_rows(test, ReplayConfig(model=cfg.model, positions=40, seed=0, typing_positions=0),
                            uncalibrated())  # fmt: skip
        print_reliability("candidate, held-out users", cand.probabilities(held.candidate_x), held.candidate_y)
        print_reliability("early, held-out users", early.probabilities(held.early_x), held.early_y)
    return 0


def print_reliability(title: str, p: np.ndarray, y: np.ndarray) -> None:
    print(f"{title}: {len(y)} rows, log loss {log_loss(p, y):.4f}")
    for b in reliability(p, y):
        span = f"{b['from']:.1f}-{b['to']:.1f}"
        print(f"  {span}: n {b['n']:>6}  confidence {b['confidence']:.3f}  right {b['right']:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
