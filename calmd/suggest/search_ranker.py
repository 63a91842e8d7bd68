"""The history search's fitted scorer: SEARCH_FEATURES, one row per pooled command (computed by
`SearchIndex.features`, calmd/suggest/search.py), scored by a one-hidden-layer network fitted on
the public histories (calmd/data/search_ranker.json, `python -m calmd.quality.fit_search`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import check_format, read_json
from calmd.errors import FormatError
from calmd.suggest.ranking import Ranker, read_scorer_weights

SEARCH_RANKER_VERSION = 1
SEARCH_FEATURES = (
    "ranker",  # calmd's history ranker's score of it as the next command here (calmd/suggest/ranking.py)
    "log_runs",  # log(1 + times run)
    "log_distance",  # log(1 + commands run since its latest run)
    "log_recency_rank",  # log(1 + its rank among the matches by latest run)
    "log_frequency_rank",  # log(1 + its rank among the matches by runs)
    "substrings",  # share of the query's terms found as typed (not as scattered letters)
    "word_starts",  # share of the terms found as typed at the start of a word
    "prefix",  # it starts with the query's first term
    "first_word",  # its first word is the query's first term
    "log_gap",  # log(1 + letters skipped between the letters of terms found scattered)
    "log_length",  # log(1 + its length in bytes)
    "log_folder_runs",  # log(1 + times run in the current folder)
    "folder_last",  # its latest run was in the current folder
    "empty_query",
)


@dataclass(frozen=True)
class SearchRanker:
    """The fitted search scorer: standardisation, one tanh hidden layer, a linear output (the
    same form as the history ranker's, over SEARCH_FEATURES)."""

    mean: np.ndarray
    scale: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: float
    info: dict[str, Any] = field(default_factory=dict)

    def scores(self, rows: np.ndarray) -> np.ndarray:
        hidden = np.tanh(((rows - self.mean) / self.scale) @ self.w1 + self.b1)
        return np.asarray(hidden @ self.w2 + self.b2, dtype=np.float64)

    @classmethod
    def neutral(cls, hidden: int = 1) -> SearchRanker:
        """Every line scored the same (the pool then keeps its order): what the fit starts from."""
        f = len(SEARCH_FEATURES)
        return cls(np.zeros(f), np.ones(f), np.zeros((f, hidden)), np.zeros(hidden), np.zeros(hidden), 0.0)

    @classmethod
    def from_ranker(cls, fitted: Ranker, info: dict[str, Any]) -> SearchRanker:
        return cls(fitted.mean, fitted.scale, fitted.w1, fitted.b1, fitted.w2, fitted.b2, info)

    def to_json(self) -> dict[str, Any]:
        return {"format": "calm-search-ranker", "version": SEARCH_RANKER_VERSION,
                "features": list(SEARCH_FEATURES), "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "w1": self.w1.tolist(), "b1": self.b1.tolist(), "w2": self.w2.tolist(), "b2": self.b2,
                "info": self.info}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, source: str = "search ranker") -> SearchRanker:
        data = check_format(data, "calm-search-ranker", SEARCH_RANKER_VERSION, source)
        if data.get("features") != list(SEARCH_FEATURES):
            raise FormatError(
                f"{source}: features differ from this calmd's (python -m calmd.quality.fit_search refits)"
            )
        arrays, b2 = read_scorer_weights(data, len(SEARCH_FEATURES), source)
        return cls(arrays["mean"], arrays["scale"], arrays["w1"], arrays["b1"], arrays["w2"], b2,
                   dict(data.get("info") or {}))  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> SearchRanker:
        return cls.from_json(read_json(path, "search ranker"), str(path))


def packaged_search_ranker_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_SEARCH_RANKER


@functools.cache
def packaged_search_ranker() -> SearchRanker:
    return SearchRanker.load(packaged_search_ranker_path())
