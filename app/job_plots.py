"""Global plots of a finished audit, built from its stored results, after shap's conventions.

summary: mean |value| per feature (stacked by explained class when there are several);
beeswarm: one dot per instance per feature at its value, coloured by the feature's value
(blue low, red high, 5th-95th percentile per feature); dependence: a feature's value against its
attribution, coloured by the feature that interacts with it most (shap's approximate_interactions)
or by the attribution's sign. PNG/SVG (matplotlib) or Vega-Lite v6.
An audit that explained several classes (`target` a list or "all") gets one beeswarm and one
dependence panel per class, as shap's plots take one output at a time (a beeswarm of several
classes on one axis mixes attributions of different outputs); the summary stacks the classes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.errors import InvalidInput
from app.jobs.results import AuditResult, flat
from app.plots import NEGATIVE, POSITIVE, VEGA_LITE_SCHEMA

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


def _class_shares(a: Audit, index: list[int]) -> dict[str, np.ndarray]:
    """Per class: sum of |value| over its instances / all instances (the stacks add up to the
    mean |value|)."""
    classes = np.array(a.classes)
    absolute = np.abs(a.values)
    return {
        c: absolute[classes == c][:, index].sum(axis=0) / len(a.values)
        for c in sorted(set(a.classes))
    }


# ----------------------------------------------------------------------------- matplotlib


def _size(a: Audit, kind: str, max_features: int) -> tuple[float, float]:
    """A panel's (width, height) in inches."""
    if kind == "dependence":
        return 6.5, 4.6
    index, rest = ranked(a, max_features)
    n = len(index) + bool(rest)
    return 7.5, 0.32 * n + 1.3 if kind == "summary" else 0.42 * n + 1.4


def figure(a: Audit, kind: str, feature: str | None, color: str, max_features: int) -> Any:
    from matplotlib.figure import Figure

    classes = per_class(a)
    if kind not in ("beeswarm", "dependence") or len(classes) == 1:
        fig = Figure(figsize=_size(a, kind, max_features))
        _draw(fig, a, kind, feature, color, max_features)
        return fig
    if kind == "dependence":  # one feature for every class: the audit's top by default
        feature = a.names[dependence_data(a, feature, color)[0]]
    sizes = [_size(sub, kind, max_features) for _, sub in classes]
    fig = Figure(figsize=(max(w for w, _ in sizes), sum(h for _, h in sizes)))
    ratios = [h for _, h in sizes]
    panels: Any = fig.subfigures(len(classes), 1, squeeze=False, height_ratios=ratios)[:, 0]
    for panel, (_, sub), (_, h) in zip(panels, classes, sizes, strict=True):
        _draw(panel, sub, kind, feature, color, max_features, h)
    return fig


