"""Interaction-index benchmark: accuracy per budget for SV and k-SII (order 2), ours vs shapiq.

    .venv/bin/python bench/interactions_bench.py [--quick] [--only cancer|digits]
        [--table-seeds N] [--out bench/out]

One process, one thread for torch and BLAS (set by bench/shapley_bench.py on import, whose
instruments this script reuses: the counting wrapper around `model.predict`, the interleaved,
rotating contender order, the JSON output to bench/out/).

Games:
* breast-cancer-mlp, output 1 ("benign"), the first 20 background rows (MaskedModelGame):
  30 players. SV reference: the cached high-budget reference of shapley_bench (our kernel +
  our permutation, 2^18 coalitions each). k-SII reference: shapiq KernelSHAPIQ at 2^17
  coalitions, mean over 3 seeds, cached in bench/out/ (the seeds' spread is reported).
* digits-cnn, 2x2 patches (16 players), zero baseline (one reference row), output = the
  predicted class of each image; explicands are the first test rows of distinct labels. Exact
  references from all 2^16 coalitions through `interaction_values(..., estimator="exact")`,
  cross-checked against shapiq's ExactComputer on the first explicand. `--table-seeds N` adds
  an accuracy-only SV check with N seeds on those exact tables (no model calls, no timing).

Contenders at budgets of 2^9..2^14 coalitions:
* SV: ours kernel, ours permutation (`shapley_values`), shapiq KernelSHAP (paired),
  PermutationSamplingSV, SVARM.
* k-SII: ours kernel / svarm / permutation (`interaction_values`, shapiq approximators on our
  memoised, metered GameRecorder), shapiq KernelSHAPIQ / SVARMIQ / PermutationSamplingSII called
  directly on an unmemoised shapiq.Game, and "ours permutation (memo-aware)": a bench-only
  sketch of the fix proposed in docs/benchmarks.md (same approximator, nominal budget raised so
  that the *distinct* coalitions fill the budget).

Error: RMSE over all terms (SV: the n values; k-SII: the n + n(n-1)/2 terms of orders 1 and 2;
a term an estimator did not return counts as 0) against the reference. Rows: real model rows,
counted by the wrapper. SVARM-IQ costs seconds per call (shapiq's per-interaction Python loop),
so it runs at fewer budgets and explicands; the tables say how many runs each cell has.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import shapiq  # noqa: E402

from app.settings import Settings  # noqa: E402
from bench.protocol import ratio_interval  # noqa: E402
from bench.shapley_bench import (  # noqa: E402  (also limits torch/BLAS to one thread)
    Contender,
    CountingPredict,
    _json_default,
    load_average,
    machine_info,
    reference_values,
)
from explainers import interaction_values, shapley_values  # noqa: E402
from explainers.games import GameRecorder, all_masks  # noqa: E402
from explainers.games.masked import MaskedModelGame, patch_groups  # noqa: E402
from models.builtin.trained import dataset_split  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

warnings.filterwarnings("ignore", module="shapiq")
warnings.filterwarnings("ignore", category=UserWarning)

SVARM_IQ = ("ours svarm", "shapiq SVARMIQ")  # seconds per call: fewer budgets and runs


# --------------------------------------------------------------------------------------------
# Games


@dataclass
class Setup:
    """One model as a game per explicand: players, rows per coalition, the output explained."""

    label: str
    model: Any
    xs: np.ndarray
    references: np.ndarray  # [r, *input_shape]
    groups: np.ndarray | None
    outputs: list[int]  # per explicand
    picks: list[int] | None = None  # test-split rows, where not the first ones

    @property
    def n(self) -> int:
        return int(self.groups.max()) + 1 if self.groups is not None else self.model.n_features

    @property
    def cost(self) -> int:
        return len(self.references)

    def game(self, i: int, predict: Callable[[np.ndarray], np.ndarray]) -> MaskedModelGame:
        return MaskedModelGame(
            predict, self.xs[i], self.references, self.groups, max_rows=self.model.batch_size
        )


def cancer_setup(reg: ModelRegistry, n_x: int) -> Setup:
    model = reg.get("breast-cancer-mlp")
    xs = dataset_split("breast-cancer-mlp").x_test[:n_x]
    bg = np.ascontiguousarray(model.background[:20])
    return Setup("breast-cancer-mlp", model, xs, bg, None, [1] * n_x)


def digits_setup(reg: ModelRegistry, n_x: int) -> Setup:
    model = reg.get("digits-cnn")
    split = dataset_split("digits-cnn")
    # the first test rows of distinct labels (the first three rows are all sixes)
    first = {int(y): j for j, y in reversed(list(enumerate(split.y_test)))}
    picks = sorted(first.values())[:n_x]
    xs = split.x_test[picks]
    groups, _ = patch_groups(model.input_shape, 2)
    zero = np.zeros((1, *model.input_shape), dtype=np.float32)
    outputs = [int(k) for k in model.predict(xs).argmax(axis=1)]  # the predicted class
    return Setup("digits-cnn (2x2 patches)", model, xs, zero, groups, outputs, picks)


def terms(n: int, order: int) -> list[tuple[int, ...]]:
    return [t for k in range(1, order + 1) for t in combinations(range(n), k)]


def dense(values: dict[tuple[int, ...], float], keys: list[tuple[int, ...]]) -> np.ndarray:
    return np.array([values.get(t, 0.0) for t in keys])


def from_shapiq(iv: Any, keys: list[tuple[int, ...]]) -> np.ndarray:
    """InteractionValues -> the dense vector over `keys` (missing terms are 0)."""
    look = iv.interaction_lookup
    return np.array([float(iv.values[look[t]]) if t in look else 0.0 for t in keys])


# --------------------------------------------------------------------------------------------
# References


def digits_reference(setup: Setup) -> dict[str, Any]:
    """Exact SV and k-SII per explicand from all 2^n coalitions (one evaluation, two indices),
    plus shapiq's ExactComputer on the same table for the first explicand (a cross-check)."""
    n = setup.n
    masks = all_masks(n)
    sv, ksii, seconds, lookups = [], [], [], []
    keys = terms(n, 2)
    cross: dict[str, float] = {}
    for i, out in enumerate(setup.outputs):
        start = time.perf_counter()
        table = setup.game(i, setup.model.predict)(masks)[:, out]
        weights = 1 << np.arange(n)

        def lookup(
            m: np.ndarray, table: np.ndarray = table, weights: np.ndarray = weights
        ) -> np.ndarray:
            return table[(np.atleast_2d(m).astype(np.int64) * weights).sum(axis=1)]

        budget = (1 << n) * setup.cost
        r_sv = interaction_values(lookup, n, index="SV", estimator="exact", budget=budget)
        r_k = interaction_values(
            lookup, n, index="k-SII", max_order=2, estimator="exact", budget=budget
        )
        lookups.append(lookup)
        sv.append(np.asarray(r_sv.values, dtype=float).reshape(-1))
        ksii.append(dense(r_k.interactions, keys))
        seconds.append(time.perf_counter() - start)
        if i == 0:
            exact = shapiq.ExactComputer(lookup, n_players=n)
            theirs_k = from_shapiq(exact("k-SII", 2), keys)
            theirs_sv = from_shapiq(exact("SV", 1), [(j,) for j in range(n)])
            cross = {
                "ksii_max_abs_diff_vs_shapiq_exact": float(np.abs(theirs_k - ksii[0]).max()),
                "sv_max_abs_diff_vs_shapiq_exact": float(np.abs(theirs_sv - sv[0]).max()),
                "max_abs_term": float(np.abs(ksii[0]).max()),
            }
    return {
        "SV": np.stack(sv),
        "lookups": lookups,  # table games (v by coalition index) for the accuracy-only check
        "k-SII": np.stack(ksii),
        "seconds_per_explicand": float(np.mean(seconds)),
        "cross_check": cross,
        "error_estimate": 0.0,
    }


