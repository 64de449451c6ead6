"""Gradient attributions on digits-cnn: UNI vs IG baselines vs re-calibrated IG vs patch Shapley.

For each method: deletion and insertion AUC (removal to black and to a blur), MuFidelity and
max-sensitivity (explainers/evaluation.py), and the time per explanation. Then our static-baseline
IG against captum's IntegratedGradients on the same inputs: largest difference and time ratio.

    .venv/bin/python bench/gradients_bench.py --n 200            # the issue's 200 test digits
    .venv/bin/python bench/gradients_bench.py --shapley-n 50 --shapley-sens-n 10  # quicker
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from explainers import gradients, shapley, uni
from explainers.evaluation import EvaluateOptions, evaluate
from explainers.explanation import ExplainResult
from models.base import Model
from models.builtin import dataset_split, load_digits_cnn

IG = gradients.IntegratedGradientsOptions
Run = Callable[[Model, np.ndarray, int | None], ExplainResult]


def ig(**kw: Any) -> Run:
    options = IG(**kw)
    return lambda m, x, t: gradients.explain(m, x, options=options, target=t)


def uni_run(**kw: Any) -> Run:
    options = uni.UniOptions(**kw)
    return lambda m, x, t: uni.explain(m, x, options=options, target=t)


def patch_shapley(m: Model, x: np.ndarray, t: int | None) -> ExplainResult:
    options = shapley.ShapleyOptions(estimator="exact", patch_size=2)
    return shapley.explain(m, x, options=options, target=t, budget=1 << 16)


METHODS: dict[str, Run] = {
    "IG black (zero)": ig(baseline="zero"),
    "IG blur": ig(baseline="blur"),
    "IG mean": ig(baseline="mean"),
    "IG uniform noise (10)": ig(baseline="uniform"),
    "re-calibrated IG (valid_ip, uniform 10x5)": ig(estimator="valid_ip", baseline="uniform"),
    "UNI (eps 8/255)": uni_run(),
    "UNI (eps 0.1)": uni_run(epsilon=0.1),
    "exact patch Shapley (2x2, black)": patch_shapley,
}


def run_method(
    name: str, run: Run, model: Model, x: np.ndarray, sens_n: int, n_perturbations: int
) -> dict[str, Any]:
    results, seconds = [], []
    for row in x:
        start = time.perf_counter()
        results.append(run(model, row[None], None).explanations[0])
        seconds.append(time.perf_counter() - start)
    patch = 2 if "Shapley" in name else None
    row: dict[str, Any] = {"method": name, "ms_per_explanation": 1000 * float(np.mean(seconds))}
    for removal in ("zero", "blur"):
        opts = EvaluateOptions(metrics=["deletion", "insertion", "mufidelity"], removal=removal)
        figures, _ = evaluate(model, x, results, opts, patch_size=patch)
        for key in ("deletion_auc", "insertion_auc", "mufidelity"):
            vals = [f[key] for f in figures if f[key] is not None]
            row[f"{key}_{removal}"] = float(np.mean(vals))

    def rerun(xs: np.ndarray, out: int) -> np.ndarray:
        return np.stack([run(model, xi[None], out).explanations[0].values for xi in xs])

    sens = EvaluateOptions(metrics=["sensitivity"], n_perturbations=n_perturbations)
    figures, _ = evaluate(model, x[:sens_n], results[:sens_n], sens, patch_size=patch, rerun=rerun)
    row["sensitivity_max"] = float(np.mean([f["sensitivity"]["max"] for f in figures]))
    row["completeness_gap"] = float(
        np.mean([abs(e.values.sum() + e.base_value - e.instance_output_value) for e in results])
    )
    return row


def versus_captum(model: Model, x: np.ndarray, steps: int, method: str) -> dict[str, Any]:
    from captum.attr import IntegratedGradients

    captum_ig = IntegratedGradients(model.module)
    out: dict[str, Any] = {"steps": steps, "method": method}
    for baseline, value in (("zero", 0.0), ("mean", None)):
        options = IG(baseline=baseline, steps=steps, method=method)  # type: ignore[arg-type]
        ours, theirs, t_ours, t_theirs = [], [], 0.0, 0.0
        ref = (
            torch.tensor(model.background.mean(axis=0, keepdims=True))  # type: ignore[union-attr]
            if value is None
            else value
        )
        for row in x:
            start = time.perf_counter()
            e = gradients.explain(model, row[None], options=options).explanations[0]
            t_ours += time.perf_counter() - start
            start = time.perf_counter()
            a = captum_ig.attribute(
                torch.tensor(row[None]),
                baselines=ref,
                target=e.output_index,
                n_steps=steps,
                method=method,
            )
            t_theirs += time.perf_counter() - start
            ours.append(e.values)
            theirs.append(a.reshape(-1).numpy())
        out[baseline] = {
            "max_abs_diff": float(np.abs(np.array(ours) - np.array(theirs)).max()),
            "ours_ms": 1000 * t_ours / len(x),
            "captum_ms": 1000 * t_theirs / len(x),
            "ratio_ours_over_captum": t_ours / t_theirs,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="test digits")
    parser.add_argument("--sens-n", type=int, default=50, help="digits for sensitivity")
    parser.add_argument("--shapley-n", type=int, default=200, help="digits for patch Shapley")
    parser.add_argument("--shapley-sens-n", type=int, default=50)
    parser.add_argument("--perturbations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated method name prefixes")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_digits_cnn(Settings().model_dir)
    x = dataset_split("digits-cnn").x_test[: args.n]
    rows = []
    for name, run in METHODS.items():
        if args.only and not any(name.startswith(p) for p in args.only.split(",")):
            continue
        n, sens_n = args.n, args.sens_n
        if "Shapley" in name:
            n, sens_n = min(n, args.shapley_n), args.shapley_sens_n
        row = run_method(name, run, model, x[:n], min(sens_n, n), args.perturbations)
        row["n"] = n
        rows.append(row)
        print(json.dumps(row), flush=True)
    cap = versus_captum(model, x, 50, "gausslegendre")
    print(json.dumps(cap), flush=True)
    print(
        f"\n{args.n} digits-cnn test images ({args.shapley_n} for patch Shapley); sensitivity on "
        f"the first {args.sens_n} ({args.shapley_sens_n}), {args.perturbations} perturbations "
        f"of radius 0.02; torch threads {args.threads}\n"
    )
    print("| method | deletion AUC black (lower better) | insertion AUC black | deletion AUC blur "
          "| insertion AUC blur | MuFidelity black | MuFidelity blur | max-sensitivity "
          "| completeness gap | ms / explanation |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['deletion_auc_zero']:.4f} | {r['insertion_auc_zero']:.4f} "
            f"| {r['deletion_auc_blur']:.4f} | {r['insertion_auc_blur']:.4f} "
            f"| {r['mufidelity_zero']:.3f} | {r['mufidelity_blur']:.3f} "
            f"| {r['sensitivity_max']:.3f} | {r['completeness_gap']:.4f} "
            f"| {r['ms_per_explanation']:.1f} |"
        )
    print(
        "\n| IG vs captum (50 steps, gausslegendre) | max abs diff | ours ms | captum ms | ratio |"
    )
    print("|---|---|---|---|---|")
    for baseline in ("zero", "mean"):
        c = cap[baseline]
        print(
            f"| baseline {baseline} | {c['max_abs_diff']:.2e} | {c['ours_ms']:.2f} "
            f"| {c['captum_ms']:.2f} | {c['ratio_ours_over_captum']:.2f} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"rows": rows, "captum": cap, "args": vars(args)}, default=str)
        )


if __name__ == "__main__":
    main()
