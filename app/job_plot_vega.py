"""Vega-Lite v6 specs of a finished audit's global plots (app/job_plots.py), the data
inline: summary bars, beeswarm, dependence; stacked per class for the beeswarm and dependence
plots of an audit over several classes."""

from __future__ import annotations

from typing import Any

from app.errors import InvalidInput
from app.job_plots import (
    BAR,
    HIGH,
    LOW,
    Audit,
    class_shares,
    colour_scale,
    dependence_data,
    per_class,
    ranked,
    swarm_offsets,
)
from app.plot_vega import VEGA_LITE_SCHEMA
from app.plots import NEGATIVE, POSITIVE


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
        shares = class_shares(a, index)
        rows = []
        for name, share in shares.items():
            tail = [float(class_shares(a, others)[name].sum())] if rest else []
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
