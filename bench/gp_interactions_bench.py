"""Gaussian-process interaction indices against shapiq's approximators at equal coalitions.

    .venv/bin/python bench/gp_interactions_bench.py [--seeds 2] [--tanh 2] [--cancer 1]
        [--indices k-SII,SII] [--out bench/out]

Order-2 SII and k-SII (--indices: also STII, FSII, FBII on the tanh games; a contender that
does not apply to an index, such as svarm for FSII, is "nan"), RMSE over all n + n(n-1)/2
terms against a reference, for ours gp
(explainers/estimators/gp_interactions.py) and ours kernel (shapiq KernelSHAPIQ), svarm
(SVARMIQ) and permutation (PermutationSamplingSII), all through `interaction_values` on the
same metered recorder, budgets 4n..64n coalitions:
* tanh-MLP games of bench/regression_bench.py (`tanh_cases`: 16 players, 50 background rows),
  exact references from all 2^16 coalitions;
* breast-cancer-mlp (30 players, 20 background rows, output 1), k-SII only; reference: the mean
  of shapiq KernelSHAPIQ runs at 2^15 coalitions (bench/interactions_bench.py's
  `cancer_ksii_reference`, cached in --out; its own error is printed).
One thread. Table: mean RMSE per contender, gp / best shapiq-based ratio, gp's own seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from app.settings import Settings  # noqa: E402
from bench.interactions_bench import cancer_ksii_reference, cancer_setup, dense, terms  # noqa: E402
from bench.regression_bench import tanh_cases  # noqa: E402
from explainers import interaction_values  # noqa: E402
from explainers.explanation import OptionError  # noqa: E402
from explainers.games import Game  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
CONTENDERS = ("gp", "kernel", "svarm", "permutation")
FACTORS = (4, 8, 16, 32, 64)  # coalitions per player


def run(
    label: str, game: Game, n: int, out: int, cost: int, index: str, ref: np.ndarray, seeds: int
) -> list[dict[str, object]]:
    """One game and index: RMSE per contender and budget, mean over seeds."""
    keys, rows = terms(n, 2), []
    for factor in FACTORS:
        row: dict[str, object] = {"game": label, "index": index, "coalitions": factor * n}
        for name in CONTENDERS:
            errors, seconds = [], []
            for seed in range(seeds):
                start = time.perf_counter()
                budget = factor * n * cost
                try:
                    est = interaction_values(
                        game, n, index=index, estimator=name, budget=budget, seed=seed, output=out
                    )
                except OptionError:  # not available for this index
                    errors.append(float("nan"))
                    continue
                seconds.append(time.perf_counter() - start)
                assert est.interactions is not None and est.n_coalitions <= factor * n
                errors.append(float(np.sqrt(np.mean((dense(est.interactions, keys) - ref) ** 2))))
            row[name] = float(np.mean(errors))
            row[f"{name}_s"] = float(np.mean(seconds))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    head = "| game | index | coalitions | " + " | ".join(CONTENDERS)
    lines = [head + " | gp / best other | gp s |", "|" + "---|" * (len(CONTENDERS) + 5)]
    for r in rows:
        vals = [float(r[c]) for c in CONTENDERS]  # type: ignore[arg-type]
        ratio = vals[0] / float(np.nanmin(vals[1:]))
        cells = " | ".join(f"{v:.4g}" for v in vals)
        gp_s = float(r["gp_s"])  # type: ignore[arg-type]
        lines.append(
            f"| {r['game']} | {r['index']} | {r['coalitions']} | {cells} | {ratio:.2f} | "
            f"{gp_s:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--tanh", type=int, default=2)
    parser.add_argument("--cancer", type=int, default=1)
    parser.add_argument("--indices", default="k-SII,SII", help="on the tanh games")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with threadpool_limits(1):
        for label, game, n, out, _ in tanh_cases(args.tanh):
            for index in args.indices.split(","):
                exact = interaction_values(game, n, index=index, estimator="exact", output=out)
                assert exact.interactions is not None
                ref = dense(exact.interactions, terms(n, 2))
                rows += run(label, game, n, out, 50, index, ref, args.seeds)
        if args.cancer:
            setup = cancer_setup(ModelRegistry(Settings().model_dir), args.cancer)
            cache = args.out / "ksii_reference_breast-cancer-mlp_bg20.npz"
            reference = cancer_ksii_reference(setup, 1 << 15, [0, 1], cache)
            print("cancer k-SII reference error", reference["error_estimate"], flush=True)
            for i in range(args.cancer):
                game = setup.game(i, setup.model.predict)
                ref = reference["k-SII"][i]
                label = f"breast-cancer-mlp x{i}"
                out, cost = setup.outputs[i], setup.cost
                rows += run(label, game, setup.n, out, cost, "k-SII", ref, args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gp_interactions_bench.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
