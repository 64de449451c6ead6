"""Audit of a user-supplied background: is it a cherry-picked sample of the data it stands for?

Laberge, Aïvodji & Hara (ICLR 2023), "Fool SHAP with Stealthily Biased Sampling": compare model
outputs on the supplied background S with outputs on reference data D. Per output: two
two-sample KS tests against fresh uniform subsamples of D of size |S|, and a Wald test on the
mean, W = sqrt(|S|) (mean f(S) - mean f(D)) / std f(D). The paper's code rejects at fixed
shares of alpha (KS at alpha/8, Wald at alpha/4), a split sized for one output; we correct for
the tests actually run instead: Holm's step-down procedure over every test of every audited
output (3 per output), which bounds the chance of flagging an honest background by alpha
whatever the dependence between the tests [ours]. `suspicious` is true when any test is
rejected, i.e. when the smallest p-value is below alpha / (number of tests).
D is the model's training split unless the caller supplies its own reference rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from explainers.explanation import OptionError
from models.base import Model
from models.modality import Modality

KS_REPEATS = 2
TESTS_PER_OUTPUT = KS_REPEATS + 1
CORRECTION = "holm"
MAX_REFERENCE_ROWS = 10_000


def holm(pvalues: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Holm (1979) step-down over a family: (rejected [m], adjusted p-values [m])."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    steps = (m - np.arange(m)) * p[order]  # (m - i) p_(i), i from 0
    adjusted_sorted = np.minimum(np.maximum.accumulate(steps), 1.0)
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted <= alpha, adjusted


def _raw_tests(
    background: np.ndarray, reference: np.ndarray, rng: np.random.Generator
) -> tuple[list[float], float, float]:
    """KS p-values against fresh subsamples, the Wald statistic and its p-value (one output)."""
    m = background.shape[0]
    ks_p = [
        float(
            stats.ks_2samp(background, rng.choice(reference, m, replace=m > len(reference))).pvalue
        )
        for _ in range(KS_REPEATS)
    ]
    spread = float(reference.std(ddof=1)) if len(reference) > 1 else 0.0
    wald = np.sqrt(m) * (background.mean() - reference.mean()) / spread if spread > 0 else 0.0
    return ks_p, float(wald), float(2 * stats.norm.sf(abs(wald)))


def audit_outputs(
    background: np.ndarray,
    reference: np.ndarray,
    rng: np.random.Generator,
    alpha: float = 0.05,
    output_indices: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Tests on model outputs, background [M] or [M, K] against reference [R] or [R, K], with
    Holm's correction over all 3K tests. `output_indices` name the K columns (default 0..K-1)."""
    bg = np.asarray(background, dtype=np.float64).reshape(len(background), -1)
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    k = bg.shape[1]
    names = list(range(k)) if output_indices is None else [int(i) for i in output_indices]
    raw = [_raw_tests(bg[:, j], ref[:, j], rng) for j in range(k)]
    pvalues = np.array([p for ks_p, _, wald_p in raw for p in (*ks_p, wald_p)])
    rejected, adjusted = holm(pvalues, alpha)
    outputs = []
    for j, (ks_p, wald, wald_p) in enumerate(raw):
        at = slice(j * TESTS_PER_OUTPUT, (j + 1) * TESTS_PER_OUTPUT)
        rej, adj = rejected[at], adjusted[at]
        outputs.append(
            {
                "output_index": names[j],
                "background_rows": int(bg.shape[0]),
                "reference_rows": int(ref.shape[0]),
                "ks_pvalues": ks_p,
                "ks_adjusted_pvalues": adj[:KS_REPEATS].tolist(),
                "ks_reject": bool(rej[:KS_REPEATS].any()),
                "wald_statistic": wald,
                "wald_pvalue": wald_p,
                "wald_adjusted_pvalue": float(adj[KS_REPEATS]),
                "wald_reject": bool(rej[KS_REPEATS]),
                "suspicious": bool(rej.any()),
            }
        )
    return {
        "alpha": alpha,
        "correction": CORRECTION,
        "tests": int(pvalues.size),
        "suspicious": bool(rejected.any()),
        "outputs": outputs,
    }


def reference_rows(model: Model, rows: Sequence[Any]) -> np.ndarray:
    """A caller's reference rows (lists of numbers, or {feature: value} for tabular models)
    -> [R, *input_shape] in the model's input dtype; an OptionError (400) otherwise."""
    where = "parameters.audit_reference"
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, dict):
            if model.modality != Modality.TABULAR or set(row) != set(model.feature_names):
                raise OptionError(
                    f"{where}[{i}]: a row as an object needs exactly the features "
                    f"{list(model.feature_names)}"
                )
            row = [row[name] for name in model.feature_names]
        try:
            values = np.asarray(row, dtype=object).reshape(-1)
        except ValueError as exc:  # ragged nesting
            raise OptionError(f"{where}[{i}]: expected a row of the input's shape") from exc
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.tolist()
        ):
            raise OptionError(f"{where}[{i}]: expected numbers only")
        array = values.astype(np.float64)
        if array.size != int(np.prod(model.input_shape)):
            raise OptionError(
                f"{where}[{i}]: expected {int(np.prod(model.input_shape))} values "
                f"(input shape {list(model.input_shape)}), got {array.size}"
            )
        if not np.all(np.isfinite(array)):
            raise OptionError(f"{where}[{i}]: values must be finite")
        out.append(array.reshape(model.input_shape))
    return np.stack(out).astype(model.input_dtype)
