"""Structural checks of a LightGBM text model before LightGBM reads it
(models/adapters/booster_check.py).

`lightgbm_checked(data)` parses the header and every `Tree=` block, refuses what is inconsistent
(BoosterFileError naming it) and returns the model text rebuilt from what was checked: the
header, the trees with their `tree_sizes` recomputed, `end of trees`, and the
`pandas_categorical` line; the `parameters:` section (training settings, file names and ports
among them) and feature importances are left out.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from models.adapters.booster_check import MAX_FEATURES, BoosterFileError, _fail

HEADER_KEYS = ("version", "num_class", "num_tree_per_iteration", "label_index",
               "max_feature_idx", "objective", "average_output", "feature_names",
               "feature_infos", "monotone_constraints")  # fmt: skip
TREE_KEYS = ("num_leaves", "num_cat", "split_feature", "split_gain", "threshold",
             "decision_type", "left_child", "right_child", "leaf_value", "leaf_weight",
             "leaf_count", "internal_value", "internal_weight", "internal_count",
             "cat_boundaries", "cat_threshold", "is_linear", "shrinkage")  # fmt: skip
_INTERNAL = ("split_feature", "split_gain", "threshold", "decision_type", "left_child",
             "right_child", "internal_value", "internal_weight", "internal_count")  # fmt: skip
_LEAF = ("leaf_value", "leaf_weight", "leaf_count")
MAX_LEAVES = 1 << 20
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?inf")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _fields(lines: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            if what == "header" and line.strip() in ("tree", "average_output"):
                out[line.strip()] = ""
                continue
            raise _fail(f"LightGBM {what}: line {line[:60]!r} is not key=value")
        key = key.strip()
        if key in out:
            raise _fail(f"LightGBM {what}: {key} appears twice")
        out[key] = value.strip()
    return out


def _num(fields: dict[str, str], key: str, what: str, low: int = 0, high: int = 1 << 31) -> int:
    if key not in fields:
        raise _fail(f"LightGBM {what}: no {key}")
    try:
        value = int(fields[key])
    except ValueError:
        raise _fail(f"LightGBM {what}: {key}={fields[key][:40]!r} is not an integer") from None
    if not low <= value <= high:
        raise _fail(f"LightGBM {what}: {key}={value}; expected {low}..{high}")
    return value


def _array(fields: dict[str, str], key: str, n: int, what: str, ints: bool) -> np.ndarray:
    raw = fields.get(key, "")
    parts = raw.split(" ") if raw else []  # LightGBM splits on spaces only
    pattern = _INT if ints else _FLOAT
    if not all(pattern.fullmatch(p) for p in parts):
        raise _fail(f"LightGBM {what}: {key} holds a value that is not a number")
    if len(parts) != n:
        raise _fail(f"LightGBM {what}: {key} has {len(parts)} values; expected {n}")
    try:
        arr = np.array([int(p) for p in parts] if ints else [float(p) for p in parts])
    except (ValueError, OverflowError):
        raise _fail(f"LightGBM {what}: {key} holds a value that is not a number") from None
    if not ints and not np.all(np.isfinite(arr)) and key not in ("threshold", "split_gain"):
        raise _fail(f"LightGBM {what}: {key} holds a value that is not finite")
    if not ints and np.any(np.isnan(arr)):
        raise _fail(f"LightGBM {what}: {key} holds NaN")
    return arr.astype(np.int64 if ints else np.float64)


def _check_tree(fields: dict[str, str], i: int, n_features: int) -> None:
    what = f"tree {i}"
    unknown = sorted(set(fields) - set(TREE_KEYS) - {"Tree"})
    if unknown:
        raise _fail(f"LightGBM {what}: unknown field {unknown[0]!r}")
    leaves = _num(fields, "num_leaves", what, 1, MAX_LEAVES)
    if _num(fields, "is_linear", what, 0, 1) if "is_linear" in fields else 0:
        raise _fail(f"LightGBM {what}: linear trees (linear_tree=True) are not supported")
    n_cat = _num(fields, "num_cat", what, 0, MAX_LEAVES) if "num_cat" in fields else 0
    _array(fields, "leaf_value", leaves, what, ints=False)
    for key in _LEAF[1:]:
        if key in fields:
            _array(fields, key, leaves, what, ints=key == "leaf_count")
    if "shrinkage" in fields:
        _array(fields, "shrinkage", 1, what, ints=False)
    if leaves == 1:
        return
    n = leaves - 1
    int_keys = ("split_feature", "decision_type", "left_child", "right_child", "internal_count")
    arrays = {k: _array(fields, k, n, what, ints=k in int_keys) for k in _INTERNAL if k in fields}
    for key in ("split_feature", "threshold", "decision_type", "left_child", "right_child"):
        if key not in arrays:
            raise _fail(f"LightGBM {what}: no {key}")
    feature = arrays["split_feature"]
    if np.any(feature < 0) or np.any(feature >= n_features):
        bad = int(feature[(feature < 0) | (feature >= n_features)][0])
        raise _fail(
            f"LightGBM {what}: split_feature {bad} is out of range; the model has "
            f"{n_features} features (max_feature_idx {n_features - 1})"
        )
    decision = arrays["decision_type"]
    if np.any(decision < 0) or np.any(decision > 15) or np.any(((decision >> 2) & 3) == 3):
        raise _fail(f"LightGBM {what}: decision_type must be LightGBM's bit field (0..11)")
    _check_children(what, arrays["left_child"], arrays["right_child"], n, leaves)
    categorical = (decision & 1).astype(bool)
    if n_cat == 0:
        if np.any(categorical):
            raise _fail(f"LightGBM {what}: a categorical split but num_cat=0")
        return
    bounds = _array(fields, "cat_boundaries", n_cat + 1, what, ints=True)
    if bounds[0] != 0 or np.any(np.diff(bounds) < 0):
        raise _fail(f"LightGBM {what}: cat_boundaries must rise from 0")
    _array(fields, "cat_threshold", int(bounds[-1]), what, ints=True)
    index = arrays["threshold"][categorical]
    if np.any(index != np.round(index)) or np.any(index < 0) or np.any(index >= n_cat):
        raise _fail(f"LightGBM {what}: a categorical split's threshold is not a category set")


def _check_children(what: str, left: np.ndarray, right: np.ndarray, n: int, leaves: int) -> None:
    kids = np.concatenate([left, right])
    parents = np.concatenate([np.arange(n), np.arange(n)])
    internal = kids >= 0
    inner, leaf = kids[internal], ~kids[~internal]
    if np.any(inner >= n) or np.any(inner < 1) or np.any(leaf >= leaves):
        raise _fail(f"LightGBM {what}: a child index is out of range")
    if np.unique(inner).size != n - 1 or np.unique(leaf).size != leaves:
        raise _fail(f"LightGBM {what}: left_child/right_child do not form a tree")
    if np.any(inner <= parents[internal]):  # one parent each and after it: no cycle
        raise _fail(f"LightGBM {what}: a child node comes before its parent (a cycle?)")


def _split(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(header lines, each tree's lines, the lines after `end of trees`)."""
    lines = text.split("\n")
    if "end of trees" not in (ln.strip() for ln in lines):
        raise _fail("LightGBM model is truncated: no 'end of trees' line")
    end = [ln.strip() for ln in lines].index("end of trees")
    header: list[str] = []
    trees: list[list[str]] = []
    for line in lines[:end]:
        line = line.rstrip("\r")
        if line.startswith("Tree="):
            trees.append([line])
        elif trees:
            trees[-1].append(line)
        else:
            header.append(line)
    return header, trees, lines[end + 1 :]


