"""Tree MSR (`estimator: msr`, Witter et al. 2025) against KernelSHAP, the cubic-surrogate
variant and gp on the held-out game families (tests/explainers/heldout_games.py: no estimator
was tuned on them): RMSE against exact values and the share of values within 2 error_std, with
90% bootstrap intervals over seeds, and each estimator's own time.

    .venv/bin/python bench/msr_bench.py [--seeds 8] [--budgets 4,8,16,32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explainers.estimators.library import shapley_values
from tests.explainers.heldout_games import FAMILIES, game

ESTIMATORS = ("kernel", "surrogate_kernel", "gp", "msr")


def interval(x: np.ndarray, rng: np.random.Generator, reps: int = 2000) -> tuple[float, float]:
    """90% bootstrap interval of the mean of x."""
    means = rng.choice(x, size=(reps, len(x)), replace=True).mean(axis=1)
    lo, hi = np.quantile(means, [0.05, 0.95])
    return float(lo), float(hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--budgets", default="4,8,16,32")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    budgets = [int(b) for b in args.budgets.split(",")]
    print(
        "| family | coalitions | estimator | RMSE (90% interval) | RMSE / kernel "
        "| within 2 se | own s |"
    )
    print("|---|---|---|---|---|---|---|")
    for family in FAMILIES:
        for per in budgets:
            rmse: dict[str, np.ndarray] = {}
            rows = []
            for est in ESTIMATORS:
                errs, inside, total, took = [], 0, 0, 0.0
                for seed in range(args.seeds):
                    g = game(family, seed)
                    exact = g.exact
                    t0 = time.perf_counter()
                    r = shapley_values(
                        g, g.n_players, estimator=est, budget=per * g.n_players, seed=seed
                    )
                    took += time.perf_counter() - t0
                    err = np.asarray(r.values) - exact
                    errs.append(float(np.sqrt(np.mean(err**2))))
                    if r.error_std is not None:
                        inside += int((np.abs(err) <= 2 * np.asarray(r.error_std)).sum())
                        total += err.size
                rmse[est] = np.asarray(errs)
                rows.append((est, total and inside / total, took / args.seeds))
            for est, cover, own in rows:
                lo, hi = interval(rmse[est], rng)
                ratio = rmse[est] / np.maximum(rmse["kernel"], 1e-12)
                rlo, rhi = interval(ratio, rng)
                print(
                    f"| {family} | {per}n | {est} | {rmse[est].mean():.4f} ({lo:.4f}-{hi:.4f}) "
                    f"| {ratio.mean():.2f} ({rlo:.2f}-{rhi:.2f}) | {cover:.2f} | {own:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
