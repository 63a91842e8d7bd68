"""The history ranker's scorer and its files: FEATURES rows in, scores and P_hist out.

A one-hidden-layer network, s = w2 . tanh(W1 (x - mu) / sd + b1) + b2, softmaxed over the pool
(calmd/suggest/ranking.py says what is pooled and what the features are). The packaged weights
(calmd/data/ranker.json) are fitted by `python -m calmd.quality.fit_ranker`; the user's own
(`ranker.json` beside the weights) by the background run's refit. Every file read here is
validated, for shape and for sense (`check_sense`): a file that cannot rank is refused with the
field named, and the packaged ranker serves.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import parse_json, read_json, read_regular_file
from calmd.errors import FormatError, one_line
from calmd.suggest.carry import NO_PRIOR, CarryPrior
from calmd.suggest.ranking import FEATURES

log = logging.getLogger("calmd")

RANKER_VERSION = 1
# What a fitted scorer's weights may be (check_sense): the packaged ones lie from 5e-12 to 6.
WEIGHT_FLOOR, WEIGHT_LIMIT = 1e-30, 1e4  # below the floor, only 0 (and no subnormal number)
SCALE_FLOOR = 1e-4  # a feature's standard deviation: the packaged ones are 0.001 or more
MAX_RANKER_BYTES = 4 << 20  # the user's ranker file is read whole: 26 kB written, anything larger is not ours


@dataclass(frozen=True)
class Ranker:
    """The fitted scorer: standardisation, one tanh hidden layer, a linear output."""

    mean: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    w1: np.ndarray  # (F, H)
    b1: np.ndarray  # (H,)
    w2: np.ndarray  # (H,)
    b2: float
    info: dict[str, Any]
    prior: CarryPrior = NO_PRIOR  # the corpus_carry_share feature's table

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """(n, F) features -> (n,) scores; higher is likelier."""
        hidden = np.tanh(((rows - self.mean) / self.scale) @ self.w1 + self.b1)
        return hidden @ self.w2 + self.b2

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        """softmax of the scores over the pool   (n,)"""
        if len(rows) == 0:
            return np.zeros(0)
        s = self.scores(rows).astype(np.float64)
        e = np.exp(s - s.max())
        return e / e.sum()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "calm-ranker",
            "version": RANKER_VERSION,
            "features": list(FEATURES),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "w1": self.w1.tolist(),
            "b1": self.b1.tolist(),
            "w2": self.w2.tolist(),
            "b2": self.b2,
            "carry_prior": self.prior.to_json(),
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "ranker") -> Ranker:
        def need(key: str) -> Any:
            if not isinstance(data, dict) or key not in data:
                raise FormatError(f"{source}: missing field {key!r}")
            return data[key]

        if need("format") != "calm-ranker":
            raise FormatError(f"{source}: format is {data['format']!r}, expected 'calm-ranker'")
        if need("version") != RANKER_VERSION:
            raise FormatError(f"{source}: version {data['version']!r}, this calmd reads {RANKER_VERSION}")
        if need("features") != list(FEATURES):
            raise FormatError(
                f"{source}: features differ from this calmd's (python -m calmd.quality.fit_ranker refits)"
            )
        arrays, b2 = read_scorer_weights(data, len(FEATURES), source)
        prior = CarryPrior.from_json(need("carry_prior"), source)
        return cls(arrays["mean"], arrays["scale"], arrays["w1"], arrays["b1"], arrays["w2"], b2,
                   dict(data.get("info", {})), prior)  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Ranker:
        return cls.from_json(read_json(path, "ranker"), str(path))


def read_scorer_weights(
    data: dict[str, Any], features: int, source: str
) -> tuple[dict[str, np.ndarray], float]:
    """The arrays of a fitted scorer file (the history ranker's, the search ranker's):
    standardisation (mean, scale), one tanh hidden layer (w1, b1), a linear output (w2, b2),
    checked for presence, shape, finiteness and a positive scale. FormatError names the field."""
    try:
        arrays = {k: np.asarray(data[k], dtype=np.float64) for k in ("mean", "scale", "w1", "b1", "w2")}
        b2 = float(data["b2"])
    except KeyError as exc:
        raise FormatError(f"{source}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{source}: a weight is not a number array: {exc}") from exc
    hidden = arrays["b1"].shape[0] if arrays["b1"].ndim == 1 else -1
    shapes = {"mean": (features,), "scale": (features,), "w1": (features, hidden), "b1": (hidden,),
              "w2": (hidden,)}  # fmt: skip
    for key, shape in shapes.items():
        if arrays[key].shape != shape:
            raise FormatError(f"{source}: field {key!r} has shape {arrays[key].shape}, expected {shape}")
    if not all(np.isfinite(a).all() for a in arrays.values()) or not math.isfinite(b2):
        raise FormatError(f"{source}: weights are not finite")
    if (arrays["scale"] <= 0).any():
        raise FormatError(f"{source}: field 'scale' must be positive")
    check_sense(arrays, b2, source)
    return arrays, b2


def check_sense(arrays: dict[str, np.ndarray], b2: float, source: str) -> None:
    """FormatError naming the field unless a scorer's weights make sense, not only their shape:
    each one 0 or of a magnitude from WEIGHT_FLOOR (no subnormal number: a subnormal `scale`
    divides the features into infinities) to WEIGHT_LIMIT, a `scale` of SCALE_FLOOR or more, no
    layer all zeros, and scores that are finite and tell the probe rows apart. A ranker file with
    a subnormal scale and a zero layer loaded, and every confidence became 0.0: no ghost was ever
    drawn (issue 30)."""
    for key, values in {**arrays, "b2": np.asarray([b2])}.items():
        magnitude = np.abs(values)
        if ((magnitude > 0) & (magnitude < WEIGHT_FLOOR)).any() or (magnitude > WEIGHT_LIMIT).any():
            raise FormatError(f"{source}: field {key!r} holds a weight outside {WEIGHT_FLOOR:g} to "
                              f"{WEIGHT_LIMIT:g} (nor 0): not weights a fit writes")  # fmt: skip
    if (arrays["scale"] < SCALE_FLOOR).any():
        raise FormatError(f"{source}: field 'scale' is below {SCALE_FLOOR:g}: it would blow the features up")
    for key in ("w1", "w2"):
        if not arrays[key].any():
            raise FormatError(f"{source}: field {key!r} is all zeros: every candidate would score the same")
    mean, scale = arrays["mean"], arrays["scale"]
    probes = np.vstack([mean, mean + np.diag(scale), mean - np.diag(scale)])  # each feature at +-1
    with np.errstate(all="ignore"):
        scores = np.tanh(((probes - mean) / scale) @ arrays["w1"] + arrays["b1"]) @ arrays["w2"] + b2
    if not np.isfinite(scores).all() or np.ptp(scores) == 0:
        raise FormatError(f"{source}: its scores are not finite or do not depend on the features")


def packaged_ranker_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_RANKER


@functools.cache
def packaged_ranker() -> Ranker:
    """The ranker shipped in the package, read once per process."""
    return Ranker.load(packaged_ranker_path())


def read_user_ranker(path: Path) -> Ranker:
    """A user's ranker file (`ranker.json`, `ranker.prev.json`), read safely: a regular file of at
    most MAX_RANKER_BYTES, then validated. OSError, or FormatError when it is not one (bad or too
    deeply nested JSON, the wrong fields)."""
    return Ranker.from_json(
        parse_json(bytes(read_regular_file(path, limit=MAX_RANKER_BYTES)), path), str(path)
    )


def serving_ranker(path: Path) -> tuple[Ranker, str | None]:
    """The ranker that serves with the weights beside `path`: the user's (`ranker.json`, refitted
    by the background run) when the file exists and loads, else the packaged one. Returns it and,
    when the user's file did not load (corrupt, foreign, of another calmd, not a regular file),
    why, in one line that is also logged: the daemon serves on with the packaged ranker."""
    if not path.exists():
        return packaged_ranker(), None
    try:
        return read_user_ranker(path), None
    except (OSError, ValueError, RecursionError, FormatError) as exc:  # JSON errors are ValueErrors
        why = (f"the ranker {path} did not load ({one_line(exc, named=False)}): the packaged ranker serves "
               "until a run rewrites it")  # fmt: skip
        log.error("%s", why)
        return packaged_ranker(), why
