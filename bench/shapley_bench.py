"""Shapley estimator benchmark: ours against shap and shapiq, on the built-in models.

    .venv/bin/python bench/shapley_bench.py [--quick] [--skip-server] [--out bench/out]
        [--only sampled --seeds 8 --explicands 3]

One process; every contender sees the same model, explicands and background. torch and BLAS are
limited to one thread for everyone. Model rows are counted (and timed) by a wrapper around
`model.predict`, so budgets are compared in real model evaluations, not nominal ones.

Sections (see docs/benchmarks.md for the results and how to read them):
1. exact, diabetes-mlp (10 features, 50 background rows): ours vs shap.ExactExplainer vs the
   floor (one model.predict call on the prebuilt 2^10 x 50 rows).
2. sampled, breast-cancer-mlp (30 features, output "benign", 20 background rows): RMSE against a
   high-budget reference and wall time at equal budgets, for our kernel (kernel / leverage
   sampler) and permutation, shap's Kernel and Permutation explainers, shapiq's KernelSHAP,
   PermutationSamplingSV, SVARM and kADDSHAP (order 2). `--seeds N` / `--explicands N` set the
   grid; the held-out protocol's ratio table (bench/protocol.py: ours over the best shap/shapiq
   peer, RMSE over every (explicand, seed) answer, 90% paired bootstrap interval) is printed
   after the report.
3. evaluations needed to reach an RMSE threshold, from the section-2 grid.
4. peak resident memory (VmHWM) of `python -m app` after one explain request per model.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

torch.set_num_threads(1)
threadpool_limits(limits=1)  # BLAS/OpenMP: one thread for every contender

import shap  # noqa: E402
import shapiq  # noqa: E402

from app.settings import Settings  # noqa: E402
from bench.protocol import ratio_interval  # noqa: E402
from explainers import shapley_values  # noqa: E402
from explainers.games import all_masks  # noqa: E402
from explainers.games.masked import MaskedModelGame  # noqa: E402
from models.builtin.trained import dataset_split  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

warnings.filterwarnings("ignore", module="shapiq")
warnings.filterwarnings("ignore", category=UserWarning, module="shap")


# --------------------------------------------------------------------------------------------
# Instruments


class CountingPredict:
    """model.predict that counts the rows it is given and the seconds spent inside it."""

    def __init__(self, predict: Callable[[np.ndarray], np.ndarray]) -> None:
        self.predict = predict
        self.rows = 0
        self.calls = 0
        self.seconds = 0.0

    def reset(self) -> None:
        self.rows, self.calls, self.seconds = 0, 0, 0.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = self.predict(x)
        self.seconds += time.perf_counter() - start
        self.rows += len(x)
        self.calls += 1
        return out


@dataclass
class Run:
    """One contender call: values, wall seconds, model seconds and model rows."""

    values: np.ndarray
    base: float
    seconds: float
    model_seconds: float
    rows: int


@dataclass
class Contender:
    name: str
    family: str  # ours | shap | shapiq | floor
    call: Callable[[int, int, int], tuple[np.ndarray, float]]  # (x index, seed, coalitions)
    counter: CountingPredict
    runs: dict[Any, list[Run]] = field(default_factory=dict)

    def run(self, i: int, seed: int, coalitions: int) -> Run:
        self.counter.reset()
        start = time.perf_counter()
        values, base = self.call(i, seed, coalitions)
        seconds = time.perf_counter() - start
        return Run(
            np.asarray(values, dtype=np.float64).reshape(-1),
            float(base),
            seconds,
            self.counter.seconds,
            self.counter.rows,
        )


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "shap": shap.__version__,
        "shapiq": getattr(shapiq, "__version__", None) or _dist_version("shapiq"),
        "torch_threads": torch.get_num_threads(),
        "blas_threads": 1,
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {"median": float(np.median(a)), "min": float(a.min()), "n": int(a.size)}


# --------------------------------------------------------------------------------------------
# 1. Exact


def bench_exact(reg: ModelRegistry, n_x: int, reps: int) -> dict[str, Any]:
    model = reg.get("diabetes-mlp")
    xs = dataset_split("diabetes-mlp").x_test[:n_x]
    bg = np.ascontiguousarray(model.background[:50])
    n = model.n_features
    ours_pred = CountingPredict(model.predict)
    shap_pred = CountingPredict(model.predict)
    floor_pred = CountingPredict(model.predict)

    def ours() -> list[tuple[np.ndarray, float]]:
        out = []
        for x in xs:
            game = MaskedModelGame(ours_pred, x, bg, max_rows=model.batch_size)
            est = shapley_values(game, n, estimator="exact")
            out.append((est.values[:, 0], float(est.base_value[0])))
        return out

    explainer = shap.ExactExplainer(
        lambda z: shap_pred(z)[:, 0], shap.maskers.Independent(bg, max_samples=50)
    )

    def theirs() -> list[tuple[np.ndarray, float]]:
        res = explainer(xs, silent=True)
        return [(res.values[i], float(res.base_values[i])) for i in range(len(xs))]

    # The floor: the model call alone on the very rows ours evaluates, built beforehand.
    masks = all_masks(n)
    prebuilt = [
        np.ascontiguousarray(np.where(masks[:, None, :], x, bg).reshape(-1, n), dtype=np.float32)
        for x in xs
    ]

    def floor() -> None:
        for rows in prebuilt:
            floor_pred(rows)

    contenders = {"ours exact": (ours, ours_pred), "shap Exact": (theirs, shap_pred)}
    contenders["floor (predict only)"] = (floor, floor_pred)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    model_times: dict[str, list[float]] = {k: [] for k in contenders}
    rows: dict[str, int] = {}
    results: dict[str, Any] = {}
    for name, (fn, counter) in contenders.items():  # warm-up, and the values
        counter.reset()
        results[name] = fn()
        rows[name] = counter.rows
    names = list(contenders)
    for r in range(reps):  # interleaved, rotating order: contention hits everyone alike
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, counter = contenders[name]
            counter.reset()
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) / len(xs))
            model_times[name].append(counter.seconds / len(xs))
    ours_v = np.stack([v for v, _ in results["ours exact"]])
    shap_v = np.stack([v for v, _ in results["shap Exact"]])
    ours_b = np.array([b for _, b in results["ours exact"]])
    shap_b = np.array([b for _, b in results["shap Exact"]])
    t = {k: stats(v) for k, v in times.items()}
    med = {k: v["median"] for k, v in t.items()}
    best = {k: v["min"] for k, v in t.items()}
    return {
        "model": "diabetes-mlp",
        "n_features": n,
        "background_rows": len(bg),
        "explicands": len(xs),
        "reps": reps,
        "seconds_per_explicand": t,
        "model_seconds_per_explicand": {k: stats(v) for k, v in model_times.items()},
        "rows_per_explicand": {k: v / len(xs) for k, v in rows.items()},
        "ratios_median": {
            "ours/floor": med["ours exact"] / med["floor (predict only)"],
            "shap/floor": med["shap Exact"] / med["floor (predict only)"],
            "ours/shap": med["ours exact"] / med["shap Exact"],
        },
        "ratios_min": {
            "ours/floor": best["ours exact"] / best["floor (predict only)"],
            "shap/floor": best["shap Exact"] / best["floor (predict only)"],
            "ours/shap": best["ours exact"] / best["shap Exact"],
        },
        "max_abs_diff_values": float(np.abs(ours_v - shap_v).max()),
        "max_abs_diff_base": float(np.abs(ours_b - shap_b).max()),
        "max_abs_value": float(np.abs(ours_v).max()),
        "efficiency_gap_ours": float(
            np.abs(ours_v.sum(axis=1) + ours_b - model.predict(xs)[:, 0]).max()
        ),
    }


# --------------------------------------------------------------------------------------------
# 2. Sampled


SAMPLED_MODEL = "breast-cancer-mlp"
SAMPLED_TARGET = 1  # "benign" probability
SAMPLED_BG = 20


def reference_values(
    model: Any, xs: np.ndarray, bg: np.ndarray, coalitions: int, cache: Path
) -> dict[str, Any]:
    """Per explicand: mean of our kernel and our permutation at `coalitions` each.

    Two independent estimators by different methods and seeds: their difference measures the
    reference's own error (and would expose a bias of either); the mean has error ~ |diff| / 2.
    Cached on disk by explicand index and budget.
    """
    store: dict[str, np.ndarray] = {}
    if cache.exists():
        with np.load(cache) as f:
            store = {k: f[k] for k in f.files}
    n = model.n_features
    out_ref, out_diff, out_jk, out_perm_std, seconds, used = [], [], [], [], [], []
    for i, x in enumerate(xs):
        # Reuse the largest cached reference of at least this budget (quick reuses full's).
        cached = [
            int(k.split("_c")[1].split("_")[0])
            for k in store
            if k.startswith(f"x{i}_c") and k.endswith("_kernel")
        ]
        best = max((c for c in cached if c >= coalitions), default=coalitions)
        key = f"x{i}_c{best}"
        if key + "_kernel" not in store:
            start = time.perf_counter()
            game = MaskedModelGame(model.predict, x, bg, max_rows=model.batch_size)
            kern = shapley_values(
                game, n, estimator="kernel", budget=best * len(bg), seed=10_000 + i
            )
            perm = shapley_values(
                game, n, estimator="permutation", budget=best * len(bg), seed=20_000 + i
            )
            store[key + "_kernel"] = kern.values[:, SAMPLED_TARGET]
            store[key + "_kernel_std"] = kern.error_std[:, SAMPLED_TARGET]
            store[key + "_perm"] = perm.values[:, SAMPLED_TARGET]
            store[key + "_perm_std"] = perm.error_std[:, SAMPLED_TARGET]
            store[key + "_seconds"] = np.array(time.perf_counter() - start)
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, **store)
        k, p = store[key + "_kernel"], store[key + "_perm"]
        out_ref.append((k + p) / 2)
        out_diff.append(float(np.sqrt(np.mean((k - p) ** 2))))
        out_jk.append(float(np.sqrt(np.mean(store[key + "_kernel_std"] ** 2))))
        out_perm_std.append(float(np.sqrt(np.mean(store[key + "_perm_std"] ** 2))))
        seconds.append(float(store[key + "_seconds"]))
        used.append(best)
    diff = np.array(out_diff)
    jk = np.array(out_jk)
    ps = np.array(out_perm_std)
    return {
        "values": np.stack(out_ref),
        "coalitions_each": used,
        "rms_kernel_minus_perm": out_diff,
        "rms_kernel_jackknife_std": out_jk,
        "rms_perm_std": out_perm_std,
        # what the two error bars predict for |kernel - perm|; compare with the measured one
        "expected_rms_diff": [float(v) for v in np.sqrt(jk**2 + ps**2)],
        "reference_rmse_estimate": [float(v) for v in diff / 2],
        "seconds": seconds,
    }


def make_sampled_contenders(model: Any, xs: np.ndarray, bg: np.ndarray) -> list[Contender]:
    n = model.n_features
    r = len(bg)
    tgt = SAMPLED_TARGET
    contenders: list[Contender] = []

    def ours(estimator: str, sampler: str) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, coalitions: int) -> tuple[np.ndarray, float]:
            game = MaskedModelGame(counter, xs[i], bg, max_rows=model.batch_size)
            est = shapley_values(
                game, n, estimator=estimator, budget=coalitions * r, seed=seed, sampler=sampler
            )
            return est.values[:, tgt], est.base_value[tgt]

        label = f"ours {estimator}" + (f" ({sampler})" if estimator == "kernel" else "")
        return Contender(label, "ours", call, counter)

    contenders += [ours("kernel", "kernel"), ours("kernel", "leverage"), ours("permutation", "")]

    # shap KernelExplainer: nsamples counts coalitions; each costs |bg| rows, plus f(x) once.
    # l1_reg=False: no feature selection (its default "num_features(10)" would zero 20 of 30).
    k_counter = CountingPredict(model.predict)
    k_explainer = shap.KernelExplainer(lambda z: k_counter(z)[:, tgt], bg)

    def shap_kernel(i: int, seed: int, coalitions: int) -> tuple[np.ndarray, float]:
        np.random.seed(seed)  # KernelExplainer samples with the global numpy RNG
        vals = k_explainer.shap_values(xs[i], nsamples=coalitions, l1_reg=False, silent=True)
        return np.asarray(vals).reshape(-1), float(np.asarray(k_explainer.expected_value))

    contenders.append(Contender("shap Kernel", "shap", shap_kernel, k_counter))

    # shap PermutationExplainer: max_evals counts masked inputs (coalitions), |bg| rows each.
    p_counter = CountingPredict(model.predict)
    p_explainer = shap.PermutationExplainer(
        lambda z: p_counter(z)[:, tgt], shap.maskers.Independent(bg, max_samples=r)
    )

    def shap_perm(i: int, seed: int, coalitions: int) -> tuple[np.ndarray, float]:
        np.random.seed(seed)  # PermutationExplainer draws permutations from the global RNG
        res = p_explainer(xs[i : i + 1], max_evals=coalitions, silent=True)
        return res.values[0], float(res.base_values[0])

    contenders.append(Contender("shap Permutation", "shap", shap_perm, p_counter))

    # shapiq: approximators on a shapiq.Game whose value function is our interventional game
    # (not normalised: v(empty) is kept; Shapley values do not depend on that shift anyway).
    def shapiq_contender(label: str, make: Callable[[int], Any]) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, coalitions: int) -> tuple[np.ndarray, float]:
            inner = MaskedModelGame(counter, xs[i], bg, max_rows=model.batch_size)

            class Wrapped(shapiq.Game):
                def __init__(self) -> None:
                    super().__init__(n_players=n, normalize=False)

                def value_function(self, coalitions_: np.ndarray) -> np.ndarray:
                    return inner(coalitions_)[:, tgt]

            iv = make(seed).approximate(coalitions, Wrapped())
            return np.asarray(iv.get_n_order_values(1)).reshape(-1), iv.baseline_value

        return Contender(label, "shapiq", call, counter)

    contenders += [
        shapiq_contender(
            "shapiq KernelSHAP", lambda s: shapiq.KernelSHAP(n, pairing_trick=True, random_state=s)
        ),
        shapiq_contender(
            "shapiq PermutationSV", lambda s: shapiq.PermutationSamplingSV(n, random_state=s)
        ),
        shapiq_contender("shapiq SVARM", lambda s: shapiq.SVARM(n, random_state=s)),
        shapiq_contender(
            "shapiq kADDSHAP",
            lambda s: shapiq.kADDSHAP(n, max_order=2, pairing_trick=True, random_state=s),
        ),
    ]
    return contenders


def protocol_table(sampled: dict[str, Any]) -> list[str]:
    """Ours over the best shap/shapiq peer per budget, 90% paired bootstrap over answers (runs
    are stored in the same (explicand, seed) order for every contender)."""
    runs = sampled["runs"]
    peers = [c for c in runs if not c.startswith("ours")]
    budgets = sampled["budgets_coalitions"]
    lines = [
        "| ours / best shap-shapiq peer [90%] | " + " | ".join(f"{b} c" for b in budgets) + " |",
        "|---|" + "---|" * len(budgets),
    ]
    for name in [c for c in runs if c.startswith("ours")]:
        cells = []
        for b in budgets:
            sq = {c: np.array([r["rmse"] ** 2 for r in runs[c][b]]) for c in [name, *peers]}
            ratio = ratio_interval(sq.pop(name), sq)
            cells.append(f"{ratio} ({ratio.best})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def bench_sampled(
    reg: ModelRegistry,
    n_x: int,
    seeds: list[int],
    budgets: list[int],
    ref_coalitions: int,
    out_dir: Path,
    skip: set[str],
) -> dict[str, Any]:
    model = reg.get(SAMPLED_MODEL)
    xs = dataset_split(SAMPLED_MODEL).x_test[:n_x]
    bg = np.ascontiguousarray(model.background[:SAMPLED_BG])
    print(f"  reference: our kernel + our permutation, {ref_coalitions} coalitions each ...")
    ref = reference_values(
        model, xs, bg, ref_coalitions, out_dir / f"reference_{SAMPLED_MODEL}_bg{SAMPLED_BG}.npz"
    )
    contenders = [c for c in make_sampled_contenders(model, xs, bg) if c.name not in skip]
    for c in contenders:  # warm-up (numba JIT in shap, imports, caches)
        c.run(0, 999, budgets[0])
    results: dict[str, dict[int, list[dict[str, float]]]] = {c.name: {} for c in contenders}
    for b in budgets:
        t0 = time.perf_counter()
        k = 0
        for i in range(len(xs)):
            for seed in seeds:
                order = contenders[k % len(contenders) :] + contenders[: k % len(contenders)]
                k += 1
                for c in order:
                    run = c.run(i, seed, b)
                    err = run.values - ref["values"][i]
                    results[c.name].setdefault(b, []).append(
                        {
                            "x": i,
                            "seed": seed,
                            "rmse": float(np.sqrt(np.mean(err**2))),
                            "seconds": run.seconds,
                            "model_seconds": run.model_seconds,
                            "rows": run.rows,
                            "efficiency_gap": float(
                                abs(run.values.sum() - (ref["values"][i].sum()))
                            ),
                        }
                    )
        print(f"  budget {b} coalitions done in {time.perf_counter() - t0:.1f} s")
    summary: dict[str, dict[int, dict[str, float]]] = {}
    for c in contenders:
        summary[c.name] = {}
        for b, rs in results[c.name].items():
            secs = [r["seconds"] for r in rs]
            msecs = [r["model_seconds"] for r in rs]
            summary[c.name][b] = {
                "rmse_mean": float(np.mean([r["rmse"] for r in rs])),
                "rmse_sem": float(np.std([r["rmse"] for r in rs], ddof=1) / np.sqrt(len(rs)))
                if len(rs) > 1
                else 0.0,
                "seconds_median": float(np.median(secs)),
                "seconds_min": float(np.min(secs)),
                "model_seconds_median": float(np.median(msecs)),
                "total_over_model_median": float(np.median(np.array(secs) / np.array(msecs))),
                "rows_median": float(np.median([r["rows"] for r in rs])),
                "rows_max": int(np.max([r["rows"] for r in rs])),
                "nominal_rows": b * len(bg),
            }
    return {
        "model": SAMPLED_MODEL,
        "target": SAMPLED_TARGET,
        "n_features": model.n_features,
        "background_rows": len(bg),
        "explicands": len(xs),
        "seeds": seeds,
        "budgets_coalitions": budgets,
        "reference": {k: v for k, v in ref.items() if k != "values"},
        "reference_values": ref["values"].tolist(),
        "shapley_rms_magnitude": float(np.sqrt(np.mean(ref["values"] ** 2))),
        "summary": summary,
        "runs": results,
    }


# --------------------------------------------------------------------------------------------
# 3. Evaluations to reach an error


def evals_to_error(sampled: dict[str, Any], thresholds: list[float]) -> dict[str, Any]:
    """Model rows needed for mean RMSE <= t: the smallest grid budget that reaches it, and a
    log-log interpolation between the grid budgets around it ("interp"; past the largest
    budget it extrapolates the last two points and says so)."""
    out: dict[str, Any] = {}
    r = sampled["background_rows"]
    for name, per_b in sampled["summary"].items():
        budgets = sorted(per_b)
        rmse = np.array([per_b[b]["rmse_mean"] for b in budgets])
        rows = np.array([b * r for b in budgets], dtype=np.float64)
        entry: dict[str, Any] = {}
        if len(rows) > 1:
            entry["slope_last_two"] = float(
                np.log(rmse[-1] / rmse[-2]) / np.log(rows[-1] / rows[-2])
            )
        for t in thresholds:
            hit = [int(rows[j]) for j in range(len(rows)) if rmse[j] <= t]
            interp, extrapolated = None, False
            j = next((j for j in range(len(rows)) if rmse[j] <= t), None)
            if j == 0:
                interp = float(rows[0])  # reached at the smallest budget: an upper bound
            elif len(rows) > 1:
                lo = j - 1 if j is not None else len(rows) - 2
                extrapolated = j is None
                slope = np.log(rmse[lo + 1] / rmse[lo]) / np.log(rows[lo + 1] / rows[lo])
                if slope < 0:
                    interp = float(rows[lo] * np.exp(np.log(t / rmse[lo]) / slope))
            entry[str(t)] = {
                "grid": hit[0] if hit else None,
                "interp": interp,
                "extrapolated": extrapolated,
            }
        out[name] = entry
    ratios: dict[str, Any] = {}
    for ours in ("ours kernel (kernel)", "ours kernel (leverage)", "ours permutation"):
        if ours not in out or "shap Kernel" not in out:
            continue
        ratios[ours] = {}
        for t in thresholds:
            a, b = out["shap Kernel"][str(t)], out[ours][str(t)]
            ratios[ours][str(t)] = {
                "grid": a["grid"] / b["grid"] if a["grid"] and b["grid"] else None,
                "interp": a["interp"] / b["interp"] if a["interp"] and b["interp"] else None,
                "extrapolated": a["extrapolated"] or b["extrapolated"],
            }
    return {"thresholds": thresholds, "per_contender": out, "shap_kernel_over_ours": ratios}


# --------------------------------------------------------------------------------------------
# 4. Server memory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "cache-control": "no-cache"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])  # kB
    return out


def bench_server(reg: ModelRegistry) -> dict[str, Any]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "REDIS_URL")}
    cmd = [sys.executable, "-m", "app", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"command": " ".join(cmd[1:]), "env": "MODEL_DIR and REDIS_URL unset"}
    try:
        start = time.perf_counter()
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server not ready in 180 s")
            time.sleep(0.2)
        result["ready_seconds"] = time.perf_counter() - start
        result["after_ready_kB"] = _proc_status(proc.pid)
        diabetes = reg.get("diabetes-mlp").background[0]
        cancer = reg.get("breast-cancer-mlp").background[0]
        digit = reg.get("digits-cnn").background[0]
        requests = [
            ("diabetes-mlp", {"inputs": [diabetes.tolist()]}),
            # budget counts model rows: 5000 rows is 50 coalitions of the 100-row background
            # (below the kernel minimum of 2n = 60 since c2cf5da, so expect a 400), and 500000
            # rows is 5000 coalitions.
            ("breast-cancer-mlp", {"inputs": [cancer.tolist()], "budget": 5000}),
            ("breast-cancer-mlp", {"inputs": [cancer.tolist()], "budget": 500_000}),
            ("digits-cnn", {"inputs": [digit.tolist()]}),
        ]
        result["requests"] = []
        for name, body in requests:
            t = time.perf_counter()
            status, reply = _post(f"{base}/v2/models/{name}/explain/shapley", body)
            meta = reply.get("meta", {})
            result["requests"].append(
                {
                    "model": name,
                    "status": status,
                    "seconds": time.perf_counter() - t,
                    "budget": meta.get("budget"),
                    "n_model_evals": meta.get("n_model_evals"),
                    "exact": meta.get("exact"),
                    "error": reply.get("error") if status != 200 else None,
                }
            )
        result["final_kB"] = _proc_status(proc.pid)
        result["peak_rss_MB"] = result["final_kB"]["VmHWM"] / 1024
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return result


# --------------------------------------------------------------------------------------------
# Report


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.2f}" if s < 1 else f"{s * 1e3:.0f}"


def print_report(res: dict[str, Any]) -> None:
    print("\n== machine ==")
    print(json.dumps(res["machine"]), "load before/after:", res["load_before"], res["load_after"])
    ex = res.get("exact")
    if ex:
        print(
            f"\n== 1. exact, {ex['model']} ({ex['n_features']} features, "
            f"{ex['background_rows']} bg rows, {ex['explicands']} explicands, "
            f"{ex['reps']} interleaved reps) =="
        )
        print(
            f"{'contender':<22}{'ms/x median':>12}{'ms/x min':>10}{'in predict':>12}"
            f"{'model rows/x':>14}"
        )
        for k, v in ex["seconds_per_explicand"].items():
            print(
                f"{k:<22}{v['median'] * 1e3:>12.2f}{v['min'] * 1e3:>10.2f}"
                f"{ex['model_seconds_per_explicand'][k]['median'] * 1e3:>12.2f}"
                f"{ex['rows_per_explicand'][k]:>14.0f}"
            )
        for which in ("ratios_median", "ratios_min"):
            print(which, {k: round(v, 2) for k, v in ex[which].items()})
        print(
            f"max |ours - shap| values {ex['max_abs_diff_values']:.2e} "
            f"(max |value| {ex['max_abs_value']:.3g}), base {ex['max_abs_diff_base']:.2e}"
        )
    sm = res.get("sampled")
    if sm:
        ref = sm["reference"]
        print(
            f"\n== 2. sampled, {sm['model']} output {sm['target']} ({sm['n_features']} features, "
            f"{sm['background_rows']} bg rows, {sm['explicands']} explicands x seeds "
            f"{sm['seeds']}) =="
        )
        print(
            f"reference: {sorted(set(ref['coalitions_each']))} coalitions each (kernel + perm.); "
            f"estimated reference RMSE {np.mean(ref['reference_rmse_estimate']):.2e}; "
            f"|kernel - perm| {np.mean(ref['rms_kernel_minus_perm']):.2e} vs expected from their "
            f"error bars {np.mean(ref['expected_rms_diff']):.2e}; "
            f"RMS Shapley value {sm['shapley_rms_magnitude']:.3g}"
        )
        names = list(sm["summary"])
        ours = "ours kernel (kernel)"
        for b in sm["budgets_coalitions"]:
            print(f"\n-- budget {b} coalitions = {b * sm['background_rows']} model rows --")
            print(
                f"{'contender':<26}{'rows used':>10}{'RMSE':>10}{'ms median':>11}"
                f"{'model ms':>10}{'overhead':>10}{'total/model':>12}{'ours/this time':>15}"
            )
            for name in names:
                s = sm["summary"][name].get(b)
                if not s:
                    continue
                ratio = sm["summary"][ours][b]["seconds_median"] / s["seconds_median"]
                print(
                    f"{name:<26}{s['rows_max']:>10}{s['rmse_mean']:>10.2e}"
                    f"{fmt_ms(s['seconds_median']):>11}{fmt_ms(s['model_seconds_median']):>10}"
                    f"{fmt_ms(s['seconds_median'] - s['model_seconds_median']):>10}"
                    f"{s['total_over_model_median']:>12.2f}{ratio:>15.2f}"
                )
    ev = res.get("evals_to_error")
    if ev:
        print(
            "\n== 3. model rows to reach mean RMSE <= t: smallest grid budget / log-log "
            "interpolation (* = extrapolated past the grid) =="
        )
        ts = ev["thresholds"]
        print(f"{'contender':<26}" + "".join(f"{'t=' + str(t):>20}" for t in ts))
        for name, e in ev["per_contender"].items():
            cells = []
            for t in ts:
                g, f, x = e[str(t)]["grid"], e[str(t)]["interp"], e[str(t)]["extrapolated"]
                cells.append(
                    f"{(str(g) if g else '>grid'):>8} / {(f'{f:.0f}' if f else '-'):>7}"
                    + ("*" if x else " ")
                )
            print(f"{name:<26}" + "".join(f"{c:>20}" for c in cells))
        for name, per_t in ev["shap_kernel_over_ours"].items():
            cells = []
            for t, v in per_t.items():
                g = "-" if v["grid"] is None else f"{v['grid']:.2f}"
                f = "-" if v["interp"] is None else f"{v['interp']:.2f}"
                cells.append(f"t={t}: {g} / {f}{'*' if v['extrapolated'] else ''}")
            print(f"shap Kernel rows / {name} rows (grid / interp): " + ", ".join(cells))
    sv = res.get("server")
    if sv:
        print("\n== 4. server memory ==")
        if "peak_rss_MB" in sv:
            print(
                f"VmHWM {sv['peak_rss_MB']:.0f} MB after {len(sv['requests'])} requests "
                f"(after ready: {sv['after_ready_kB']['VmHWM'] / 1024:.0f} MB); requests: "
                + ", ".join(
                    f"{r['model']} {r['status']} {r['seconds']:.2f}s" for r in sv["requests"]
                )
            )
        else:
            print(sv)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer explicands/seeds/budgets")
    parser.add_argument("--skip-server", action="store_true", help="skip section 4")
    parser.add_argument("--only", choices=["exact", "sampled", "server"], help="one section")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--seeds", type=int, default=None, help="section 2: seeds 0..N-1")
    parser.add_argument("--explicands", type=int, default=None, help="section 2: test rows")
    args = parser.parse_args()
    if args.quick:
        cfg = {
            "exact_x": 3, "exact_reps": 5, "sampled_x": 2, "seeds": [0, 1],
            "budgets": [500, 2000], "ref": 1 << 16, "thresholds": [1e-2, 5e-3],
        }  # fmt: skip
    else:
        cfg = {
            "exact_x": 5, "exact_reps": 41, "sampled_x": 5, "seeds": [0, 1, 2],
            "budgets": [500, 1000, 2000, 5000, 10000], "ref": 1 << 18,
            "thresholds": [1e-2, 5e-3, 3e-3, 2e-3, 1e-3],
        }  # fmt: skip
    if args.seeds:
        cfg["seeds"] = list(range(args.seeds))
    if args.explicands:
        cfg["sampled_x"] = args.explicands
    reg = ModelRegistry(Settings().model_dir)
    res: dict[str, Any] = {
        "quick": args.quick,
        "config": cfg,
        "machine": machine_info(),
        "load_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    t0 = time.perf_counter()
    if args.only in (None, "exact"):
        print("1. exact ...")
        res["exact"] = bench_exact(reg, cfg["exact_x"], cfg["exact_reps"])
    if args.only in (None, "sampled"):
        print("2. sampled ...")
        res["sampled"] = bench_sampled(
            reg, cfg["sampled_x"], cfg["seeds"], cfg["budgets"], cfg["ref"], args.out, set()
        )
        res["evals_to_error"] = evals_to_error(res["sampled"], cfg["thresholds"])
    if args.only in (None, "server") and not args.skip_server:
        print("4. server ...")
        try:
            res["server"] = bench_server(reg)
        except Exception as exc:  # report, do not lose the other sections
            res["server"] = {"error": f"{type(exc).__name__}: {exc}"}
    res["load_after"] = load_average()
    res["seconds_total"] = time.perf_counter() - t0
    print_report(res)
    if "sampled" in res:
        print("\n== section 2 under the held-out protocol ==")
        print("\n".join(protocol_table(res["sampled"])))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"shapley_bench{'_quick' if args.quick else ''}.json"
    path.write_text(json.dumps(res, indent=1, default=_json_default))
    print(
        f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
        f"({res['seconds_total']:.0f} s)"
    )


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


if __name__ == "__main__":
    main()
