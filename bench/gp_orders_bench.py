"""gp-orders (explainers/estimators/gp_orders.py, issue 17) against gp, kernel and the best of
shap KernelExplainer / shapiq KernelSHAP at equal coalitions, on regression_bench's games.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/gp_orders_bench.py \
        [--games tanh16,digits2,breast,digits1] [--count 3] [--seeds 3] [--raw]

Prints per family and budget (2n..64n): mean over games of each RMSE (mean over seeds) over
the best peer's, the share of values within 2 error_std of exact, and median own seconds.
`--raw`: gp-orders without gp's misfit check too (the posterior alone).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.regression_bench import (
    MULTIPLES,
    Case,
    Timed,
    breast_cases,
    digits_cases,
    peers,
    tanh_cases,
)
from explainers import shapley_values
from explainers.estimators import gp_orders
from explainers.estimators.base import Estimate
from explainers.games import GameRecorder


def _orders(game: Timed, n: int, budget: int, seed: int, check: bool) -> Estimate:
    gp_orders.CHECK = check
    try:
        return gp_orders.gp_orders(GameRecorder(game, n, budget), np.random.default_rng(seed))
    finally:
        gp_orders.CHECK = True


def run_case(case: Case, seeds: int, raw: bool) -> dict[str, Any]:
    """RMSE per contender, coverage and own time per budget for one game."""
    _, inner, n, out, exact = case
    cost = int(getattr(inner, "rows_per_coalition", 1))
    game = Timed(inner, cost)
    ours = ["gp-orders", "gp", "kernel"] + (["gp-orders-raw"] if raw else [])
    rows: dict[str, Any] = {}
    for mult in MULTIPLES:
        coalitions = min(mult * n, (1 << n) - 2)
        rmse: dict[str, list[float]] = {}
        cover: dict[str, list[float]] = {}
        own: dict[str, list[float]] = {}
        for seed in range(seeds):
            for est in ours:
                game.seconds = 0.0
                t0 = time.perf_counter()
                budget = coalitions * cost
                if est.startswith("gp-orders"):
                    e = _orders(game, n, budget, seed, est == "gp-orders")
                else:
                    e = shapley_values(game, n, estimator=est, budget=budget, seed=seed)
                own.setdefault(est, []).append(time.perf_counter() - t0 - game.seconds)
                err = e.values[:, out] - exact
                rmse.setdefault(est, []).append(float(np.sqrt(np.mean(err**2))))
                if e.error_std is not None:
                    inside = np.abs(err) <= 2 * e.error_std[:, out]
                    cover.setdefault(est, []).append(float(np.mean(inside)))
            for label, call in peers(game, n, out).items():
                vals = call(coalitions, seed)
                rmse.setdefault(label, []).append(float(np.sqrt(np.mean((vals - exact) ** 2))))
        mean = {k: float(np.mean(v)) for k, v in rmse.items()}
        best = min(mean["shap Kernel"], mean["shapiq KernelSHAP"])
        rows[str(mult)] = {
            "coalitions": coalitions,
            "ratio": {est: mean[est] / best for est in ours},
            "cover": {est: float(np.mean(v)) for est, v in cover.items()},
            "own": {est: float(np.median(v)) for est, v in own.items()},
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games", default="tanh16,digits2,breast,digits1")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args()
    makers = {
        "tanh16": lambda: tanh_cases(args.count),
        "digits2": lambda: digits_cases(args.count, 2),
        "digits1": lambda: digits_cases(args.count, 1),
        "breast": lambda: breast_cases(args.count),
    }
    t0 = time.perf_counter()
    for key in args.games.split(","):
        results = []
        for case in makers[key]():
            results.append(run_case(case, args.seeds, args.raw))
            print(f"  {case[0]} done at {time.perf_counter() - t0:.0f} s", flush=True)
        ests = list(results[0]["2"]["ratio"])
        print(f"\n{key} ({len(results)} games x {args.seeds} seeds): RMSE / best peer")
        print(
            "| coalitions | "
            + " | ".join(ests)
            + " | "
            + " | ".join(f"{e} within 2 se" for e in ests if e != "kernel")
            + " | "
            + " | ".join(f"{e} own s" for e in ests)
            + " |"
        )
        for mult in MULTIPLES:
            b = [r[str(mult)] for r in results]
            ratio = [np.mean([x["ratio"][e] for x in b]) for e in ests]
            cover = [np.mean([x["cover"][e] for x in b]) for e in ests if e != "kernel"]
            own = [np.median([x["own"][e] for x in b]) for e in ests]
            print(
                f"| {mult}n = {b[0]['coalitions']} | "
                + " | ".join(f"{v:.2f}" for v in ratio)
                + " | "
                + " | ".join(f"{v:.2f}" for v in cover)
                + " | "
                + " | ".join(f"{v:.3f}" for v in own)
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
