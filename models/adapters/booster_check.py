"""Structural checks of XGBoost and LightGBM files before their libraries read them.

The libraries trust their files: a split index past the features, a child index out of range
or a cycle, a truncated LightGBM file make them read out of bounds or loop (SIGSEGV, SIGABRT).
Each check parses the file itself, refuses what is inconsistent with an InvalidModelError that
names it, and returns the bytes to hand to the library re-serialised from what was checked (so
that a difference between this parser and the library's cannot smuggle anything through):

- XGBoost JSON / UBJSON (`xgboost_checked`): learner parameters (num_feature, num_class,
  num_target, a finite base_score), the booster (gbtree, dart, gblinear), and for every tree the
  per-node arrays' lengths, children in range forming a tree (each node one parent, children
  after their parent, parents consistent), split indices < num_feature, finite thresholds and
  leaf values, categorical segments inside the category list; duplicate keys are refused.
- LightGBM text (`lightgbm_checked`): the header fields, each tree's num_leaves and arrays,
  split_feature <= max_feature_idx, left_child/right_child forming a tree, categorical
  boundaries, finite values, `end of trees` present (a truncated file is refused). The
  `parameters:` section (training settings, file names among them) is not passed on.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from models.adapters.booster_ubjson import UbjError, dump_ubjson, load_ubjson
from models.declaration import InvalidModelError

MAX_FEATURES = 1 << 22
MAX_CATEGORY = 1 << 20  # XGBoost allocates a bitset up to the largest category
_NO_PARENT = (2147483647, -1)


class BoosterFileError(InvalidModelError):
    """The booster file is malformed (400)."""


def _fail(msg: str) -> BoosterFileError:
    return BoosterFileError(msg[:500])


def _int(value: Any, what: str, low: int = 0, high: int = 1 << 31) -> int:
    try:
        if isinstance(value, str):
            value = value.strip()
            out = int(value) if value.lstrip("-").isdigit() else int(float(value))
        elif isinstance(value, bool | float):
            raise ValueError
        else:
            out = int(value)
    except (TypeError, ValueError, OverflowError):
        raise _fail(f"{what} must be an integer, not {str(value)[:40]!r}") from None
    if not low <= out <= high:
        raise _fail(f"{what} is {out}; expected {low}..{high}")
    return out


def _ints(value: Any, what: str) -> np.ndarray:
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iub"):
        raise _fail(f"{what} must be a list of integers")
    return arr.astype(np.int64, copy=False)


def _floats(value: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise _fail(f"{what} must be a list of numbers") from None
    if arr.ndim != 1:
        raise _fail(f"{what} must be a list of numbers")
    if not np.all(np.isfinite(arr)):
        raise _fail(f"{what} holds a value that is not finite")
    return arr


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _fail(f"XGBoost JSON: key {k!r} appears twice in one object")
        out[k] = v
    return out


def _finite_constant(name: str) -> float:
    raise _fail(f"XGBoost JSON: {name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _fail(f"XGBoost JSON: {text[:40]} is not a finite number")
    return value


# --- XGBoost ---------------------------------------------------------------------------------


def xgboost_checked(data: bytes) -> bytes:
    """The checked model re-serialised (JSON stays JSON, UBJSON stays UBJSON)."""
    ubj = not data.lstrip()[:2].startswith(b'{"') and data[:1] == b"{"
    try:
        if ubj:
            model = load_ubjson(data)
        else:
            model = json.loads(
                data,
                object_pairs_hook=_no_duplicates,
                parse_constant=_finite_constant,
                parse_float=_finite_float,
            )
    except BoosterFileError:
        raise
    except (UbjError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        kind = "UBJSON" if ubj else "JSON"
        raise _fail(f"not an XGBoost model ({kind}): {str(exc)[:200]}") from None
    _check_xgboost(model)
    try:
        if ubj:
            return dump_ubjson(model)
        return json.dumps(model, separators=(",", ":"), allow_nan=False).encode()
    except (UbjError, ValueError, TypeError, OverflowError) as exc:
        raise _fail(f"XGBoost model cannot be re-encoded: {str(exc)[:200]}") from None


def _get(obj: Any, key: str, what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _fail(f"XGBoost model: {what} has no {key!r}")
    return obj[key]


def _base_score(raw: Any) -> list[float]:
    text = str(raw).strip()
    parts = text.strip("[]").replace(",", " ").split() if text else []
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise _fail(f"XGBoost base_score {text[:40]!r} is not a number") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise _fail(f"XGBoost base_score {text[:40]!r} must be finite")
    return values


def _check_xgboost(model: Any) -> None:
    learner = _get(model, "learner", "the file")
    param = _get(learner, "learner_model_param", "learner")
    n_features = _int(_get(param, "num_feature", "learner_model_param"), "num_feature", 1,
                      MAX_FEATURES)  # fmt: skip
    n_class = _int(param.get("num_class", "0"), "num_class", 0, 1 << 16)
    n_target = _int(param.get("num_target", "1"), "num_target", 1, 1 << 16)
    scores = _base_score(param.get("base_score", "0.5"))
    groups = max(n_class, n_target, 1)
    if len(scores) not in (1, groups):
        raise _fail(f"XGBoost base_score has {len(scores)} values for {groups} outputs")
    objective = str(_get(_get(learner, "objective", "learner"), "name", "objective"))
    if objective.startswith("multi:") and n_class < 1:
        raise _fail(f"XGBoost objective {objective} needs num_class >= 1")
    if not objective.startswith("multi:") and n_class > 1:
        raise _fail(f"XGBoost num_class is {n_class} but objective {objective} has one class")
    for key in ("feature_names", "feature_types"):
        names = learner.get(key) or []
        if not isinstance(names, list) or len(names) not in (0, n_features):
            raise _fail(f"XGBoost {key} lists {len(names)} names for {n_features} features")
        if not all(isinstance(n, str) for n in names):
            raise _fail(f"XGBoost {key} must be strings")
    booster = _get(learner, "gradient_booster", "learner")
    name = _get(booster, "name", "gradient_booster")
    if name == "gblinear":
        weights = _floats(_get(_get(booster, "model", "gblinear"), "weights", "gblinear"),
                          "gblinear weights")  # fmt: skip
        if weights.size != (n_features + 1) * groups:
            raise _fail(
                f"XGBoost gblinear has {weights.size} weights; expected {(n_features + 1) * groups}"
            )
        return
    if name == "dart":
        trees_model = _get(_get(booster, "gbtree", "dart"), "model", "dart gbtree")
        n = _check_gbtree(trees_model, n_features, groups, n_target)
        if len(_floats(booster.get("weight_drop", []), "dart weight_drop")) != n:
            raise _fail("XGBoost dart weight_drop must have one weight per tree")
        return
    if name != "gbtree":
        raise _fail(f"XGBoost booster {str(name)[:40]!r} is not gbtree, dart or gblinear")
    _check_gbtree(_get(booster, "model", "gbtree"), n_features, groups, n_target)


def _check_gbtree(model: Any, n_features: int, groups: int, n_target: int = 1) -> int:
    trees = _get(model, "trees", "gbtree model")
    if not isinstance(trees, list):
        raise _fail("XGBoost trees must be a list")
    param = _get(model, "gbtree_model_param", "gbtree model")
    n_trees = _int(param.get("num_trees", len(trees)), "num_trees")
    if n_trees != len(trees):
        raise _fail(f"XGBoost num_trees is {n_trees} but the file has {len(trees)} trees")
    info = _ints(model.get("tree_info", [0] * len(trees)), "tree_info")
    if info.size != len(trees) or (info.size and (info.min() < 0 or info.max() >= groups)):
        raise _fail(f"XGBoost tree_info must give each of {len(trees)} trees a group < {groups}")
    indptr = _ints(model.get("iteration_indptr", [0, len(trees)]), "iteration_indptr")
    if indptr.size and (indptr[0] != 0 or indptr[-1] != len(trees) or np.any(np.diff(indptr) < 0)):
        raise _fail("XGBoost iteration_indptr must rise from 0 to the number of trees")
    for i, tree in enumerate(trees):
        _check_tree(tree, i, n_features, n_target)
    return len(trees)


_NODE_ARRAYS = ("left_children", "right_children", "parents", "split_indices",
                "split_conditions", "default_left")  # fmt: skip
_OPTIONAL_NODE_ARRAYS = ("split_type", "loss_changes", "sum_hessian")


def _check_tree(tree: Any, i: int, n_features: int, n_target: int) -> None:
    what = f"XGBoost tree {i}"
    if "id" in tree and _int(tree["id"], f"{what} id") != i:  # XGBoost indexes trees by it
        raise _fail(f"{what} has id {tree['id']}; trees must be numbered 0, 1, ... in order")
    param = _get(tree, "tree_param", what)
    n = _int(_get(param, "num_nodes", f"{what} tree_param"), f"{what} num_nodes", 1)
    leaf_size = _int(param.get("size_leaf_vector", "1"), f"{what} size_leaf_vector", 0, 1 << 16)
    if leaf_size > 1 and leaf_size != n_target:  # a vector leaf: one value per target
        raise _fail(f"{what}: size_leaf_vector {leaf_size} but the model has {n_target} target")
    if "num_feature" in param and _int(param["num_feature"], f"{what} num_feature") != n_features:
        raise _fail(f"{what}: num_feature differs from the learner's {n_features}")
    if _int(param.get("num_deleted", "0"), f"{what} num_deleted") != 0:
        raise _fail(f"{what}: deleted nodes are not supported")
    arrays = {k: _get(tree, k, what) for k in _NODE_ARRAYS}
    arrays.update({k: tree[k] for k in _OPTIONAL_NODE_ARRAYS if k in tree})
    for key, value in arrays.items():
        if not isinstance(value, list | np.ndarray) or len(value) != n:
            size = len(value) if isinstance(value, list | np.ndarray) else "no"
            raise _fail(f"{what}: {key} has {size} entries for {n} nodes")
    for key in ("loss_changes", "sum_hessian"):
        if key in arrays:
            _floats(arrays[key], f"{what} {key}")
    left = _ints(arrays["left_children"], f"{what} left_children")
    right = _ints(arrays["right_children"], f"{what} right_children")
    parents = _ints(arrays["parents"], f"{what} parents")
    split = _ints(arrays["split_indices"], f"{what} split_indices")
    _floats(arrays["split_conditions"], f"{what} split_conditions")
    weights = _floats(tree.get("base_weights", []), f"{what} base_weights")
    if weights.size != n * max(leaf_size, 1):
        raise _fail(f"{what}: base_weights has {weights.size} entries for {n} nodes")
    if np.any(~np.isin(_ints(arrays["default_left"], f"{what} default_left"), (0, 1))):
        raise _fail(f"{what}: default_left must be 0 or 1")
    _check_children(what, left, right, n)
    internal = left != -1
    nodes = np.arange(n)
    if (
        parents[0] not in _NO_PARENT
        or np.any(parents[left[internal]] != nodes[internal])
        or (np.any(parents[right[internal]] != nodes[internal]))
    ):
        raise _fail(f"{what}: parents do not match the children")
    bad = internal & ((split < 0) | (split >= n_features))
    if np.any(bad):
        node = int(np.argmax(bad))
        raise _fail(
            f"{what} node {node}: split index {int(split[node])} is out of range; the model "
            f"has {n_features} features"
        )
    kinds = _ints(arrays.get("split_type", [0] * n), f"{what} split_type")
    if np.any(~np.isin(kinds, (0, 1))):
        raise _fail(f"{what}: split_type must be 0 (numerical) or 1 (categorical)")
    _check_categories(tree, what, kinds, internal)


def _check_children(what: str, left: np.ndarray, right: np.ndarray, n: int) -> None:
    leaf = left == -1
    if np.any(leaf != (right == -1)):
        raise _fail(f"{what}: a node has one child")
    nodes = np.arange(n)
    kids = np.concatenate([left[~leaf], right[~leaf]])
    parent_of = np.concatenate([nodes[~leaf], nodes[~leaf]])
    if kids.size != n - 1 or np.any(kids < 1) or np.any(kids >= n):
        raise _fail(f"{what}: child indices must lie in 1..{n - 1}, one per non-root node")
    if np.unique(kids).size != kids.size:
        raise _fail(f"{what}: a node is the child of two nodes")
    if np.any(kids <= parent_of):  # with one parent each: no cycle, everything under the root
        raise _fail(f"{what}: a child index is not after its parent's (a cycle?)")


def _check_categories(tree: Any, what: str, kinds: np.ndarray, internal: np.ndarray) -> None:
    nodes = _ints(tree.get("categories_nodes", []), f"{what} categories_nodes")
    segments = _ints(tree.get("categories_segments", []), f"{what} categories_segments")
    sizes = _ints(tree.get("categories_sizes", []), f"{what} categories_sizes")
    cats = _ints(tree.get("categories", []), f"{what} categories")
    categorical = np.flatnonzero((kinds == 1) & internal)
    if nodes.size != segments.size or nodes.size != sizes.size:
        raise _fail(f"{what}: categories_nodes, _segments and _sizes differ in length")
    if not np.array_equal(np.sort(nodes), categorical):
        raise _fail(f"{what}: categories_nodes must list the categorical splits")
    if np.any(segments < 0) or np.any(sizes < 0) or np.any(segments + sizes > cats.size):
        raise _fail(f"{what}: a categorical split's segment lies outside the categories")
    if cats.size and (cats.min() < 0 or cats.max() >= MAX_CATEGORY):
        raise _fail(f"{what}: categories must lie in 0..{MAX_CATEGORY - 1}")
