"""Calibration of the Gaussian-process interaction estimator's standard deviations.

    .venv/bin/python bench/gp_interactions_calibration.py [--games tanh16,digits2,breast]
        [--seeds 3] [--factors 4,16,64] [--indices SII,k-SII]

Order-2 SII and k-SII by explainers/estimators/gp_interactions.py on the games of
bench/regression_bench.py (tanh16: `tanh_cases(2)`, digits2: `digits_cases(2, 2)`, exact
references from all 2^16 coalitions; breast: `breast_cases(1)`, k-SII only, reference: the
cached shapiq KernelSHAPIQ mean of bench/gp_interactions_bench.py). Per case, index and budget
(coalitions per player), over seeds: the share of terms within 2 sd of the reference (all,
order 1, order 2), the mean sd over the RMS error, and gp's own seconds. One thread. The
calibration rules compared before the current one (gp's likelihood scale alone, the halves):
this bench's `--variant` at commit b652db0.
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
import torch  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

torch.set_num_threads(1)
threadpool_limits(limits=1)

from explainers.estimators import gp_interactions as gpi  # noqa: E402
from explainers.estimators.interactions import distribution_weights  # noqa: E402
from explainers.estimators.library import interaction_values  # noqa: E402
from explainers.games import GameRecorder  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)
Terms = dict[tuple[int, ...], float]


def table_game(game: object, n: int, out: int) -> object:
    """All 2^n values of one output, as a game on masks (bit i = player i)."""
    masks = (np.arange(1 << n)[:, None] >> np.arange(n) & 1).astype(bool)
    table = np.concatenate(
        [np.asarray(game(masks[i : i + 4096]))[:, out] for i in range(0, 1 << n, 4096)]  # type: ignore[operator]
    )
    weights = 1 << np.arange(n)
    return lambda m: table[(np.atleast_2d(m).astype(np.int64) * weights).sum(axis=1)][:, None]


def cases(
    names: list[str], indices: tuple[str, ...] = ("SII", "k-SII")
) -> list[tuple[str, object, int, int, dict[str, Terms], Terms]]:
    """(label, game, n, output, {index: reference}, reference's own sd per term)."""
    from bench.regression_bench import breast_cases, digits_cases, tanh_cases

    out: list[tuple[str, object, int, int, dict[str, Terms], Terms]] = []
    small = []
    if "tanh16" in names:
        small += [(f"tanh16 seed {i}", *c[1:4]) for i, c in enumerate(tanh_cases(2))]
    if "digits2" in names:
        small += [(c[0].replace("digits-cnn ", "digits "), *c[1:4]) for c in digits_cases(2, 2)]
    for label, game, n, col in small:
        tg = table_game(game, n, col)
        refs = {}
        for index in indices:
            ex = interaction_values(tg, n, index=index, estimator="exact", max_order=2)
            assert ex.interactions is not None
            refs[index] = dict(ex.interactions)
        out.append((label, tg, n, 0, refs, {t: 0.0 for t in refs[indices[0]]}))
    if "breast" in names:
        from bench.interactions_bench import terms

        label, game, n, col, _ = breast_cases(1)[0]
        with np.load(ROOT / "bench" / "out" / "ksii_reference_breast-cancer-mlp_bg20.npz") as f:
            runs = np.stack([f[k] for k in f.files if not k.endswith("_seconds")])
        keys = terms(n, 2)
        ref = dict(zip(keys, runs.mean(axis=0).tolist(), strict=True))
        sd = dict(zip(keys, (runs.std(axis=0, ddof=1) / np.sqrt(len(runs))).tolist(), strict=True))
        out.append(("breast row 0", game, n, col, {"k-SII": ref}, sd))
    return out


def measure(
    game: object,
    n: int,
    col: int,
    index: str,
    ref: Terms,
    ref_sd: Terms,
    coalitions: int,
    seed: int,
) -> dict[str, float]:
    """One run: coverage (all, order 1, order 2), mean sd, RMS error, own seconds."""
    recorder = GameRecorder(game, n)  # type: ignore[arg-type]
    w = distribution_weights(index, n, 2)
    start = time.process_time()
    mean, std = gpi.gp_interactions(recorder, w, coalitions, col, np.random.default_rng(seed))
    own = time.process_time() - start
    keys = list(ref)
    err = np.array([mean[t] - ref[t] for t in keys])
    sd = np.array([std[t] for t in keys])
    rsd = np.array([ref_sd[t] for t in keys])
    inside = np.abs(err) <= 2 * np.sqrt(sd**2 + rsd**2)
    first = np.array([len(t) == 1 for t in keys])
    return {
        "all": float(inside.mean()),
        "o1": float(inside[first].mean()),
        "o2": float(inside[~first].mean()),
        "sd": float(sd.mean()),
        "rmse": float(np.sqrt(np.mean(err**2))),
        "own_s": own,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games", default="tanh16,digits2,breast")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--factors", default="4,16,64")
    parser.add_argument("--indices", default="SII,k-SII", help="on tanh16 and digits2")
    args = parser.parse_args()
    rows = []
    print(
        "| case | index | coalitions | within 2 sd (all) | order 1 | order 2 | sd / RMSE | own s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    indices = tuple(args.indices.split(","))
    for label, game, n, col, refs, ref_sd in cases(args.games.split(","), indices):
        for index, ref in refs.items():
            for factor in [int(f) for f in args.factors.split(",")]:
                runs = [
                    measure(game, n, col, index, ref, ref_sd, factor * n, s)
                    for s in range(args.seeds)
                ]
                r = {k: float(np.mean([x[k] for x in runs])) for k in runs[0]}
                r |= {"case": label, "index": index, "coalitions": factor * n}  # type: ignore[dict-item]
                rows.append(r)
                print(
                    f"| {label} | {index} | {factor}n | {r['all']:.2f} | {r['o1']:.2f} | "
                    f"{r['o2']:.2f} | {r['sd'] / r['rmse']:.2f} | {r['own_s']:.3f} |",
                    flush=True,
                )
    total = np.mean([r["all"] for r in rows])
    print(f"mean coverage {total:.3f}; min {min(r['all'] for r in rows):.2f}")
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gp_interactions_calibration.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
