"""Variants of the gp estimator's misfit rule (issue 17), gp alone on regression_bench's games,
ratios to the best peer from a regression_bench JSON of the same cases, seeds and budgets.

    .venv/bin/python bench/gp_variants_bench.py --games tanh16,breast,digits2 --count 3 \
        --seeds 3 --peers /tmp/gpbench_before.json [--variants never,flagged,always]

Variants (gp.ADJUST): never (KernelSHAP for outputs the misfit check flags), flagged (the
cross-fitted regression adjustment for them instead), flagged_min (the adjustment where its
jackknife error is below KernelSHAP's, else KernelSHAP), always (the adjustment for every
output with enough pairs), selfcheck (the posterior checked against the adjustment instead of
KernelSHAP), best (checked against whichever of the adjustment and KernelSHAP has the smaller
jackknife error). Games of at most 16 players are tabulated once (every coalition), so the
model runs once per game. One thread for torch and BLAS.

Own time of gp's fit (one thread; `--gp-file` times another copy of gp.py, e.g. an older one
from `git show REV:explainers/estimators/gp.py > /tmp/gp_old.py`):

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/gp_variants_bench.py --own-time \
        [--gp-file /tmp/gp_old.py]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench import regression_bench as rb  # noqa: E402
from explainers import shapley_values  # noqa: E402
from explainers.estimators import gp  # noqa: E402

VARIANTS = ("never", "flagged", "always", "selfcheck", "best")


class Table:
    """Every coalition's value of a game of at most 16 players, looked up by bitmask."""

    def __init__(self, game: Callable[[np.ndarray], np.ndarray], n: int) -> None:
        codes = np.arange(1 << n)
        masks = (codes[:, None] >> np.arange(n)[None, :]) & 1
        self.values = np.asarray(game(masks.astype(bool)))
        self.bits = 1 << np.arange(n)

    def __call__(self, masks: np.ndarray) -> np.ndarray:
        return np.asarray(self.values[np.asarray(masks, dtype=np.int64) @ self.bits])


def own_time(path: Path | None, repeats: int = 5) -> None:
    """Seconds of gp's fit (best of `repeats`) at 256, 1024 and 2048 coalitions, 16 and 30
    players, on a tanh-MLP game of two outputs (KernelSHAP's plan, seed 0)."""
    import importlib.util

    from explainers.estimators import kernel

    module: Any = gp
    if path is not None:
        spec = importlib.util.spec_from_file_location("gp_other", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    print("| players | coalitions | fit s |\n|---|---|---|")
    for n in (16, 30):
        rng = np.random.default_rng(0)
        w1, w2 = rng.normal(size=(n, 32)) * 2 / np.sqrt(n), rng.normal(size=(32, 2))
        for m in (256, 1024, 2048):
            planner = kernel.Planner(n, "kernel", np.random.default_rng(0))
            planner.extend(m)
            plan = planner.design()
            v = np.tanh(plan.masks.astype(np.float64) @ w1 - 0.5) @ w2
            y = v - v[0]
            seconds = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                module._fit(plan, y, y[1].copy())
                seconds.append(time.perf_counter() - t0)
            print(f"| {n} | {m} | {min(seconds[1:]):.3f} |", flush=True)


def run_case(case: rb.Case, seeds: int, variants: list[str], peers: dict[str, Any]) -> dict:
    name, inner, n, out, exact = case
    cost = int(getattr(inner, "rows_per_coalition", 1))
    game = Table(inner, n) if n <= 16 else inner
    cost = 1 if n <= 16 else cost
    rows: dict[str, Any] = {}
    for mult in rb.MULTIPLES:
        coalitions = min(mult * n, (1 << n) - 2)
        best = peers.get(name, {}).get("budgets", {}).get(str(mult), {}).get("best_peer")
        row: dict[str, Any] = {"best_peer": best}
        for variant in variants:
            gp.ADJUST = variant
            rmse, inside, own = [], [], []
            for seed in range(seeds):
                t0 = time.perf_counter()
                e = shapley_values(game, n, estimator="gp", budget=coalitions * cost, seed=seed)
                own.append(time.perf_counter() - t0)
                err = e.values[:, out] - exact
                rmse.append(float(np.sqrt(np.mean(err**2))))
                assert e.error_std is not None
                inside.append(float(np.mean(np.abs(err) <= 2 * e.error_std[:, out])))
            row[variant] = {
                "rmse": float(np.mean(rmse)),
                "over_best_peer": float(np.mean(rmse)) / best if best else float("nan"),
                "within_2_se": float(np.mean(inside)),
                "seconds": float(np.median(own)),
            }
        rows[str(mult)] = row
    return {"case": name, "n": n, "budgets": rows}


def report(results: list[dict[str, Any]], variants: list[str]) -> None:
    families: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        families.setdefault(r["case"].rsplit(" ", 1)[0], []).append(r)
    for family, rs in families.items():
        print(f"\n{family} ({len(rs)} games): gp / best peer (within 2 se)")
        print("| coalitions | " + " | ".join(variants) + " |")
        print("|---" * (len(variants) + 1) + "|")
        for mult in rb.MULTIPLES:
            cells = []
            for v in variants:
                ratio = np.nanmean([r["budgets"][str(mult)][v]["over_best_peer"] for r in rs])
                cover = np.mean([r["budgets"][str(mult)][v]["within_2_se"] for r in rs])
                cells.append(f"{ratio:.2f} ({cover:.2f})")
            print(f"| {mult}n | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games", default="tanh16,breast,digits2")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--peers", type=Path, help="a regression_bench JSON")
    parser.add_argument("--own-time", action="store_true", help="time gp's fit instead")
    parser.add_argument("--gp-file", type=Path, help="with --own-time: another gp.py")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gp_variants.json"))
    parser.add_argument("--set", action="append", default=[], help="gp constant, NAME=VALUE")
    args = parser.parse_args()
    for item in args.set:
        name, value = item.split("=")
        kind = type(getattr(gp, name))
        setattr(gp, name, value if kind is str else kind(float(value)))
    if args.own_time:
        own_time(args.gp_file)
        return
    variants = args.variants.split(",")
    if args.peers is None:
        parser.error("--peers is required")
    peers = json.loads(args.peers.read_text())
    makers = {
        "tanh16": lambda: rb.tanh_cases(args.count),
        "digits2": lambda: rb.digits_cases(args.count, 2),
        "digits1": lambda: rb.digits_cases(args.count, 1),
        "breast": lambda: rb.breast_cases(args.count),
        "sentiment": lambda: rb.sentiment_cases(args.count),
    }
    results, t0 = [], time.perf_counter()
    for key in args.games.split(","):
        for case in makers[key]():
            results.append(run_case(case, args.seeds, variants, peers))
            print(f"  {case[0]} done at {time.perf_counter() - t0:.0f} s", flush=True)
    report(results, variants)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