def cancer_ksii_reference(
    setup: Setup, coalitions: int, seeds: list[int], cache: Path
) -> dict[str, Any]:
    """shapiq KernelSHAPIQ at `coalitions`, mean over `seeds`, per explicand; cached.

    The seeds' spread gives the reference's own error: per term std / sqrt(#seeds), RMS over
    terms. (A bias shared by all seeds would not show there; see the permutation check in the
    report, whose estimator is unbiased.)"""
    store: dict[str, np.ndarray] = {}
    if cache.exists():
        with np.load(cache) as f:
            store = {k: f[k] for k in f.files}
    n = setup.n
    keys = terms(n, 2)
    refs, errs, spreads, seconds, used = [], [], [], [], []
    for i, out in enumerate(setup.outputs):
        # reuse the largest cached budget >= the one asked for (quick reuses full's)
        cached = sorted(
            {int(k.split("_c")[1].split("_")[0]) for k in store if k.startswith(f"x{i}_c")}
        )
        best = max((c for c in cached if c >= coalitions), default=coalitions)
        runs = []
        for s in seeds:
            key = f"x{i}_c{best}_s{s}"
            if key not in store:
                start = time.perf_counter()
                game = setup.game(i, setup.model.predict)
                iv = shapiq.KernelSHAPIQ(n, 2, "k-SII", random_state=1000 + s).approximate(
                    best, lambda m, game=game, out=out: game(np.atleast_2d(m))[:, out]
                )
                store[key] = from_shapiq(iv, keys)
                store[key + "_seconds"] = np.array(time.perf_counter() - start)
                cache.parent.mkdir(parents=True, exist_ok=True)
                np.savez(cache, **store)
            runs.append(store[key])
            seconds.append(float(store[key + "_seconds"]))
        a = np.stack(runs)
        refs.append(a.mean(axis=0))
        sd = a.std(axis=0, ddof=1)
        spreads.append(float(np.sqrt(np.mean(sd**2))))  # one run's RMS error (within-method)
        errs.append(float(np.sqrt(np.mean(sd**2)) / np.sqrt(len(seeds))))
        used.append(best)
    return {
        "k-SII": np.stack(refs),
        "coalitions": used,
        "seeds": seeds,
        "single_run_rms_spread": spreads,
        "error_estimate_per_explicand": errs,
        "error_estimate": float(np.sqrt(np.mean(np.square(errs)))),
        "seconds_per_run": float(np.mean(seconds)),
    }


