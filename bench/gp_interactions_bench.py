"""Gaussian-process interaction indices against shapiq's approximators at equal coalitions.

    .venv/bin/python bench/gp_interactions_bench.py [--seeds 8] [--tanh 2] [--cancer 1]
        [--heldout 2] [--indices k-SII,SII] [--sentence14] [--factors 4,8,16,32,64]
        [--contenders gp,kernel,svarm,permutation] [--out bench/out]

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
* held-out games (`--heldout N`: N instances of each family of tests/explainers/heldout_games.py,
  threshold, max, product, tree, 10-14 players, used to tune nothing), exact references from all
  2^n coalitions (`interaction_values(..., estimator="exact")` on the game's table).
* `--sentence14`: sentiment-minilm's word game on the 14-word sentence of `auto`'s text rule
  (bench/regression_bench.sentence14_game, its table cached in bench/out), exact references.
One thread. The held-out protocol (issue 28, bench/protocol.py): per family, index and budget,
RMSE over every (game, seed) answer, gp over the best other with a 90% paired bootstrap interval
over answers; families marked tuned-on (tanh, breast-cancer-mlp: gp_interactions was designed on
them) or held-out. gp's own seconds: the median over answers (load-dependent; not a ratio).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from app.settings import Settings  # noqa: E402
from bench.interactions_bench import cancer_ksii_reference, cancer_setup, dense, terms  # noqa: E402
from bench.protocol import ratio_interval  # noqa: E402
from bench.regression_bench import Tabulated, sentence14_game, tanh_cases  # noqa: E402
from explainers import interaction_values  # noqa: E402
from explainers.explanation import OptionError  # noqa: E402
from explainers.games import Game  # noqa: E402
from models.registry import ModelRegistry  # noqa: E402
from tests.explainers.heldout_games import FAMILIES  # noqa: E402
from tests.explainers.heldout_games import game as heldout_game  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
CONTENDERS: tuple[str, ...] = ("gp", "kernel", "svarm", "permutation")  # --contenders
FACTORS: tuple[int, ...] = (4, 8, 16, 32, 64)  # coalitions per player (--factors)


def run(
    label: str, game: Game, n: int, out: int, cost: int, index: str, ref: np.ndarray, seeds: int
) -> list[dict[str, object]]:
    """One game and index: per contender and budget, each seed's mean squared error over all
    terms of order <= 2 (`<name>_sq`, NaN where the contender does not apply) and seconds."""
    keys, rows = terms(n, 2), []
    for factor in FACTORS:
        row: dict[str, object] = {
            "game": label, "index": index, "factor": factor, "coalitions": factor * n
        }
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
                errors.append(float(np.mean((dense(est.interactions, keys) - ref) ** 2)))
            row[f"{name}_sq"] = errors
            row[name] = float(np.sqrt(np.mean(errors)))
            row[f"{name}_s"] = float(np.median(seconds)) if seconds else float("nan")
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_sq")}), flush=True)
        rows.append(row)
    return rows


def family(label: str) -> str:
    return re.sub(r" (seed|x|instance) ?\d+$", "", label)


def table(rows: list[dict[str, object]]) -> str:
    """Per family and index: gp / best other at each budget, answers pooled over its games."""
    groups: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault((family(str(r["game"])), str(r["index"])), []).append(r)
    head = "| game family | index | answers | " + " | ".join(f"{f}n" for f in FACTORS)
    lines = [head + " | gp s (median) |", "|" + "---|" * (len(FACTORS) + 4)]
    for (fam, index), rs in groups.items():
        label = "held-out" if fam.startswith("held-out") else "tuned-on"
        cells, answers, gp_s = [], 0, []
        for factor in FACTORS:
            at = [r for r in rs if r["factor"] == factor]
            ours = np.concatenate([np.asarray(r["gp_sq"], dtype=float) for r in at])
            others = {
                c: np.concatenate([np.asarray(r[f"{c}_sq"], dtype=float) for r in at])
                for c in CONTENDERS[1:]
            }
            answers = len(ours)
            cells.append(str(ratio_interval(ours, others)))
            gp_s += [float(r["gp_s"]) for r in at]  # type: ignore[arg-type]
        lines.append(
            f"| {fam} [{label}] | {index} | {answers} | " + " | ".join(cells)
            + f" | {np.median(gp_s):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    global FACTORS, CONTENDERS
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--tanh", type=int, default=2)
    parser.add_argument("--cancer", type=int, default=1)
    parser.add_argument("--heldout", type=int, default=0, help="instances per held-out family")
    parser.add_argument("--sentence14", action="store_true", help="the 14-word sentence too")
    parser.add_argument("--factors", default="4,8,16,32,64")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="gp first")
    parser.add_argument("--indices", default="k-SII,SII", help="on the tanh games")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    FACTORS = tuple(int(f) for f in args.factors.split(","))
    CONTENDERS = tuple(args.contenders.split(","))
    assert CONTENDERS[0] == "gp"
    rows: list[dict[str, object]] = []
    with threadpool_limits(1):
        small: list[tuple[str, Game, int, int, int]] = [
            (label, Tabulated(game, n), n, out, 50)
            for label, game, n, out, _ in tanh_cases(args.tanh)
        ]
        for family_name in FAMILIES if args.heldout else ():
            for inst in range(args.heldout):
                g = heldout_game(family_name, inst)

                def column(masks: np.ndarray, g: Any = g) -> np.ndarray:
                    return np.asarray(g(masks))[:, None]

                label = f"held-out {family_name} instance {inst}"
                small.append((label, Tabulated(column, g.n_players), g.n_players, 0, 1))
        if args.sentence14:
            tab, k = sentence14_game()
            small.append(("sentiment-minilm 14 words seed 0", tab, tab.n, k, 1))
        for label, game, n, out, cost in small:
            for index in args.indices.split(","):
                exact = interaction_values(game, n, index=index, estimator="exact", output=out)
                assert exact.interactions is not None
                ref = dense(exact.interactions, terms(n, 2))
                rows += run(label, game, n, out, cost, index, ref, args.seeds)
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
