"""Calibration on held-out games (issue 28): does error_std hold on games no one tuned on?

    .venv/bin/python bench/calibration_bench.py [--seeds 16] [--instances 2]
        [--budgets 4,8,16,32] [--families threshold,max,product,tree]
        [--estimators kernel,permutation,gp,surrogate_kernel,msr] [--no-peers]
        [--out /tmp/docs_calibration.md]

Games: tests/explainers/heldout_games.py (threshold, max, product, tree-model; n = 10-14; exact
values by enumeration), `--instances` random instances per family, `--seeds` seeds per instance
and budget. Budgets in coalitions per player (4n ... 32n), one model evaluation per coalition.
Per estimator x family x budget: the share of values within 2 error_std of exact, with a 90%
Wilson interval (values pooled over instances and seeds; the interval treats them as
independent, so it is optimistic where values of one answer are correlated), the count of
collapsed answers (|error| > 0.01 with error_std < 1e-6; must be 0), the share of answers with
a warning (Estimate.warnings), and the RMSE ratio to the best peer (shap KernelExplainer,
shapiq KernelSHAP, shapiq kADDSHAP (order 2), at equal coalitions) with a 90% bootstrap interval
over seeds (the best peer is picked per bootstrap replicate). One BLAS thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.protocol import ratio_interval, wilson  # noqa: E402
from explainers import shapley_values  # noqa: E402
from tests.explainers.heldout_games import FAMILIES, HeldOutGame, game  # noqa: E402

warnings.filterwarnings("ignore")
ESTIMATORS = ("kernel", "permutation", "gp", "surrogate_kernel", "msr")
PEERS = ("shap Kernel", "shapiq KernelSHAP", "shapiq kADDSHAP")


def peers(g: HeldOutGame) -> dict[str, Callable[[int, int], np.ndarray]]:
    """Peer estimators on the mask space, each called as (coalitions, seed) -> values [n]."""
    import shap
    import shapiq

    n = g.n_players

    def f(z: np.ndarray) -> np.ndarray:
        return g(np.asarray(z) > 0.5)

    explainer = shap.KernelExplainer(f, np.zeros((1, n)))

    def shap_kernel(coalitions: int, seed: int) -> np.ndarray:
        np.random.seed(seed)
        vals = explainer.shap_values(np.ones(n), nsamples=coalitions - 2, l1_reg=False, silent=True)
        return np.asarray(vals).reshape(-1)

    class Wrapped(shapiq.Game):
        def __init__(self) -> None:
            super().__init__(n_players=n, normalize=False)

        def value_function(self, coalitions_: np.ndarray) -> np.ndarray:
            return f(coalitions_)

    def shapiq_kernel(coalitions: int, seed: int) -> np.ndarray:
        approx = shapiq.KernelSHAP(n, pairing_trick=True, random_state=seed)
        return np.asarray(approx.approximate(coalitions, Wrapped()).get_n_order_values(1))

    def shapiq_kadd(coalitions: int, seed: int) -> np.ndarray:
        approx = shapiq.kADDSHAP(n, max_order=2, pairing_trick=True, random_state=seed)
        return np.asarray(approx.approximate(coalitions, Wrapped()).get_n_order_values(1))

    return {
        "shap Kernel": shap_kernel,
        "shapiq KernelSHAP": shapiq_kernel,
        "shapiq kADDSHAP": shapiq_kadd,
    }


def run(
    families: tuple[str, ...],
    estimators: tuple[str, ...],
    budgets: tuple[int, ...],
    instances: int,
    seeds: int,
    with_peers: bool,
) -> dict[str, Any]:
    """Raw results: per (contender, family, budget) lists over (instance, seed)."""
    within: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
    collapsed: dict[tuple[str, str, int], int] = defaultdict(int)
    warned: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
    sq: dict[tuple[str, str, int], list[float]] = defaultdict(list)  # per answer: mean sq error
    for family in families:
        for inst in range(instances):
            g = game(family, inst)
            n, truth = g.n_players, g.exact
            peer_fns = peers(g) if with_peers else {}
            for mult in budgets:
                budget = mult * n
                for seed in range(seeds):
                    for name in estimators:
                        est = shapley_values(g, n, estimator=name, budget=budget, seed=seed)
                        err = np.asarray(est.values).reshape(-1) - truth
                        key = (name, family, mult)
                        sq[key].append(float(np.mean(err**2)))
                        warned[key][0] += bool(est.warnings)
                        warned[key][1] += 1
                        if est.error_std is None:
                            continue
                        std = np.asarray(est.error_std).reshape(-1)
                        within[key][0] += int((np.abs(err) <= 2 * std).sum())
                        within[key][1] += n
                        collapsed[key] += int(np.any((np.abs(err) > 0.01) & (std < 1e-6)))
                    for label, fn in peer_fns.items():
                        try:
                            vals = fn(budget, seed)
                            sq[(label, family, mult)].append(float(np.mean((vals - truth) ** 2)))
                        except Exception:  # a peer that does not run at this budget
                            sq[(label, family, mult)].append(float("nan"))
    return {"within": within, "collapsed": collapsed, "warned": warned, "sq": sq}


def table(raw: dict[str, Any], families: tuple[str, ...], estimators: tuple[str, ...],
          budgets: tuple[int, ...]) -> list[str]:
    lines = [
        "| estimator | family | budget | within 2 error_std [90% CI] | collapsed | warned | "
        "RMSE / best peer [90% CI] | best peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in estimators:
        for family in families:
            for mult in budgets:
                key = (name, family, mult)
                hits, total = raw["within"][key]
                lo, hi = wilson(hits, total)
                share = f"{hits / total:.3f} [{lo:.3f}, {hi:.3f}]" if total else "no error_std"
                w_hits, w_total = raw["warned"][key]
                peer_sq = {
                    p: np.array(raw["sq"][(p, family, mult)]) for p in PEERS
                    if (p, family, mult) in raw["sq"]
                }
                ratio = ratio_interval(np.array(raw["sq"][key]), peer_sq)
                lines.append(
                    f"| {name} | {family} | {mult}n | {share} | {raw['collapsed'][key]} | "
                    f"{w_hits}/{w_total} | {ratio} | {ratio.best} |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--budgets", default="4,8,16,32")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--out", default=None, help="write the table as a markdown fragment")
    args = parser.parse_args()
    families = tuple(args.families.split(","))
    estimators = tuple(args.estimators.split(","))
    budgets = tuple(int(b) for b in args.budgets.split(","))
    t0 = time.time()
    raw = run(families, estimators, budgets, args.instances, args.seeds, not args.no_peers)
    lines = table(raw, families, estimators, budgets)
    took = time.time() - t0
    print("\n".join(lines))
    print(f"({took:.0f} s)")
    if args.out:
        command = " ".join(["bench/calibration_bench.py", *sys.argv[1:]])
        Path(args.out).write_text(
            "## Calibration on held-out games (issue 28)\n\n"
            f"Command: `.venv/bin/python {command}` ({took:.0f} s, one BLAS thread, a loaded "
            "2-core machine).\n\n"
            "Held-out families (tests/explainers/heldout_games.py; used to tune nothing): "
            f"{', '.join(families)}; {args.instances} instances each, {args.seeds} seeds per "
            "instance and budget. Games used to tune an estimator (gp's prior and misfit rule, "
            "surrogate_kernel's surrogate: tanh16, digits2, digits1, breast, sentiment-minilm "
            "words, bench/regression_bench.py) are not in this table.\n\n"
            "`within 2 error_std`: share of values with |value - exact| <= 2 error_std, 90% "
            "Wilson interval over values; `collapsed`: answers with a value off by > 0.01 "
            "and error_std < 1e-6; `warned`: answers carrying a warning; RMSE ratio to the "
            "best of shap KernelExplainer, shapiq KernelSHAP and shapiq kADDSHAP (order 2) at "
            "equal coalitions, 90% paired bootstrap interval over answers.\n\n"
            + "\n".join(lines)
            + "\n"
        )


if __name__ == "__main__":
    main()