# --------------------------------------------------------------------------------------------
# Contenders


def shapiq_game(inner: MaskedModelGame, n: int, out: int) -> shapiq.Game:
    """A plain, unmemoised shapiq.Game (normalize=False: v(empty) is kept) on our game."""

    class Wrapped(shapiq.Game):
        def __init__(self) -> None:
            super().__init__(n_players=n, normalize=False)

        def value_function(self, coalitions: np.ndarray) -> np.ndarray:
            return inner(coalitions)[:, out]

    return Wrapped()


def sv_contenders(setup: Setup) -> list[Contender]:
    n, cost = setup.n, setup.cost
    model = setup.model

    def ours(estimator: str) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, c: int) -> tuple[np.ndarray, float]:
            est = shapley_values(
                setup.game(i, counter), n, estimator=estimator, budget=c * cost, seed=seed
            )
            out = setup.outputs[i]
            return est.values[:, out], float(est.base_value[out])

        return Contender(f"ours {estimator}", "ours", call, counter)

    def theirs(label: str, make: Callable[[int], Any]) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, c: int) -> tuple[np.ndarray, float]:
            game = shapiq_game(setup.game(i, counter), n, setup.outputs[i])
            iv = make(seed).approximate(c, game)
            return from_shapiq(iv, [(j,) for j in range(n)]), float(iv.baseline_value)

        return Contender(label, "shapiq", call, counter)

    return [
        ours("kernel"),
        ours("permutation"),
        theirs(
            "shapiq KernelSHAP", lambda s: shapiq.KernelSHAP(n, pairing_trick=True, random_state=s)
        ),
        theirs("shapiq PermutationSV", lambda s: shapiq.PermutationSamplingSV(n, random_state=s)),
        theirs("shapiq SVARM", lambda s: shapiq.SVARM(n, random_state=s)),
        theirs(
            "shapiq kADDSHAP",
            lambda s: shapiq.kADDSHAP(n, max_order=2, pairing_trick=True, random_state=s),
        ),
    ]


