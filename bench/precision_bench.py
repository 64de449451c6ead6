"""Precision targets: model evaluations to reach target_se, and whether the answer is within
3 target_se of a reference, per estimator, on breast-cancer-mlp's interventional game.

    .venv/bin/python bench/precision_bench.py            # about 2 minutes on 2 cores
    .venv/bin/python bench/precision_bench.py --quick    # 2 explicands, 3 seeds

Game: 30 features, output 1 ("benign", a probability), the first 20 rows of the model's
background (each coalition costs 20 model rows). Explicands: background rows whose predicted
probability lies in [0.05, 0.95] (not saturated). Reference: the mean of our kernel and our
permutation estimates at 2^17 coalitions each (their error is about 2e-4, far below 3 x 0.005).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.settings import Settings
from explainers import shapley_values
from explainers.games.masked import MaskedModelGame
from models.registry import ModelRegistry

OUTPUT = 1
ROWS = 20
TARGETS = (0.01, 0.005)
ESTIMATORS = ("permutation", "kernel", "auto")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_explicands, seeds = (2, 3) if args.quick else (4, 10)
    model = ModelRegistry(Settings().model_dir).get("breast-cancer-mlp")
    assert model.background is not None
    background = model.background[:ROWS]
    pool = model.background[ROWS:]
    p = model.predict(pool)[:, OUTPUT]
    explicands = pool[(p > 0.05) & (p < 0.95)][:n_explicands]
    n = model.n_features

    def game(x: np.ndarray) -> MaskedModelGame:
        return MaskedModelGame(model.predict, x, background, np.arange(n), model.batch_size)

    t0 = time.perf_counter()
    refs = []
    for i, x in enumerate(explicands):
        ests = [
            shapley_values(game(x), n, estimator=e, budget=(1 << 17) * ROWS, seed=100 + i)
            for e in ("kernel", "permutation")
        ]
        refs.append(np.mean([e.values[:, OUTPUT] for e in ests], axis=0))
        gap = float(np.sqrt(np.mean((ests[0].values - ests[1].values)[:, OUTPUT] ** 2)))
        prob = model.predict(x[None])[0, OUTPUT]
        print(
            f"explicand {i}: p = {prob:.3f}, reference RMS kernel-permutation gap {gap:.1e}, "
            f"max |value| {np.abs(refs[-1]).max():.3f}"
        )
    print(f"references: {time.perf_counter() - t0:.1f} s\n")

    header = "| estimator | target_se | model evals (median / max) | reached | within 3 se | "
    print(header + "max |err| / se | picked | s per answer |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for estimator in ESTIMATORS:
        for target in TARGETS:
            evals, reached, within, worst, picked, secs = [], [], [], [], [], []
            for i, x in enumerate(explicands):
                for seed in range(seeds):
                    t = time.perf_counter()
                    est = shapley_values(game(x), n, estimator=estimator, seed=seed,
                                         target_se=target, target_output=OUTPUT)  # fmt: skip
                    secs.append(time.perf_counter() - t)
                    assert est.precision is not None
                    err = np.abs(est.values[:, OUTPUT] - refs[i])
                    evals.append(est.n_evaluations)
                    reached.append(est.precision.reached)
                    within.append(err <= 3 * target)
                    worst.append(err.max() / target)
                    picked.append(est.estimator)
            names = sorted(set(picked))
            share = ", ".join(f"{k} {picked.count(k)}/{len(picked)}" for k in names)
            print(
                f"| {estimator} | {target} | {int(np.median(evals)):,} / {max(evals):,} | "
                f"{np.mean(reached):.0%} | {np.mean(within):.2%} | {max(worst):.2f} | {share} | "
                f"{np.median(secs):.2f} |"
            )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; {len(explicands)} explicands x {seeds} seeds")


if __name__ == "__main__":
    main()
