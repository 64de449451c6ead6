"""Audit of a user-supplied background: is it a cherry-picked sample of the model's data?

Laberge, Aïvodji & Hara (ICLR 2023), "Fool SHAP with Stealthily Biased Sampling": compare model
outputs on the supplied background S with outputs on reference data D. Two two-sample KS tests
against fresh uniform subsamples of D of size |S| (reject when p < alpha/8) and a Wald test on
the mean, W = sqrt(|S|) (mean f(S) - mean f(D)) / std f(D) (reject when p < alpha/4).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

KS_REPEATS = 2


def audit_outputs(
    background: np.ndarray, reference: np.ndarray, rng: np.random.Generator, alpha: float = 0.05
) -> dict[str, Any]:
    """Tests on model outputs: background [M] against reference [R] (one output column)."""
    m = background.shape[0]
    ks_p = [
        float(
            stats.ks_2samp(background, rng.choice(reference, m, replace=m > len(reference))).pvalue
        )
        for _ in range(KS_REPEATS)
    ]
    spread = float(reference.std(ddof=1))
    wald = np.sqrt(m) * (background.mean() - reference.mean()) / spread if spread > 0 else 0.0
    wald_p = float(2 * stats.norm.sf(abs(wald)))
    ks_reject = min(ks_p) < alpha / 8
    wald_reject = wald_p < alpha / 4
    return {
        "alpha": alpha,
        "background_rows": m,
        "reference_rows": int(reference.shape[0]),
        "ks_pvalues": ks_p,
        "ks_reject": ks_reject,
        "wald_statistic": float(wald),
        "wald_pvalue": wald_p,
        "wald_reject": wald_reject,
        "suspicious": ks_reject or wald_reject,
    }
