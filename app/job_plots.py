"""Global plots of a finished audit, built from its stored results, after shap's conventions.

summary: mean |value| per feature (stacked by explained class when there are several);
beeswarm: one dot per instance per feature at its value, coloured by the feature's value
(blue low, red high, 5th-95th percentile per feature); dependence: a feature's value against its
attribution, coloured by the feature that interacts with it most (shap's approximate_interactions)
or by the attribution's sign. Here the audit's rows as arrays (Audit) and what both renderers
compute from them; PNG/SVG in app/job_plot_images.py (matplotlib), Vega-Lite v6 in
app/job_plot_vega.py.
An audit that explained several classes (`target` a list or "all") gets one beeswarm and one
dependence panel per class, as shap's plots take one output at a time (a beeswarm of several
classes on one axis mixes attributions of different outputs); the summary stacks the classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.errors import InvalidInput
from app.jobs.results import AuditResult, flat

GlobalKind = Literal["summary", "beeswarm", "dependence"]
LOW, HIGH = "#008bfb", "#ff0052"  # shap's feature-value colours
BAR = "#008bfb"
ROW_HEIGHT = 0.4  # beeswarm: half the space between rows, as shap


@dataclass(frozen=True)
class Audit:
    """The successful explanations of an audit that share the first one's players."""

    names: list[str]
    values: np.ndarray  # [m, n]
    data: np.ndarray | None  # [m, n] feature values; None when the players are no columns
    classes: list[str]  # [m] the output each instance explains
    title: str


def audit(results: list[AuditResult], title: str) -> Audit:
    """The successful explanations that share the first one's players; with several targets
    each instance's explanations are points of their class (shap's multi-output summary)."""
    ok = [(r.feature_names, r.explanation) for r in flat(results) if r.explanation is not None]
    if not ok:
        raise InvalidInput("the audit has no successful explanation to plot")
    names = list(ok[0][0] or ())
    if not names:
        raise InvalidInput(
            "text audits have different players per instance: no global plot "
            "(plot each instance with /v2/plots)"
        )
    n = len(names)
    same = [e for players, e in ok if list(players or ()) == names and len(e.values) == n]
    values = np.array([e.values for e in same], dtype=float)
    if not np.all(np.isfinite(values)):
        raise InvalidInput("the audit's values are not all finite")
    data: np.ndarray | None
    try:
        data = np.array(
            [
                np.ravel(
                    np.asarray(
                        [raw[k] for k in names] if isinstance(raw, dict) else raw, dtype=float
                    )
                )
                for raw in (e.data for e in same)
            ]
        )
    except (TypeError, ValueError, KeyError):  # no data, strings, ragged instances
        data = None
    if data is not None and data.shape != values.shape:
        data = None  # image patches or tokens: a player is no single column
    classes = [e.output_name for e in same]
    return Audit(names, values, data, classes, f"{title} · {len(same)} instances")


def per_class(a: Audit) -> list[tuple[str, Audit]]:
    """The audit's instances of each explained class, classes in the order first met."""
    classes = np.array(a.classes)
    out = []
    for name in dict.fromkeys(a.classes):
        keep = classes == name
        out.append(
            (
                name,
                Audit(
                    a.names,
                    a.values[keep],
                    None if a.data is None else a.data[keep],
                    [name] * int(keep.sum()),
                    f"{a.title} · class {name}",
                ),
            )
        )
    return out


def ranked(a: Audit, max_features: int) -> tuple[list[int], int]:
    """Feature indices by mean |value|, largest first (at most max_features), and the count of
    the rest."""
    order = np.argsort(-np.abs(a.values).mean(axis=0), kind="stable")
    return order[:max_features].tolist(), max(0, len(order) - max_features)


def colour_scale(x: np.ndarray) -> np.ndarray:
    """Feature values -> [0, 1] between the 5th and 95th percentile (shap's beeswarm)."""
    lo, hi = np.nanpercentile(x, 5), np.nanpercentile(x, 95)
    if hi <= lo:
        lo, hi = np.nanmin(x), np.nanmax(x)
    if hi <= lo:
        return np.full(len(x), 0.5)
    return np.clip((x - lo) / (hi - lo), 0, 1)


def swarm_offsets(x: np.ndarray, nbins: int = 100) -> np.ndarray:
    """shap's beeswarm layout: dots in one x bin alternate above and below their row."""
    if len(x) == 0:
        return np.zeros(0)
    span = float(x.max() - x.min())
    quant = np.round(nbins * (x - x.min()) / (span + 1e-12))
    offsets, layer, last = np.zeros(len(x)), 0, None
    for i in np.argsort(quant, kind="stable"):
        layer = 0 if quant[i] != last else layer + 1
        offsets[i] = np.ceil(layer / 2) * (1 if layer % 2 else -1)
        last = quant[i]
    return offsets * (0.9 * ROW_HEIGHT / (np.abs(offsets).max() + 1))


def interaction_partner(a: Audit, f: int) -> int | None:
    """The feature whose value best explains the spread of f's attributions at similar values
    of f (shap.utils.approximate_interactions); None when no feature correlates."""
    assert a.data is not None
    order = np.argsort(a.data[:, f], kind="stable")
    ref = a.values[order, f]
    step = max(min(len(order) // 10, 50), 1)
    scores = np.zeros(len(a.names))
    for j in range(len(a.names)):
        other = a.data[order, j]
        if j == f or np.abs(other).sum() < 1e-8:
            continue
        for s in range(0, len(order), step):
            x, y = ref[s : s + step], other[s : s + step]
            if len(x) > 1 and x.std() > 0 and y.std() > 0:
                scores[j] += abs(np.corrcoef(x, y)[0, 1])
    best = int(np.argmax(scores))
    return best if scores[best] > 0 else None


def feature_index(a: Audit, feature: str | None) -> int:
    if feature is None:
        return ranked(a, 1)[0][0]
    if feature not in a.names:
        raise InvalidInput(f"unknown feature {feature!r}; the audit's features: {a.names}")
    return a.names.index(feature)


def dependence_data(
    a: Audit, feature: str | None, color: str
) -> tuple[int, np.ndarray | None, str | None]:
    """(feature, colour values or None for sign colours, colour title)."""
    if a.data is None:
        raise InvalidInput("a dependence plot needs feature values (a tabular audit)")
    f = feature_index(a, feature)
    if color == "value":
        return f, None, None
    partner = interaction_partner(a, f) if color == "auto" else feature_index(a, color)
    if partner is None:
        return f, None, None
    return f, a.data[:, partner], a.names[partner]


def class_shares(a: Audit, index: list[int]) -> dict[str, np.ndarray]:
    """Per class: sum of |value| over its instances / all instances (the stacks add up to the
    mean |value|)."""
    classes = np.array(a.classes)
    absolute = np.abs(a.values)
    return {
        c: absolute[classes == c][:, index].sum(axis=0) / len(a.values)
        for c in sorted(set(a.classes))
    }
