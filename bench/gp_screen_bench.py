"""gp's prior choice by successive halving against the full grid (issue 30): the same choice?
the same error? how much cheaper?

    OMP_NUM_THREADS=1 .venv/bin/python bench/gp_screen_bench.py [--seeds 8] [--pers 8,16,32,64]

Two parts, both on the same coalitions for both searches (KernelSHAP's plan), one BLAS thread:

- agreement: the prior and nugget chosen by gp_prior._choose with gp_prior.SCREEN as it is and
  with SCREEN = () (every grid point on every pilot row, the search before issue 30's change),
  on 16 tanh-MLP games of 10-80 players and the held-out instances 0-1 of every family
  (tests/explainers/heldout_games.py; the schedule was picked on these), 8n-64n coalitions;
  the seconds of each search summed over the cases.
- accuracy: RMSE of gp's values (gp._fit) against exact values with each search, on the
  held-out instances 5-7 of every family (used to pick nothing) and the 16-player tanh-MLP
  games of bench/regression_bench.py (2 networks, 50 background rows); per budget the
  geometric mean over games of the screened search's mean RMSE over the full grid's, with a
  90% bootstrap interval over the `--seeds` plans, and gp._fit's seconds with each.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from explainers.estimators import gp, gp_prior, kernel  # noqa: E402
from tests.explainers import heldout_games as hg  # noqa: E402

Game = Callable[[np.ndarray], np.ndarray]
T = TypeVar("T")


def tanh(n: int, seed: int) -> Game:
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(n, 32)) * 2 / np.sqrt(n), rng.normal(size=(32, 2))
    b = rng.normal(size=32) * 0.5
    return lambda masks: np.tanh(masks.astype(float) @ w1 + b) @ w2


def plan_of(n: int, coalitions: int, seed: int) -> kernel.Design:
    planner = kernel.Planner(n, "kernel", np.random.default_rng(seed))
    planner.extend(coalitions)
    return planner.design()


def values(game: Game, plan: kernel.Design) -> np.ndarray:
    v = np.asarray(game(plan.masks), dtype=np.float64).reshape(len(plan.masks), -1)
    return v - v[0]


def timed(screen: tuple[tuple[int, int], ...], call: Callable[[], T]) -> tuple[T, float]:
    kept = gp_prior.SCREEN
    gp_prior.SCREEN = screen
    try:
        t0 = time.perf_counter()
        out = call()
        return out, time.perf_counter() - t0
    finally:
        gp_prior.SCREEN = kept


def agreement(pers: list[int]) -> None:
    cases: list[tuple[str, int, Game]] = [
        (f"tanh{n}-{s}", n, tanh(n, s)) for n in (10, 16, 24, 30, 40, 48, 64, 80) for s in (0, 1)
    ]
    cases += [(g.name, g.n_players, g) for g in hg.games(seeds=range(2))]
    same = total = 0
    seconds = {"full": 0.0, "screened": 0.0}
    differ = []
    for name, n, game in cases:
        for per in pers:
            if per * n > 2560:
                continue
            plan = plan_of(n, per * n, 1)
            z, y = plan.masks[1:].astype(np.float64), values(game, plan)[1:]
            call = partial(gp_prior._choose, z, y)
            full, t_full = timed((), call)
            screened, t_screened = timed(gp_prior.SCREEN, call)
            seconds["full"] += t_full
            seconds["screened"] += t_screened
            keys = [
                (c[0].theta, c[0].gamma, tuple(np.round(c[0].q, 12)), c[1])
                for c in (full, screened)
            ]
            total += 1
            same += keys[0] == keys[1]
            if keys[0] != keys[1]:
                differ.append(f"{name} at {per}n")
    print(f"## Agreement ({total} pilots, {len(cases)} games, {','.join(map(str, pers))}n)")
    print(f"same prior and nugget: {same}/{total}; differ: {', '.join(differ) or 'none'}")
    print(
        f"_choose seconds: full grid {seconds['full']:.2f}, screened {seconds['screened']:.2f}"
        f" ({seconds['full'] / seconds['screened']:.2f}x)\n"
    )


def ratio(errors: list[np.ndarray], idx: np.ndarray) -> float:
    """Geometric mean over games of the screened mean RMSE over the full grid's, on plans idx."""
    return float(np.exp(np.mean([np.log(e[1, idx].mean() / e[0, idx].mean()) for e in errors])))


def accuracy(pers: list[int], seeds: int) -> None:
    import regression_bench as rb

    cases: list[tuple[str, int, Game, np.ndarray]] = [
        (g.name, g.n_players, g, g.exact) for g in hg.games(seeds=range(5, 8))
    ]
    cases += [(name, n, game, exact) for name, game, n, _, exact in rb.tanh_cases(2)]
    print(f"## Accuracy ({len(cases)} games x {seeds} plans)")
    print("| coalitions | screened / full grid RMSE [90%] | gp._fit ms: full | screened | ratio |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for per in pers:
        logs, t_full, t_screened = [], 0.0, 0.0
        for _, n, game, exact in cases:
            errors = np.zeros((2, seeds))
            for seed in range(seeds):
                plan = plan_of(n, per * n, seed)
                y = values(game, plan)[:, :1]
                for j, screen in enumerate([(), gp_prior.SCREEN]):
                    fit, took = timed(screen, partial(gp._fit, plan, y, y[1].copy()))
                    phi = fit[0][:, 0]
                    errors[j, seed] = np.sqrt(((phi - np.asarray(exact).ravel()[:n]) ** 2).mean())
                    if j:
                        t_screened += took
                    else:
                        t_full += took
            logs.append(errors)
        boot = [ratio(logs, rng.integers(0, seeds, seeds)) for _ in range(2000)]
        count = len(cases) * seeds
        print(
            f"| {per}n | {ratio(logs, np.arange(seeds)):.3f} [{np.quantile(boot, 0.05):.3f}, "
            f"{np.quantile(boot, 0.95):.3f}] | {t_full / count * 1e3:.1f} | "
            f"{t_screened / count * 1e3:.1f} | {t_full / t_screened:.2f}x |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--pers", default="8,16,32,64")
    args = parser.parse_args()
    pers = [int(p) for p in args.pers.split(",")]
    with threadpool_limits(1):
        agreement(pers)
        accuracy(pers, args.seeds)


if __name__ == "__main__":
    main()
