"""A tree ensemble evaluated with numpy: the scorer of the learned rankers fitted with LightGBM.

LightGBM (a library made for ranking: lambdarank) fits the trees offline; the daemon and the
replay never import it. `Forest.from_lightgbm` turns a fitted booster's dump into flat arrays (one
row per node of every tree, the nodes of a tree together), and `scores` walks them: in the
project's C++ library (calmd/model/csrc/forest.cpp, built on first use with the model's kernels),
else with numpy, all the trees for all the rows at once, one level per step. The same scores as
LightGBM's own `predict` (tests/quality/test_anchor.py); what each costs a keystroke is in
bench/reranker_cost.py (docs/performance.md).

A node is a split `x[feature] <= threshold ? left : right` or a leaf (`feature` -1) holding its
value; a row's score is the sum of the leaves it reaches, one per tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmd.atomic import check_format
from calmd.errors import FormatError

MAX_NODES = 1 << 20  # a forest file holds at most this many nodes (a few hundred trees of 63 leaves: 40,000)


@dataclass(frozen=True)
class Forest:
    features: tuple[str, ...]
    feature: np.ndarray  # (nodes,) int: the feature a split reads; -1 for a leaf
    threshold: np.ndarray  # (nodes,) float: go left when x <= threshold
    left: np.ndarray  # (nodes,) int: node index (global)
    right: np.ndarray  # (nodes,) int
    value: np.ndarray  # (nodes,) float: a leaf's value (0 for a split)
    roots: np.ndarray  # (trees,) int
    depth: int  # the deepest leaf's depth: the walk's steps

    def __post_init__(self) -> None:
        for name in ("feature", "left", "right", "roots"):  # what the C++ walk reads, as it reads it
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int64))
        for name in ("threshold", "value"):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.float64))
        object.__setattr__(self, "_masks", _leaf_masks(self))

    def scores(self, rows: np.ndarray, *, cpp: bool = True) -> np.ndarray:
        """(n, F) features -> (n,) scores; higher is likelier. `cpp`: the C++ walk when the
        library is there (False: numpy's, which benchmarks and tests compare with it)."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != len(self.features):
            raise ValueError(f"rows of shape {rows.shape}, the forest reads {len(self.features)} features")
        if len(rows) == 0 or len(self.roots) == 0:
            return np.zeros(len(rows))
        lib = _library() if cpp else None
        if lib is not None:
            out = np.empty(len(rows))
            lib.calm_forest_f64(rows.ctypes.data, len(rows), rows.shape[1], self.feature.ctypes.data,
                                self.threshold.ctypes.data, self.left.ctypes.data, self.right.ctypes.data,
                                self.value.ctypes.data, self.roots.ctypes.data, len(self.roots),
                                out.ctypes.data)  # fmt: skip
            return out
        masks: _Masks | None = getattr(self, "_masks", None)
        if masks is not None:
            return masks.scores(rows)
        node = np.broadcast_to(self.roots, (len(rows), len(self.roots))).copy()
        at = np.arange(len(rows))[:, None]
        for _ in range(self.depth):
            feature = self.feature[node]
            split = feature >= 0
            if not split.any():
                break
            x = rows[at, np.maximum(feature, 0)]
            nxt = np.where(x <= self.threshold[node], self.left[node], self.right[node])
            node = np.where(split, nxt, node)
        return self.value[node].sum(axis=1)

    def to_json(self) -> dict[str, Any]:
        arrays = {"feature": self.feature, "threshold": self.threshold, "left": self.left,
                  "right": self.right, "value": self.value, "roots": self.roots}  # fmt: skip
        return {"features": list(self.features), **{k: v.tolist() for k, v in arrays.items()}}

    @classmethod
    def from_json(cls, data: Any, features: tuple[str, ...], source: str) -> Forest:
        """A forest as `to_json` wrote it, checked: the features this calmd computes, arrays of one
        length, splits on known features whose children are later nodes of the forest (so the walk
        ends), finite thresholds and values. FormatError names the field."""
        if not isinstance(data, dict):
            raise FormatError(f"{source}: the forest must be a map")
        if data.get("features") != list(features):
            raise FormatError(f"{source}: features differ from this calmd's (its fit command rewrites it)")
        try:
            ints = {k: np.asarray(data[k], dtype=np.int64) for k in ("feature", "left", "right", "roots")}
            floats = {k: np.asarray(data[k], dtype=np.float64) for k in ("threshold", "value")}
        except KeyError as exc:
            raise FormatError(f"{source}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise FormatError(f"{source}: a forest field is not a number array: {exc}") from exc
        nodes = len(ints["feature"])
        for key, array in {**ints, **floats}.items():
            if array.ndim != 1 or (key != "roots" and len(array) != nodes):
                raise FormatError(f"{source}: field {key!r} must be a list of {nodes} numbers")
        if nodes > MAX_NODES:
            raise FormatError(f"{source}: {nodes} nodes, more than {MAX_NODES}")
        if not (np.isfinite(floats["threshold"]).all() and np.isfinite(floats["value"]).all()):
            raise FormatError(f"{source}: thresholds and values must be finite")
        feature, left, right, roots = ints["feature"], ints["left"], ints["right"], ints["roots"]
        split = feature >= 0
        index = np.arange(nodes)
        if (feature >= len(features)).any() or (feature < -1).any():
            raise FormatError(f"{source}: field 'feature' names a feature this forest does not have")
        children_ok = (left[split] > index[split]) & (right[split] > index[split])
        if not children_ok.all() or (left[split] >= nodes).any() or (right[split] >= nodes).any():
            raise FormatError(f"{source}: a split's children must be later nodes of the forest")
        if ((roots < 0) | (roots >= nodes)).any():
            raise FormatError(f"{source}: field 'roots' names a node the forest does not have")
        return cls(features, feature, floats["threshold"], left, right, floats["value"], roots,
                   _depth(feature, left, right, roots))  # fmt: skip

    @classmethod
    def from_lightgbm(cls, dump: dict[str, Any], features: tuple[str, ...]) -> Forest:
        """The trees of a LightGBM booster's `dump_model()`, numerical splits only (`<=`; the
        features hold no missing values, so a node's default direction never applies)."""
        feature: list[int] = []
        threshold: list[float] = []
        left: list[int] = []
        right: list[int] = []
        value: list[float] = []
        roots: list[int] = []

        def add(node: dict[str, Any]) -> int:
            at = len(feature)
            feature.append(-1)
            threshold.append(0.0)
            left.append(-1)
            right.append(-1)
            if "leaf_value" in node:
                value.append(float(node["leaf_value"]))
                return at
            assert node["decision_type"] == "<=", node["decision_type"]
            value.append(0.0)
            feature[at] = int(node["split_feature"])
            threshold[at] = float(node["threshold"])
            left[at] = add(node["left_child"])
            right[at] = add(node["right_child"])
            return at

        for tree in dump["tree_info"]:
            roots.append(add(tree["tree_structure"]))
        ints = [np.array(a, dtype=np.int64) for a in (feature, left, right, roots)]
        return cls(features, ints[0], np.array(threshold), ints[1], ints[2], np.array(value), ints[3],
                   _depth(*ints))  # fmt: skip


@dataclass(frozen=True)
class _Masks:
    """The trees as QuickScorer reads them (Lucchese et al., 2015), for numpy: every split at once,
    then per tree the leaves no false test ruled out, of which the leftmost is the exit leaf. A
    split whose row goes right rules out the leaves of its left subtree (`keep`: the others, one
    bit per leaf, left to right); the AND of a tree's masks leaves the exit leaf as its lowest
    bit. One gather, one comparison and one reduction over every split (100 rows through 200 trees
    of 15 leaves: about a millisecond, against 10-17 walking them level by level)."""

    feature: np.ndarray  # (splits,) the splits of every tree, tree by tree
    threshold: np.ndarray
    keep: np.ndarray  # (splits,) uint64
    starts: np.ndarray  # (trees,) each tree's first split (a tree of one leaf has a split ruling out nothing)
    leaves: np.ndarray  # (trees, most leaves) each tree's leaf values, left to right

    def scores(self, rows: np.ndarray) -> np.ndarray:
        right = ~(rows[:, self.feature] <= self.threshold)  # as the C++ walk: NaN goes right
        masks = np.where(right, self.keep, np.uint64(ALL_LEAVES))
        alive = np.bitwise_and.reduceat(masks, self.starts, axis=1)
        exit_bit = alive & (~alive + np.uint64(1))
        leaf = np.log2(exit_bit.astype(np.float64)).astype(np.int64)
        return self.leaves[np.arange(len(self.starts)), leaf].sum(axis=1)


ALL_LEAVES = (1 << 64) - 1


def _tree(forest: Forest, root: int) -> tuple[list[float], list[tuple[int, float, int]]]:
    """One tree's leaf values, left to right, and its splits (feature, threshold, the leaves kept
    when a row goes right: all but those of the left subtree)."""
    leaves: list[float] = []
    splits: list[tuple[int, float, int]] = []

    def walk(node: int) -> tuple[int, int]:  # the first leaf and the count of leaves below `node`
        if forest.feature[node] < 0:
            leaves.append(float(forest.value[node]))
            return len(leaves) - 1, 1
        at = len(splits)
        splits.append((0, 0.0, 0))
        first, n_left = walk(int(forest.left[node]))
        _, n_right = walk(int(forest.right[node]))
        left_bits = ((1 << n_left) - 1) << first
        splits[at] = (int(forest.feature[node]), float(forest.threshold[node]), ALL_LEAVES & ~left_bits)
        return first, n_left + n_right

    walk(root)
    return leaves, splits


def _leaf_masks(forest: Forest) -> _Masks | None:
    """The forest for `_Masks`, None when a tree has more than 64 leaves (the level walk then)."""
    feature: list[int] = []
    threshold: list[float] = []
    keep: list[int] = []
    starts: list[int] = []
    leaf_rows: list[list[float]] = []
    for root in forest.roots.tolist():
        leaves, splits = _tree(forest, root)
        if len(leaves) > 64:
            return None
        starts.append(len(feature))
        for f, t, k in splits or [(0, math.inf, ALL_LEAVES)]:
            feature.append(f)
            threshold.append(t)
            keep.append(k)
        leaf_rows.append(leaves)
    width = max((len(r) for r in leaf_rows), default=1)
    table = np.zeros((len(leaf_rows), width))
    for i, r in enumerate(leaf_rows):
        table[i, : len(r)] = r
    return _Masks(np.array(feature, dtype=np.int64), np.array(threshold), np.array(keep, dtype=np.uint64),
                  np.array(starts, dtype=np.int64), table)  # fmt: skip


def _library() -> Any:
    """The project's C++ library (calmd/model/fastscan.py), None when it cannot be had or is
    switched off (`fastscan.use_cpp`, CALM_NO_CPP_SCAN)."""
    from calmd.model import fastscan

    return fastscan.library() if fastscan.use_cpp else None


def _depth(feature: np.ndarray, left: np.ndarray, right: np.ndarray, roots: np.ndarray) -> int:
    """The deepest leaf's depth below its root (children are later nodes: one pass in order)."""
    depth = np.zeros(len(feature), dtype=np.int64)
    for i in range(len(feature)):
        if feature[i] >= 0:
            depth[left[i]] = depth[right[i]] = depth[i] + 1
    return int(depth.max()) if len(depth) else 0


@dataclass(frozen=True)
class ForestFile:
    """What a forest's file holds (the anchor's and the reranker's): the trees, the training users'
    popularity of each line (`users`: line -> how many of them ran it), and how it was fitted."""

    forest: Forest
    users: dict[str, int]
    info: dict[str, Any]

    def to_json(self, name: str, version: int) -> dict[str, Any]:
        return {"format": name, "version": version, "forest": self.forest.to_json(),
                "users": dict(sorted(self.users.items())), "info": dict(self.info)}  # fmt: skip

    @classmethod
    def from_json(
        cls, data: Any, name: str, version: int, features: tuple[str, ...], source: str
    ) -> ForestFile:
        """A file `to_json` wrote as format `name`, checked (calmd/atomic.py `check_format`, the
        forest's own checks, the users' counts); FormatError names the field."""
        data = check_format(data, name, version, source)
        forest = Forest.from_json(data.get("forest"), features, f"{source}: forest")
        users = data.get("users")
        if not isinstance(users, dict) or not all(
            isinstance(c, str) and isinstance(n, int) and n >= 0 for c, n in users.items()
        ):
            raise FormatError(f"{source}: field 'users' must map lines to counts of users")
        return cls(forest, users, dict(data.get("info") or {}))
