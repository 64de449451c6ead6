"""Gradient attributions on digits-cnn: UNI vs IG baselines vs re-calibrated IG vs patch Shapley.

For each method: deletion and insertion AUC (removal to black and to a blur), DiffID (insertion
minus deletion, the re-calibration paper's figure; |IG| is there for its comparison), MuFidelity
and max-sensitivity (explainers/trust/evaluation.py), robustness under a small FGSM perturbation
that keeps the label (UNI's check: Spearman correlation and top-k overlap of the attributions before
and after), and the time per explanation. Then our static-baseline IG against captum's
IntegratedGradients on the same inputs: largest difference and time ratio.

    .venv/bin/python bench/gradients_bench.py --n 200            # the issue's 200 test digits
    .venv/bin/python bench/gradients_bench.py --shapley-n 50 --shapley-sens-n 10  # quicker
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings
from explainers.explanation import ExplainResult
from explainers.gradients import integrated as gradients
from explainers.gradients import uni
from explainers.shapley import explainer as shapley
from explainers.trust.evaluation import EvaluateOptions, evaluate
from models.base import Model
from models.builtin.trained import dataset_split, load_digits_cnn

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


def absolute(run: Run) -> Run:
    """|attributions|: how the re-calibration paper scores plain IG."""

    def wrapped(m: Model, x: np.ndarray, t: int | None) -> ExplainResult:
        res = run(m, x, t)
        return replace(
            res, explanations=tuple(replace(e, values=np.abs(e.values)) for e in res.explanations)
        )

    return wrapped


METHODS: dict[str, Run] = {
    "IG black (zero)": ig(baseline="zero"),
    "IG blur": ig(baseline="blur"),
    "IG mean": ig(baseline="mean"),
    "IG uniform noise (10)": ig(baseline="uniform"),
    "|IG| uniform noise (10)": absolute(ig(baseline="uniform")),
    "re-calibrated IG (valid_ip, uniform 10x5)": ig(estimator="valid_ip", baseline="uniform"),
    "re-calibrated IG (valid_ref, uniform 10x5)": ig(estimator="valid_ref", baseline="uniform"),
    "UNI (defaults)": uni_run(),
    "UNI (old defaults: linf 8/255, one normalized step 0.01, T 10)": uni_run(
        norm="linf",
        epsilon=8 / 255,
        unlearning_rule="normalized",
        unlearning_lr=0.01,
        unlearning_target=None,
        pgd_steps=10,
    ),
    "exact patch Shapley (2x2, black)": patch_shapley,
}


def fgsm(model: Model, x: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """x + radius * sign(grad of the predicted class's cross-entropy), clipped to [0, 1]:
    (perturbed inputs [m, *shape], which kept their label [m])."""
    xt = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    with torch.enable_grad():
        probs = model.torch_module()(xt)
        label = probs.argmax(dim=1)
        loss = -torch.log(probs.gather(1, label[:, None]).clamp_min(1e-30)).sum()
        (grad,) = torch.autograd.grad(loss, xt)
    moved = (xt + radius * grad.sign()).clamp(0.0, 1.0).detach()
    with torch.no_grad():
        kept = (model.torch_module()(moved).argmax(dim=1) == label).numpy()
    return moved.numpy(), kept


def robustness(
    run: Run, model: Model, x: np.ndarray, before: list[np.ndarray], radius: float, top_k: int
) -> dict[str, float]:
    """Spearman correlation and top-k overlap of attributions at x and at its FGSM twin."""
    from scipy.stats import spearmanr

    moved, kept = fgsm(model, x, radius)
    rho, overlap = [], []
    for i in np.flatnonzero(kept):
        out = int(np.argmax(model.predict(x[i : i + 1])[0]))
        after = run(model, moved[i : i + 1], out).explanations[0].values
        a, b = before[i], after
        rho.append(float(spearmanr(a, b).statistic) if np.ptp(a) and np.ptp(b) else 0.0)
        k = min(top_k, a.size)
        top_a, top_b = set(np.argsort(-a)[:k]), set(np.argsort(-b)[:k])
        overlap.append(len(top_a & top_b) / k)
    return {
        "fgsm_spearman": float(np.mean(rho)),
        "fgsm_topk": float(np.mean(overlap)),
        "fgsm_kept": float(np.mean(kept)),
    }


def run_method(
    name: str,
    run: Run,
    model: Model,
    x: np.ndarray,
    sens_n: int,
    n_perturbations: int,
    fgsm_radius: float = 0.02,
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
        row[f"diffid_{removal}"] = row[f"insertion_auc_{removal}"] - row[f"deletion_auc_{removal}"]

    def rerun(xs: np.ndarray, out: int) -> np.ndarray:
        return np.stack([run(model, xi[None], out).explanations[0].values for xi in xs])

    sens = EvaluateOptions(metrics=["sensitivity"], n_perturbations=n_perturbations)
    figures, _ = evaluate(model, x[:sens_n], results[:sens_n], sens, patch_size=patch, rerun=rerun)
    row["sensitivity_max"] = float(np.mean([f["sensitivity"]["max"] for f in figures]))
    top_k = 4 if patch else 8  # an eighth of the players (16 patches or 64 pixels)
    values = [e.values for e in results[:sens_n]]
    row.update(robustness(run, model, x[:sens_n], values, fgsm_radius, top_k))
    row["baseline_share"] = float(  # f(baseline) / f(x): how much of the output is left
        np.median([e.base_value / e.instance_output_value for e in results])
    )
    row["completeness_gap"] = float(
        np.mean([abs(e.values.sum() + e.base_value - e.instance_output_value) for e in results])
    )
    return row


def versus_captum(model: Model, x: np.ndarray, steps: int, method: str) -> dict[str, Any]:
    from captum.attr import IntegratedGradients

    captum_ig = IntegratedGradients(model.torch_module())
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


def uni_confident(model: Model, n: int) -> dict[str, Any]:
    """UNI with its defaults on the first n test digits predicted with probability > 0.99:
    what the baseline keeps of f(x), what the attributions explain, and the warnings."""
    x = dataset_split("digits-cnn").x_test
    x = x[model.predict(x).max(axis=1) > 0.99][:n]
    res = uni.explain(model, x, options=uni.UniOptions())
    kept = [e.base_value / e.instance_output_value for e in res.explanations]
    explained = [e.values.sum() / e.instance_output_value for e in res.explanations]
    codes = [w.code for e in res.explanations for w in e.warnings]
    baselines = np.array([e.details["baseline"] for e in res.explanations])  # type: ignore[index]
    return {
        "n": len(x),
        "median_baseline_share": float(np.median(kept)),
        "max_baseline_share": float(np.max(kept)),
        "median_explained_share": float(np.median(explained)),
        "warnings": {c: codes.count(c) for c in sorted(set(codes))},
        "baseline_range": [float(baselines.min()), float(baselines.max())],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="test digits")
    parser.add_argument("--sens-n", type=int, default=50, help="digits for sensitivity")
    parser.add_argument("--shapley-n", type=int, default=200, help="digits for patch Shapley")
    parser.add_argument("--shapley-sens-n", type=int, default=50)
    parser.add_argument("--perturbations", type=int, default=3)
    parser.add_argument("--fgsm-radius", type=float, default=0.02, help="FGSM step (pixels)")
    parser.add_argument("--no-captum", action="store_true", help="skip the captum comparison")
    parser.add_argument("--uni-confident", type=int, default=100, help="confident digits (0: skip)")
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
        row = run_method(
            name, run, model, x[:n], min(sens_n, n), args.perturbations, args.fgsm_radius
        )
        row["n"] = n
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.uni_confident:
        print(json.dumps({"uni_defaults_on_confident": uni_confident(model, args.uni_confident)}))
    cap = None if args.no_captum else versus_captum(model, x, 50, "gausslegendre")
    print(json.dumps(cap), flush=True)
    print(
        f"\n{args.n} digits-cnn test images ({args.shapley_n} for patch Shapley); sensitivity and "
        f"FGSM (step {args.fgsm_radius}) on the first {args.sens_n} ({args.shapley_sens_n}), "
        f"{args.perturbations} perturbations of radius 0.02; torch threads {args.threads}\n"
    )
    print("| method | deletion AUC black (lower better) | insertion AUC black | DiffID black "
          "| deletion AUC blur | insertion AUC blur | DiffID blur | MuFidelity black "
          "| MuFidelity blur | max-sensitivity | FGSM Spearman | FGSM top-8 "
          "| f(baseline) / f(x) | completeness gap | ms / explanation |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['deletion_auc_zero']:.4f} | {r['insertion_auc_zero']:.4f} "
            f"| {r['diffid_zero']:.3f} | {r['deletion_auc_blur']:.4f} "
            f"| {r['insertion_auc_blur']:.4f} | {r['diffid_blur']:.3f} "
            f"| {r['mufidelity_zero']:.3f} | {r['mufidelity_blur']:.3f} "
            f"| {r['sensitivity_max']:.3f} | {r['fgsm_spearman']:.3f} | {r['fgsm_topk']:.3f} "
            f"| {r['baseline_share']:.3f} | {r['completeness_gap']:.4f} "
            f"| {r['ms_per_explanation']:.1f} |"
        )
    for baseline in ("zero", "mean") if cap else ():
        if baseline == "zero":
            print("\n| IG vs captum (50 steps, gausslegendre) | max abs diff | ours ms "
                  "| captum ms | ratio |\n|---|---|---|---|---|")  # fmt: skip
        c = cap[baseline]  # type: ignore[index]
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
