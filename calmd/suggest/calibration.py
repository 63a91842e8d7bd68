"""Confidence: the calibrated probability that a suggestion is the whole line the user runs.

The engine's scores rank candidates but are not probabilities one can threshold: a mixture
score of -2 means "likely" after `git pus` and little on an empty prompt. The shells show
ghost text only when the top candidate's confidence reaches `calmd.protocol.DEFAULT_MIN_CONFIDENCE`
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

    python -m calmd.quality.fit_calibration [--data ../shared/data] [--output calmd/data/calibration.json]

(about 5 min on one core; deterministic: the same data, model and ranker give the same file).
Commands that never succeeded (or whose latest run was "not found") get confidence 0: the
public histories carry no exit codes to calibrate them on, and a failed line is never worth
a ghost.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import check_format, read_json
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
                f"{source}: features differ from this calmd's "
                "(python -m calmd.quality.fit_calibration refits)"
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
        data = check_format(data, "calm-calibration", CALIBRATION_VERSION, source)
        return cls(Head.from_json(data.get("candidate"), FEATURES, f"{source}: candidate"),
                   Head.from_json(data.get("early"), EARLY_FEATURES, f"{source}: early"),
                   dict(data.get("info") or {}))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Calibrator:
        return cls.from_json(read_json(path, "calibration"), str(path))


def packaged_calibration_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_CALIBRATION


@functools.cache
def packaged_calibrator() -> Calibrator:
    """The calibration shipped in the package, read once per process."""
    return Calibrator.load(packaged_calibration_path())


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
