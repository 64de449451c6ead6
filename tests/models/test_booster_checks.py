"""Malformed XGBoost and LightGBM files are refused before their libraries read them
(models/adapters/booster_check.py, models/adapters/lightgbm_check.py); mutants of real saved models
are each refused or load and predict finite outputs, in a subprocess so that a crash fails the
test."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.adapters.booster_check import BoosterFileError, xgboost_checked
from models.adapters.booster_ubjson import dump_ubjson, load_ubjson
from models.adapters.lightgbm_check import lightgbm_checked
from models.adapters.trees import LightGBMBooster, XGBoostBooster
from tests import byom_models as bm

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def real() -> dict[str, tuple[bytes, np.ndarray]]:
    """Small boosters trained with fixed seeds: (file, rows of its features)."""
    out: dict[str, tuple[bytes, np.ndarray]] = {}
    for task in ("regression", "classification"):
        for ubj in (False, True):
            m = bm.xgboost_model("x", task, ubj)
            out[f"xgb-{task}-{'ubj' if ubj else 'json'}"] = (m.file or b"", m.rows)
    m = bm.xgboost_frame(kind="multiclass")
    out["xgb-multiclass-frame"] = (m.file or b"", m.rows)
    m = bm.xgboost_frame(kind="regression", categorical=True)
    out["xgb-categorical"] = (m.file or b"", m.rows)
    m = bm.lightgbm_model()
    out["lgb-multiclass"] = (m.file or b"", m.rows)
    m = bm.lightgbm_frame(kind="binary", categorical=True)
    out["lgb-categorical"] = (m.file or b"", m.rows)
    return out


def booster(name: str, data: bytes) -> Any:
    return XGBoostBooster(data) if name.startswith("xgb") else LightGBMBooster(data)


@pytest.mark.parametrize("name", ["xgb-regression-json", "xgb-regression-ubj",
    "xgb-classification-json", "xgb-classification-ubj", "xgb-multiclass-frame",
    "xgb-categorical", "lgb-multiclass", "lgb-categorical"])  # fmt: skip
def test_real_models_pass_and_predict_as_before(name: str) -> None:
    data, rows = real()[name]
    checked = xgboost_checked(data) if name.startswith("xgb") else lightgbm_checked(data)
    assert checked[:1] == data[:1]
    b = booster(name, data)  # loads the re-serialised bytes
    if name.startswith("xgb"):
        import xgboost as xgb

        raw = xgb.Booster()
        raw.load_model(bytearray(data))
        want = raw.inplace_predict(rows.astype(np.float64), predict_type="margin")
    else:
        import lightgbm as lgb

        want = lgb.Booster(model_str=data.decode()).predict(rows.astype(np.float64), raw_score=True)
    got = b.margin(rows.astype(np.float64))
    want = np.asarray(want, np.float64).reshape(len(rows), -1)
    np.testing.assert_allclose(got[:, -want.shape[1] :], want, rtol=1e-6, atol=1e-6)


def _xgb_json(name: str = "xgb-regression-json") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(real()[name][0])
    return doc


def _trees(doc: dict[str, Any]) -> list[dict[str, Any]]:
    trees: list[dict[str, Any]] = doc["learner"]["gradient_booster"]["model"]["trees"]
    return trees


def test_a_split_index_of_1e9_is_refused_json_and_ubjson() -> None:
    doc = _xgb_json()
    _trees(doc)[3]["split_indices"][0] = 10**9
    with pytest.raises(BoosterFileError, match="tree 3 node 0: split index 1000000000"):
        XGBoostBooster(json.dumps(doc).encode())
    ubj = load_ubjson(real()["xgb-regression-ubj"][0])
    tree = ubj["learner"]["gradient_booster"]["model"]["trees"][5]
    tree["split_indices"][0] = 10**9
    with pytest.raises(BoosterFileError, match="tree 5 node 0: split index 1000000000"):
        XGBoostBooster(dump_ubjson(ubj))


def _mutated(edit: Any) -> bytes:
    doc = _xgb_json()
    edit(doc)
    return json.dumps(doc).encode()


def _set(tree: int, key: str, i: int, value: Any) -> Any:
    return lambda d: _trees(d)[tree][key].__setitem__(i, value)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_set(0, "left_children", 0, 0), "child indices"),  # the root its own child
        (_set(0, "left_children", 1, 1), "child indices|one child|a child index|two nodes"),
        (_set(0, "right_children", 0, 99), "child indices"),
        (_set(0, "parents", 3, 2), "parents do not match"),
        (_set(0, "default_left", 0, 7), "default_left"),
        (_set(0, "split_type", 0, 1), "categories_nodes"),
        (lambda d: _trees(d)[1]["split_conditions"].pop(), "split_conditions has"),
        (lambda d: d["learner"]["learner_model_param"].update(base_score="nan"), "base_score"),
        (lambda d: d["learner"]["learner_model_param"].update(num_class="3"), "num_class"),
        (lambda d: d["learner"]["gradient_booster"]["model"]["trees"].pop(), "num_trees"),
        (lambda d: d["learner"]["gradient_booster"].update(name="evil"), "gbtree"),
    ],
)
def test_xgboost_structure_refusals(edit: Any, match: str) -> None:
    with pytest.raises(BoosterFileError, match=match):
        xgboost_checked(_mutated(edit))


def test_duplicate_keys_and_trailing_bytes_are_refused() -> None:
    data = real()["xgb-regression-json"][0]
    dup = data.replace(b'{"learner":', b'{"version":[1],"learner":', 1)
    with pytest.raises(BoosterFileError, match="appears twice"):
        xgboost_checked(dup)
    with pytest.raises(BoosterFileError, match="after the end"):
        xgboost_checked(real()["xgb-regression-ubj"][0] + b"Z")


def _lgb() -> str:
    return real()["lgb-multiclass"][0].decode()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda t: t[: t.index("end of trees") - 40], "truncated"),
        (lambda t: t[: len(t) // 2], "truncated"),
        (
            lambda t: t.replace("split_feature=2 1\n", "split_feature=2 1000000000\n", 1),
            "split_feature 1000000000 is out of range",
        ),
        (lambda t: t.replace("num_leaves=3\n", "num_leaves=4\n", 1), "has 3 values; expected 4"),
        (lambda t: t.replace("left_child=1 -1\n", "left_child=0 -1\n", 1), "child"),
        (lambda t: t.replace("right_child=-2 -3\n", "right_child=-2 -9\n", 1), "out of range"),
        (lambda t: t.replace("max_feature_idx=3", "max_feature_idx=x", 1), "not an integer"),
        (lambda t: t.replace("leaf_value=-0.9", "leaf_value=nan -0.9", 1), "leaf_value"),
        (lambda t: t.replace("Tree=1\n", "Tree=7\n", 1), "labelled Tree=7"),
    ],
)
def test_lightgbm_structure_refusals(edit: Any, match: str) -> None:
    with pytest.raises(BoosterFileError, match=match):
        LightGBMBooster(edit(_lgb()).encode())


def _mutants(data: bytes, rng: np.random.Generator, n: int) -> list[bytes]:
    """Byte flips, digit changes (numbers stay numbers: the structural checks' work) and
    truncations of a saved model."""
    digits = [i for i, c in enumerate(data) if 48 <= c <= 57]
    out = []
    for k in range(n):
        raw = bytearray(data)
        kind = k % 4
        if kind == 0:  # random bytes
            for pos in rng.integers(0, len(raw), size=int(rng.integers(1, 4))):
                raw[pos] = int(rng.integers(0, 256))
        elif kind in (1, 2) and digits:  # a digit becomes another (or a run of nines)
            for pos in rng.choice(digits, size=int(rng.integers(1, 3))):
                raw[pos] = int(rng.integers(48, 58))
            if kind == 2:
                pos = int(rng.choice(digits))
                raw[pos : pos + 1] = b"999999999"
        else:  # truncated
            raw = raw[: int(rng.integers(1, len(raw)))]
        out.append(bytes(raw))
    return out


RUNNER = """
import sys, json, numpy as np
sys.path.insert(0, sys.argv[1])
from models.adapters.trees import XGBoostBooster, LightGBMBooster
from models.base import ModelError
for line in sys.stdin:
    job = json.loads(line)
    print(json.dumps({"start": job["i"]}), flush=True)
    data = bytes.fromhex(job["data"])
    rows = np.asarray(job["rows"], dtype=np.float64)
    try:
        b = XGBoostBooster(data) if job["lib"] == "xgb" else LightGBMBooster(data)
        rows = np.resize(rows, (len(rows), b.n_features))
        outs = [b.predict(rows), b.margin(rows), b.contributions(rows)]
        ok = all(np.all(np.isfinite(o)) for o in outs)
        result = "finite" if ok else "not finite"
    except ModelError as exc:
        result = "refused: " + str(exc)[:80]
    except Exception as exc:
        result = "error: " + type(exc).__name__ + ": " + str(exc)[:200]
    print(json.dumps({"done": job["i"], "result": result}), flush=True)
"""


def test_mutants_are_refused_or_predict_finite_outputs() -> None:
    """Every mutant that passes the check is loaded and run by the library in a subprocess:
    a crash (SIGSEGV, SIGABRT) fails the test naming the mutant, so do errors other than a
    refusal and non-finite outputs."""
    rng = np.random.default_rng(0)
    jobs: list[str] = []
    mutants: dict[int, tuple[str, bytes]] = {}
    refused = 0
    for name in ("xgb-regression-json", "xgb-classification-ubj", "lgb-multiclass"):
        data, rows = real()[name]
        check = xgboost_checked if name.startswith("xgb") else lightgbm_checked
        for raw in _mutants(data, rng, 60):
            try:
                check(raw)
            except BoosterFileError:
                refused += 1
                continue
            i = len(jobs)
            mutants[i] = (name, raw)
            jobs.append(json.dumps({"i": i, "lib": name[:3], "data": raw.hex(),
                                    "rows": rows.tolist()}))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(ROOT)],
        input="\n".join(jobs) + "\n", capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    started = [e["start"] for e in events if "start" in e]
    results = {e["done"]: e["result"] for e in events if "done" in e}
    if proc.returncode != 0:
        last = started[-1] if started else None
        which = mutants[last][0] if last is not None else "?"
        pytest.fail(f"the library died ({proc.returncode}) on mutant {last} of {which}: "
                    f"{proc.stderr[-500:]}")  # fmt: skip
    assert len(results) == len(jobs)
    bad = {i: r for i, r in results.items() if not r.startswith(("finite", "refused"))}
    assert not bad, {i: (mutants[i][0], r) for i, r in bad.items()}
    assert refused > 60  # most mutants are refused here, before the library sees them