def protocol_table(section: dict[str, Any]) -> list[str]:
    """The held-out protocol's ratios (bench/protocol.py): each of ours over the best shapiq
    contender per budget, RMSE over every (explicand, seed) answer, 90% paired bootstrap
    interval; contenders with fewer runs (the slow SVARM ones) are left out of the best."""
    runs, budgets = section["runs"], section["budgets_coalitions"]
    theirs = [c for c in runs if c.startswith("shapiq")]
    lines = [
        f"{section['game']} {section['index']}: ours / best shapiq [90%], "
        f"{section['explicands']} explicands x {len(section['seeds'])} seeds",
        "| contender | " + " | ".join(f"2^{b.bit_length() - 1}" for b in budgets) + " |",
        "|---|" + "---|" * len(budgets),
    ]
    for name in [c for c in runs if c.startswith("ours")]:
        cells = []
        for b in budgets:
            if b not in runs[name]:
                cells.append("-")
                continue
            sq = {c: np.array([r["rmse"] ** 2 for r in runs[c].get(b, [])]) for c in theirs}
            ratio = ratio_interval(np.array([r["rmse"] ** 2 for r in runs[name][b]]), sq)
            cells.append(f"{ratio} ({ratio.best.removeprefix('shapiq ')})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def memo_aware_budget(n: int, coalitions: int) -> int:
    """Nominal budget for shapiq's PermutationSamplingSII (order <= 2) on a memoised game such
    that its *distinct* coalitions stay within `coalitions`.

    A permutation p costs shapiq 2n + 4(n-1) nominal evaluations, but only 2n - 2 coalitions that
    no other permutation can share: the n - 1 proper non-empty prefixes and the n - 1 sets
    "prefix_k plus p[k+1]"; every other subset it asks for is a prefix again, or the empty or
    full set (shared by all). shapiq charges 1 for v(empty) up front."""
    cost = 2 * n + 4 * (n - 1)
    perms = max(1, (coalitions - 2) // (2 * n - 2))
    return 1 + perms * cost


def ksii_contenders(setup: Setup) -> list[Contender]:
    n, cost = setup.n, setup.cost
    model = setup.model
    keys = terms(n, 2)

    def ours(estimator: str) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, c: int) -> tuple[np.ndarray, float]:
            res = interaction_values(
                setup.game(i, counter),
                n,
                index="k-SII",
                max_order=2,
                estimator=estimator,
                budget=c * cost,
                seed=seed,
                output=setup.outputs[i],
            )
            return dense(res.interactions, keys), float(res.base_value)

        return Contender(f"ours {estimator}", "ours", call, counter)

    def theirs(label: str, make: Callable[[int], Any]) -> Contender:
        counter = CountingPredict(model.predict)

        def call(i: int, seed: int, c: int) -> tuple[np.ndarray, float]:
            game = shapiq_game(setup.game(i, counter), n, setup.outputs[i])
            iv = make(seed).approximate(c, game)
            return from_shapiq(iv, keys), float(iv.baseline_value)

        return Contender(label, "shapiq", call, counter)

    # The proposed fix for ours permutation, sketched here (explainers/ is not edited): the same
    # approximator on the same memoised recorder, with the nominal budget of memo_aware_budget.
    memo_counter = CountingPredict(model.predict)

    def memo_aware(i: int, seed: int, c: int) -> tuple[np.ndarray, float]:
        recorder = GameRecorder(setup.game(i, memo_counter), n, c * cost)
        out = setup.outputs[i]
        approx = shapiq.PermutationSamplingSII(n, 2, "k-SII", random_state=seed)
        iv = approx.approximate(
            memo_aware_budget(n, c), lambda m: recorder(np.atleast_2d(m))[:, out]
        )
        return from_shapiq(iv, keys), float(iv.baseline_value)

    return [
        ours("kernel"),
        ours("svarm"),
        ours("permutation"),
        Contender("ours permutation (memo-aware)", "proposed", memo_aware, memo_counter),
        theirs("shapiq KernelSHAPIQ", lambda s: shapiq.KernelSHAPIQ(n, 2, "k-SII", random_state=s)),
        theirs("shapiq SVARMIQ", lambda s: shapiq.SVARMIQ(n, 2, "k-SII", random_state=s)),
        theirs(
            "shapiq PermutationSII",
            lambda s: shapiq.PermutationSamplingSII(n, 2, "k-SII", random_state=s),
        ),
    ]


# --------------------------------------------------------------------------------------------
# The grid


def run_grid(
    contenders: list[Contender],
    ref: np.ndarray,
    n_players: int,
    n_x: int,
    seeds: list[int],
    budgets: list[int],
    slow: dict[str, tuple[list[int], int]],
) -> dict[str, Any]:
    """Every contender on every (explicand, seed, budget), interleaved in rotating order.

    `slow[name] = (budgets, runs)`: that contender only runs at those budgets and on the first
    `runs` (explicand, seed) pairs. Returns per-run records and the values at the top budget."""
    for c in contenders:  # warm-up: imports, caches, first-call costs (not the slow ones:
        if c.name not in slow:  # seconds per call, and nothing to warm up)
            c.run(0, 999, budgets[0])
    pairs = [(i, s) for i in range(n_x) for s in seeds]
    records: dict[str, dict[int, list[dict[str, Any]]]] = {c.name: {} for c in contenders}
    k = 0
    for b in budgets:
        t0 = time.perf_counter()
        for j, (i, seed) in enumerate(pairs):
            order = contenders[k % len(contenders) :] + contenders[: k % len(contenders)]
            k += 1
            for c in order:
                if c.name in slow and (b not in slow[c.name][0] or j >= slow[c.name][1]):
                    continue
                run = c.run(i, seed, b)
                err = run.values - ref[i]
                records[c.name].setdefault(b, []).append(
                    {
                        "x": i,
                        "seed": seed,
                        "rmse": float(np.sqrt(np.mean(err**2))),
                        "rmse_order1": float(np.sqrt(np.mean(err[:n_players] ** 2))),
                        "rmse_order2": float(np.sqrt(np.mean(err[n_players:] ** 2)))
                        if len(err) > n_players
                        else None,
                        "seconds": run.seconds,
                        "model_seconds": run.model_seconds,
                        "rows": run.rows,
                        "values": run.values,
                    }
                )
        print(f"    {b} coalitions: {time.perf_counter() - t0:.1f} s", flush=True)
    return records


def summarise(records: dict[str, Any], cost: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, per_b in records.items():
        summary[name] = {}
        for b, rs in per_b.items():
            e = np.array([r["rmse"] for r in rs])
            summary[name][b] = {
                "rmse_mean": float(e.mean()),
                "rmse_order1_mean": float(np.mean([r["rmse_order1"] for r in rs])),
                "rmse_order2_mean": float(np.mean([r["rmse_order2"] for r in rs]))
                if rs[0]["rmse_order2"] is not None
                else None,
                "rmse_sem": float(e.std(ddof=1) / np.sqrt(len(e))) if len(e) > 1 else None,
                "runs": len(e),
                "seconds_median": float(np.median([r["seconds"] for r in rs])),
                "model_seconds_median": float(np.median([r["model_seconds"] for r in rs])),
                "coalitions_median": float(np.median([r["rows"] for r in rs])) / cost,
                "coalitions_max": max(r["rows"] for r in rs) // cost,
            }
    return summary


def seed_check(records: dict[str, Any], budget: int) -> dict[str, Any]:
    """At `budget`: each contender's seed-to-seed spread, RMS(v_s0 - v_s1) / sqrt 2 (one run's
    own error), against its RMSE to the reference. For an unbiased estimator RMSE^2 ~ spread^2 +
    reference error^2 (+ reference bias^2): RMSE well above the spread means bias somewhere."""
    out = {}
    for name, per_b in records.items():
        rs = per_b.get(budget, [])
        by_x: dict[int, list[dict[str, Any]]] = {}
        for r in rs:
            by_x.setdefault(r["x"], []).append(r)
        diffs = [
            float(np.sqrt(np.mean((v[0]["values"] - v[1]["values"]) ** 2)) / np.sqrt(2))
            for v in by_x.values()
            if len(v) >= 2
        ]
        if diffs:
            out[name] = {
                "seed_spread": float(np.mean(diffs)),
                "rmse": float(np.mean([r["rmse"] for r in rs])),
            }
    return out


def verdict(summary: dict[str, Any], budgets: list[int], ours_default: str) -> dict[str, Any]:
    """Per budget: the most accurate shapiq contender, ours (default and best), errors and
    time ratios. Only contenders with runs at every budget of the grid count as "best"."""
    out = {}
    for b in budgets:
        cells = {k: v[b] for k, v in summary.items() if b in v}
        full = {
            k: v for k, v in cells.items() if v["runs"] == max(c["runs"] for c in cells.values())
        }
        peers = {k: v for k, v in full.items() if k.startswith("shapiq")}
        ours = {k: v for k, v in full.items() if k.startswith("ours") and "memo-aware" not in k}
        if not peers or not ours:
            continue
        best_peer = min(peers, key=lambda k: peers[k]["rmse_mean"])
        best_ours = min(ours, key=lambda k: ours[k]["rmse_mean"])
        p = peers[best_peer]
        out[b] = {
            "best_shapiq": best_peer,
            "best_shapiq_rmse": p["rmse_mean"],
            "best_shapiq_seconds": p["seconds_median"],
            "ours_default": ours_default,
            "ours_default_rmse_ratio": cells[ours_default]["rmse_mean"] / p["rmse_mean"],
            "ours_default_time_ratio": cells[ours_default]["seconds_median"] / p["seconds_median"],
            "best_ours": best_ours,
            "best_ours_rmse_ratio": ours[best_ours]["rmse_mean"] / p["rmse_mean"],
            "best_ours_time_ratio": ours[best_ours]["seconds_median"] / p["seconds_median"],
        }
    return out


def bench_index(
    setup: Setup,
    index: str,
    ref: dict[str, Any],
    seeds: list[int],
    budgets: list[int],
    slow: dict[str, tuple[list[int], int]],
) -> dict[str, Any]:
    contenders = sv_contenders(setup) if index == "SV" else ksii_contenders(setup)
    records = run_grid(contenders, ref[index], setup.n, len(setup.xs), seeds, budgets, slow)
    summary = summarise(records, setup.cost)
    default = "ours kernel"
    return {
        "game": setup.label,
        "index": index,
        "n_players": setup.n,
        "n_terms": int(ref[index].shape[1]),
        "rows_per_coalition": setup.cost,
        "explicands": len(setup.xs),
        "outputs": setup.outputs,
        "seeds": seeds,
        "budgets_coalitions": budgets,
        "slow": {k: {"budgets": v[0], "runs": v[1]} for k, v in slow.items()},
        # the RMSE of an all-zero estimate, overall and per order (mean over explicands)
        "reference_rms_magnitude": float(np.mean(np.sqrt(np.mean(ref[index] ** 2, axis=1)))),
        "reference_rms_order1": float(
            np.mean(np.sqrt(np.mean(ref[index][:, : setup.n] ** 2, axis=1)))
        ),
        "reference_rms_order2": float(
            np.mean(np.sqrt(np.mean(ref[index][:, setup.n :] ** 2, axis=1)))
        )
        if ref[index].shape[1] > setup.n
        else None,
        "reference_error_estimate": ref.get("error_estimate"),
        "summary": summary,
        "seed_check_top_budget": seed_check(records, budgets[-1]),
        "verdict": verdict(summary, budgets, default),
        "runs": {
            name: {
                b: [{k: v for k, v in r.items() if k != "values"} for r in rs]
                for b, rs in per_b.items()
            }
            for name, per_b in records.items()
        },
    }


def table_sv_check(
    setup: Setup, dref: dict[str, Any], seeds: list[int], budgets: list[int]
) -> dict[str, Any]:
    """Accuracy only, with more seeds than the timed grid: the SV contenders (SVARM excepted,
    too slow) on the exact value tables of the digits explicands, so no model calls."""
    n = setup.n
    singles = [(j,) for j in range(n)]

    def ours(estimator: str) -> Callable[[Any, int, int], np.ndarray]:
        return lambda game, s, c: shapley_values(
            game, n, estimator=estimator, budget=c, seed=s
        ).values.reshape(-1)

    def theirs(make: Callable[[int], Any]) -> Callable[[Any, int, int], np.ndarray]:
        return lambda game, s, c: from_shapiq(make(s).approximate(c, game), singles)

    contenders = {
        "ours kernel": ours("kernel"),
        "ours permutation": ours("permutation"),
        "shapiq KernelSHAP": theirs(
            lambda s: shapiq.KernelSHAP(n, pairing_trick=True, random_state=s)
        ),
        "shapiq PermutationSV": theirs(lambda s: shapiq.PermutationSamplingSV(n, random_state=s)),
    }
    out: dict[str, Any] = {"seeds": seeds, "explicands": len(dref["lookups"]), "rmse": {}}
    for name, f in contenders.items():
        out["rmse"][name] = {}
        for b in budgets:
            e = np.array(
                [
                    np.sqrt(np.mean((f(game, s, b) - dref["SV"][i]) ** 2))
                    for i, game in enumerate(dref["lookups"])
                    for s in seeds
                ]
            )
            out["rmse"][name][b] = {
                "mean": float(e.mean()),
                "sem": float(e.std(ddof=1) / np.sqrt(len(e))),
            }
    return out


# --------------------------------------------------------------------------------------------
# Report


def print_section(res: dict[str, Any]) -> None:
    print(
        f"\n== {res['index']} on {res['game']}: {res['n_players']} players, {res['n_terms']} terms,"
        f" {res['rows_per_coalition']} rows/coalition, {res['explicands']} explicands x seeds "
        f"{res['seeds']}; RMS reference term {res['reference_rms_magnitude']:.3g}, reference "
        f"error ~{res['reference_error_estimate'] or 0:.2g} =="
    )
    budgets = res["budgets_coalitions"]
    names = list(res["summary"])
    print("RMSE (x1e-3), [runs if fewer]")
    print(f"{'contender':<32}" + "".join(f"{b:>14}" for b in budgets))
    full = max(len(res["seeds"]) * res["explicands"], 1)
    for name in names:
        cells = []
        for b in budgets:
            s = res["summary"][name].get(b)
            if s is None:
                cells.append("-")
                continue
            sem = f"±{s['rmse_sem'] * 1e3:.2f}" if s["rmse_sem"] is not None else ""
            mark = f"[{s['runs']}]" if s["runs"] < full else ""
            cells.append(f"{s['rmse_mean'] * 1e3:.2f}{sem}{mark}")
        print(f"{name:<32}" + "".join(f"{c:>14}" for c in cells))
    print("wall ms (median) / distinct coalitions used (max)")
    for name in names:
        cells = []
        for b in budgets:
            s = res["summary"][name].get(b)
            cells.append(
                "-" if s is None else f"{s['seconds_median'] * 1e3:.0f}/{s['coalitions_max']}"
            )
        print(f"{name:<32}" + "".join(f"{c:>14}" for c in cells))
    print(
        "verdict per budget (ours kernel and our best vs the best shapiq: RMSE ratio, time ratio)"
    )
    for b, v in res["verdict"].items():
        print(
            f"  {b:>6}: best shapiq {v['best_shapiq']} {v['best_shapiq_rmse'] * 1e3:.2f}e-3 in "
            f"{v['best_shapiq_seconds'] * 1e3:.0f} ms; ours kernel "
            f"x{v['ours_default_rmse_ratio']:.2f} err, x{v['ours_default_time_ratio']:.2f} time; "
            f"best ours ({v['best_ours']}) "
            f"x{v['best_ours_rmse_ratio']:.2f} err, x{v['best_ours_time_ratio']:.2f} time"
        )
    if res["reference_rms_order2"] is not None:
        print(
            f"all-zero estimate: RMSE {res['reference_rms_magnitude'] * 1e3:.2f}e-3 (order 1 "
            f"{res['reference_rms_order1'] * 1e3:.2f}, "
            f"order 2 {res['reference_rms_order2'] * 1e3:.2f})"
        )
        print("RMSE by order at the top budget (x1e-3, order 1 / order 2):")
        for name in names:
            s = res["summary"][name].get(budgets[-1])
            if s is not None:
                print(
                    f"  {name:<32}{s['rmse_order1_mean'] * 1e3:8.2f} / "
                    f"{s['rmse_order2_mean'] * 1e3:.2f}"
                )
    print(f"seed check at {budgets[-1]} (seed spread / RMSE, x1e-3):")
    for name, v in res["seed_check_top_budget"].items():
        print(f"  {name:<32}{v['seed_spread'] * 1e3:8.2f} / {v['rmse'] * 1e3:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="< 1 min: fewer of everything")
    parser.add_argument("--only", choices=["cancer", "digits"], help="one game")
    parser.add_argument(
        "--table-seeds",
        type=int,
        default=0,
        help="also: digits SV accuracy on the exact tables with this many seeds (no timing)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--seeds", type=int, default=None, help="grid seeds 0..N-1 (default 2)")
    args = parser.parse_args()
    b9_14 = [1 << p for p in range(9, 15)]
    if args.quick:
        cfg: dict[str, Any] = {
            "cancer_x": 1, "digits_x": 1, "seeds": [0, 1], "budgets": [1 << 9, 1 << 11],
            "sv_ref": 1 << 16, "ksii_ref": 1 << 14, "ksii_ref_seeds": [0, 1],
            "svarm": ([1 << 9], 2), "svarmiq_cancer": ([], 0), "svarmiq_digits": ([1 << 9], 1),
        }  # fmt: skip
    else:
        cfg = {
            "cancer_x": 3, "digits_x": 3, "seeds": [0, 1], "budgets": b9_14,
            "sv_ref": 1 << 18, "ksii_ref": 1 << 17, "ksii_ref_seeds": [0, 1, 2],
            "svarm": (b9_14, 3), "svarmiq_cancer": ([1 << 9], 1),
            "svarmiq_digits": ([1 << 9, 1 << 11], 1),
        }  # fmt: skip
    reg = ModelRegistry(Settings().model_dir)
    res: dict[str, Any] = {
        "quick": args.quick,
        "config": cfg,
        "machine": machine_info(),
        "load_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sections": [],
    }
    t0 = time.perf_counter()
    if args.seeds:
        cfg["seeds"] = list(range(args.seeds))
    seeds, budgets = cfg["seeds"], cfg["budgets"]
    if args.only in (None, "cancer"):
        setup = cancer_setup(reg, cfg["cancer_x"])
        print("breast-cancer-mlp: references ...", flush=True)
        start = time.perf_counter()
        sv_ref = reference_values(
            setup.model,
            setup.xs,
            setup.references,
            cfg["sv_ref"],
            args.out / "reference_breast-cancer-mlp_bg20.npz",
        )
        ks_ref = cancer_ksii_reference(
            setup,
            cfg["ksii_ref"],
            cfg["ksii_ref_seeds"],
            args.out / "ksii_reference_breast-cancer-mlp_bg20.npz",
        )
        ref = {
            "SV": sv_ref["values"],
            "k-SII": ks_ref["k-SII"],
        }
        res["cancer_reference"] = {
            "seconds": time.perf_counter() - start,
            "SV": {k: v for k, v in sv_ref.items() if k != "values"},
            "k-SII": {k: v for k, v in ks_ref.items() if k != "k-SII"},
        }
        print("  SV ...", flush=True)
        ref["error_estimate"] = float(np.mean(sv_ref["reference_rmse_estimate"]))
        res["sections"].append(
            bench_index(setup, "SV", ref, seeds, budgets, {"shapiq SVARM": cfg["svarm"]})
        )
        print_section(res["sections"][-1])
        print("\n".join(protocol_table(res["sections"][-1])), flush=True)
        print("  k-SII ...", flush=True)
        ref["error_estimate"] = ks_ref["error_estimate"]
        slow = dict.fromkeys(SVARM_IQ, cfg["svarmiq_cancer"])
        res["sections"].append(bench_index(setup, "k-SII", ref, seeds, budgets, slow))
        print_section(res["sections"][-1])
        print("\n".join(protocol_table(res["sections"][-1])), flush=True)
    if args.only in (None, "digits"):
        setup = digits_setup(reg, cfg["digits_x"])
        print("digits-cnn: exact references ...", flush=True)
        dref = digits_reference(setup)
        res["digits_reference"] = {
            "seconds_per_explicand": dref["seconds_per_explicand"],
            "cross_check": dref["cross_check"],
            "outputs": setup.outputs,
            "test_rows": setup.picks,
        }
        print("  cross-check vs shapiq ExactComputer:", dref["cross_check"], flush=True)
        for index in ("SV", "k-SII"):
            print(f"  {index} ...", flush=True)
            slow = (
                dict.fromkeys(SVARM_IQ, cfg["svarmiq_digits"])
                if index == "k-SII"
                else {"shapiq SVARM": cfg["svarm"]}
            )
            res["sections"].append(bench_index(setup, index, dref, seeds, budgets, slow))
            print_section(res["sections"][-1])
            print("\n".join(protocol_table(res["sections"][-1])), flush=True)
        if args.table_seeds:
            print(f"  SV accuracy on the exact tables, {args.table_seeds} seeds ...", flush=True)
            chk = table_sv_check(setup, dref, list(range(args.table_seeds)), budgets)
            res["digits_sv_table_check"] = chk
            print(f"{'contender':<24}" + "".join(f"{b:>14}" for b in budgets))
            for name, per_b in chk["rmse"].items():
                cells = [f"{v['mean'] * 1e3:.2f}±{v['sem'] * 1e3:.2f}" for v in per_b.values()]
                print(f"{name:<24}" + "".join(f"{c:>14}" for c in cells))
    res["load_after"] = load_average()
    res["seconds_total"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"interactions_bench{'_quick' if args.quick else ''}.json"
    path.write_text(json.dumps(res, indent=1, default=_json_default))
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    print(f"\nwrote {shown} ({res['seconds_total']:.0f} s)")


if __name__ == "__main__":
    main()