def _draw(
    fig: Any,
    a: Audit,
    kind: str,
    feature: str | None,
    color: str,
    max_features: int,
    height: float | None = None,
) -> None:
    """Draw one panel of `kind` on a figure or subfigure (`height`: its inches)."""
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("shap", [LOW, HIGH])
    if kind == "dependence":
        f, colours, partner = dependence_data(a, feature, color)
        assert a.data is not None
        ax = fig.add_subplot()
        x, y = a.data[:, f], a.values[:, f]
        if colours is None:
            ax.scatter(x, y, s=16, c=[POSITIVE if v >= 0 else NEGATIVE for v in y])
        else:
            dots = ax.scatter(x, y, s=16, c=colour_scale(colours), cmap=cmap, vmin=0, vmax=1)
            bar = fig.colorbar(dots, ax=ax, ticks=[0, 1], aspect=40)
            bar.set_ticklabels(["low", "high"])
            bar.set_label(str(partner))
            bar.outline.set_visible(False)
        ax.axhline(0, color="#999", linewidth=0.8)
        ax.set_xlabel(a.names[f])
        ax.set_ylabel(f"attribution of {a.names[f]}")
        fig.subplots_adjust(left=0.14, right=0.97, bottom=0.12, top=0.9)
        fig.suptitle(f"{a.title} · dependence on {a.names[f]}", fontsize=10)
        return
    index, rest = ranked(a, max_features)
    labels = [a.names[i] for i in index] + ([f"Sum of {rest} other features"] if rest else [])
    height = height or _size(a, kind, max_features)[1]
    ax = fig.add_subplot()
    rows = np.arange(len(labels))[::-1]  # the largest on top
    if kind == "summary":
        others = [i for i in range(len(a.names)) if i not in index]
        shares = _class_shares(a, index)
        left = np.zeros(len(labels))
        palette = ["#008bfb", "#ff0052", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e"]
        for k, (name, share) in enumerate(shares.items()):
            if rest:
                rest_share = _class_shares(a, others)[name].sum()
                share = np.append(share, rest_share)
            colour = BAR if len(shares) == 1 else palette[k % len(palette)]
            ax.barh(rows, share, left=left, color=colour, label=name, height=0.7)
            left += share
        for r, total in zip(rows, left, strict=True):
            ax.text(total, r, f" {total:.3g}", va="center", fontsize=8)
        if len(shares) > 1:
            ax.legend(frameon=False, fontsize=8, loc="center right", title="explained output")
        ax.set_xlabel("mean |attribution| (average impact on the output)")
        ax.margins(x=0.12)
    elif kind == "beeswarm":
        for r, i in zip(rows, index, strict=False):
            x = a.values[:, i]
            y = r + swarm_offsets(x)
            if a.data is None:
                ax.scatter(x, y, s=12, color="#777", linewidth=0)
            else:
                ax.scatter(x, y, s=12, c=colour_scale(a.data[:, i]), cmap=cmap, vmin=0, vmax=1,
                           linewidth=0)  # fmt: skip
        if rest:
            others = [i for i in range(len(a.names)) if i not in index]
            x = a.values[:, others].sum(axis=1)
            ax.scatter(x, rows[-1] + swarm_offsets(x), s=12, color="#777", linewidth=0)
        ax.axvline(0, color="#999", linewidth=0.8)
        ax.set_xlabel("attribution (impact on the output)")
        if a.data is not None:
            from matplotlib.cm import ScalarMappable

            bar = fig.colorbar(ScalarMappable(cmap=cmap), ax=ax, ticks=[0, 1], aspect=50)
            bar.set_ticklabels(["low", "high"])
            bar.set_label("feature value")
            bar.outline.set_visible(False)
    else:
        raise InvalidInput(f"unknown plot kind {kind!r}")
    ax.set_yticks(rows, labels)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    label_in = 0.08 * max(len(x) for x in labels) + 0.3
    fig.subplots_adjust(left=min(0.5, label_in / 7.5), right=0.95 if kind == "summary" else 1,
                        top=1 - 0.45 / height, bottom=0.55 / height)  # fmt: skip
    fig.suptitle(f"{a.title} · {kind}", fontsize=10)


def image_bytes(
    a: Audit, fmt: str, kind: str, feature: str | None, color: str, max_features: int
) -> bytes:
    fig = figure(a, kind, feature, color, max_features)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100, metadata={"Date": None} if fmt == "svg" else None)
    return buf.getvalue()


# ----------------------------------------------------------------------------- Vega-Lite