def lightgbm_checked(data: bytes) -> bytes:
    """The checked model text, rebuilt (module docstring); BoosterFileError otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail("not a LightGBM model (text format): not UTF-8") from None
    if _CONTROL.search(text):
        raise _fail("not a LightGBM model (text format): it holds control characters")
    if not text.lstrip().startswith("tree"):
        raise _fail("not a LightGBM model (text format): it must start with 'tree'")
    header_lines, tree_blocks, rest = _split(text.lstrip())
    header = _fields(header_lines, "header")
    n_features = _num(header, "max_feature_idx", "header", 0, MAX_FEATURES - 1) + 1
    _num(header, "num_class", "header", 1, 1 << 16)
    per_iter = _num(header, "num_tree_per_iteration", "header", 1, 1 << 16)
    if "objective" not in header:
        raise _fail("LightGBM header: no objective")
    for key in ("feature_names", "feature_infos"):
        if key in header and len(header[key].split()) != n_features:
            raise _fail(f"LightGBM header: {key} must list {n_features} features")
    if len(tree_blocks) % per_iter:
        raise _fail(f"LightGBM model: {len(tree_blocks)} trees is not a multiple of "
                    f"num_tree_per_iteration={per_iter}")  # fmt: skip
    blocks = []
    for i, lines in enumerate(tree_blocks):
        fields = _fields(lines, f"tree {i}")
        if fields.get("Tree") != str(i):
            raise _fail(f"LightGBM model: tree {i} is labelled Tree={fields.get('Tree')}")
        _check_tree(fields, i, n_features)
        body = "\n".join(f"{k}={v}" for k, v in fields.items()) + "\n\n\n"
        blocks.append(body)
    flags = ("tree", "average_output")  # lines without '='
    keep = [k if k in flags and not v else f"{k}={v}" for k, v in header.items()
            if k != "tree_sizes"]  # fmt: skip
    head = "\n".join(keep) + f"\ntree_sizes={' '.join(str(len(b.encode())) for b in blocks)}\n\n"
    out = head + "".join(blocks) + "end of trees\n\n" + _pandas(rest) + "\n"
    return out.encode()


def _pandas(rest: list[str]) -> str:
    for line in rest:
        if line.startswith("pandas_categorical:"):
            raw = line.partition(":")[2]
            try:
                value: Any = json.loads(raw)
            except (ValueError, RecursionError):
                raise _fail("LightGBM pandas_categorical is not JSON") from None
            if value is not None and not isinstance(value, list):
                raise _fail("LightGBM pandas_categorical must be a list of categories")
            return "pandas_categorical:" + json.dumps(value)
    return "pandas_categorical:null"


__all__ = ["BoosterFileError", "lightgbm_checked"]