def vega_lite(
    a: Audit, kind: str, feature: str | None, color: str, max_features: int
) -> dict[str, Any]:
    spec: dict[str, Any] = {"$schema": VEGA_LITE_SCHEMA}
    classes = per_class(a)
    if kind in ("beeswarm", "dependence") and len(classes) > 1:  # a plot per class, stacked
        if kind == "dependence":
            feature = a.names[dependence_data(a, feature, color)[0]]
        parts = []
        for _, sub in classes:
            part = vega_lite(sub, kind, feature, color, max_features)
            part.pop("$schema")
            parts.append(part)
        spec.update(title=f"{a.title} · {kind} per class", vconcat=parts)
        return spec
    feature_value = {"type": "quantitative", "scale": {"domain": [0, 1], "range": [LOW, HIGH]}}
    if kind == "dependence":
        f, colours, partner = dependence_data(a, feature, color)
        assert a.data is not None
        scaled = None if colours is None else colour_scale(colours)
        rows: list[dict[str, Any]] = [
            {
                "x": float(a.data[i, f]),
                "value": float(a.values[i, f]),
                "sign": "+" if a.values[i, f] >= 0 else "-",
                **({} if scaled is None else {"colour": float(scaled[i])}),
                **({} if colours is None else {"partner": float(colours[i])}),
            }
            for i in range(len(a.values))
        ]
        colour = (
            {"field": "sign", "type": "nominal", "legend": None,
             "scale": {"domain": ["+", "-"], "range": [POSITIVE, NEGATIVE]}}
            if colours is None
            else {"field": "colour", **feature_value, "title": f"{partner} (low → high)"}
        )  # fmt: skip
        tooltip = [{"field": "x", "title": a.names[f]}, {"field": "value", "title": "attribution"}]
        if partner is not None:
            tooltip.append({"field": "partner", "title": partner})
        spec.update(
            title=f"{a.title} · dependence on {a.names[f]}",
            data={"values": rows},
            mark={"type": "circle", "size": 30},
            encoding={
                "x": {"field": "x", "type": "quantitative", "title": a.names[f]},
                "y": {"field": "value", "type": "quantitative",
                      "title": f"attribution of {a.names[f]}"},
                "color": colour,
                "tooltip": tooltip,
            },
        )  # fmt: skip
        return spec
    index, rest = ranked(a, max_features)
    labels = [a.names[i] for i in index] + ([f"Sum of {rest} other features"] if rest else [])
    others = [i for i in range(len(a.names)) if i not in index]
    y = {"field": "feature", "type": "nominal", "sort": {"field": "rank"}, "title": None}
    if kind == "summary":
        shares = _class_shares(a, index)
        rows = []
        for name, share in shares.items():
            tail = [float(_class_shares(a, others)[name].sum())] if rest else []
            for rank, (label, s) in enumerate(zip(labels, [*share.tolist(), *tail], strict=True)):
                rows.append({"feature": label, "class": name, "value": s, "rank": rank})
        stack: dict[str, Any] = (
            {"value": BAR} if len(shares) == 1 else {"field": "class", "type": "nominal"}
        )
        spec.update(
            title=f"{a.title} · summary",
            data={"values": rows},
            mark="bar",
            encoding={
                "y": y,
                "x": {"field": "value", "type": "quantitative", "aggregate": "sum",
                      "title": "mean |attribution| (average impact on the output)"},
                "color": stack,
                "tooltip": [{"field": "feature"}, {"field": "class"},
                            {"field": "value", "type": "quantitative"}],
            },
        )  # fmt: skip
        return spec
    if kind != "beeswarm":
        raise InvalidInput(f"unknown plot kind {kind!r}")
    rows = []
    for rank, i in enumerate(index):
        x = a.values[:, i]
        scaled = None if a.data is None else colour_scale(a.data[:, i])
        for k, (v, off) in enumerate(zip(x, swarm_offsets(x), strict=True)):
            row = {"feature": a.names[i], "rank": rank, "value": float(v), "offset": float(off)}
            if a.data is not None and scaled is not None:
                row.update(feature_value=float(a.data[k, i]), colour=float(scaled[k]))
            rows.append(row)
    if rest:
        x = a.values[:, others].sum(axis=1)
        for v, off in zip(x, swarm_offsets(x), strict=True):
            rows.append({"feature": labels[-1], "rank": len(index), "value": float(v),
                         "offset": float(off)})  # fmt: skip
    position = {
        "y": y,
        "yOffset": {"field": "offset", "type": "quantitative",
                    "scale": {"domain": [-0.5, 0.5]}},
        "x": {"field": "value", "type": "quantitative", "title": "attribution"},
    }  # fmt: skip
    tooltip = [{"field": "feature"}, {"field": "value", "type": "quantitative"},
               {"field": "feature_value", "type": "quantitative"}]  # fmt: skip
    spec.update(
        title=f"{a.title} · beeswarm",
        data={"values": rows},
        height={"step": 32},
        layer=[
            {
                "transform": [{"filter": "isValid(datum.colour)"}],
                "mark": {"type": "circle", "size": 18, "opacity": 0.9},
                "encoding": {**position, "tooltip": tooltip,
                             "color": {"field": "colour", **feature_value,
                                       "title": "feature value (low → high)"}},
            },
            {
                "transform": [{"filter": "!isValid(datum.colour)"}],
                "mark": {"type": "circle", "size": 18, "color": "#777"},
                "encoding": {**position, "tooltip": tooltip[:2]},
            },
        ],
    )  # fmt: skip
    return spec
