"""Vega-Lite v6 specs of one explanation of a response (app/plots.py's View), the data
inline: bars, waterfalls, interaction matrices, text and image heatmaps."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.errors import InvalidInput
from app.plots import (
    NEGATIVE,
    POSITIVE,
    Classes,
    Range,
    View,
    auto_kind,
    colour_of,
    image_maps,
    image_of,
    interaction_matrix,
    labels,
    num,
    segment_edges,
    segment_labels,
    title,
    top,
    top_classes_text,
    view,
    waterfall_steps,
)
from app.schemas import ExplainResponse

VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"


def vega_lite(
    body: ExplainResponse,
    kind: str,
    index: int,
    max_features: int,
    classes: Classes = None,
    channels: str = "sum",
    value_range: Range = None,
) -> dict[str, Any]:
    """A Vega-Lite v6 specification with the data inline; `classes`: the top class
    probabilities of an image, shown under the original; `channels` and `value_range` as for
    image_maps and colour_of."""
    v = view(body, index)
    kind = auto_kind(v) if kind == "auto" else kind
    if kind == "heatmap":
        return {"$schema": VEGA_LITE_SCHEMA, "title": title(v),
                **_vega_heatmap(v, classes, channels, value_range)}  # fmt: skip
    sign = {
        "field": "sign",
        "type": "nominal",
        "scale": {"domain": ["+", "-"], "range": [POSITIVE, NEGATIVE]},
        "legend": None,
    }
    spec: dict[str, Any] = {"$schema": VEGA_LITE_SCHEMA, "title": title(v)}
    tooltip = [{"field": "label", "title": "player"}, {"field": "value", "type": "quantitative"}]
    if kind in ("bar", "waterfall"):
        if kind == "bar":
            names, values = top(v, max_features)
            rows = [
                {"player": n, "label": lab, "value": float(x), "sign": "+" if x >= 0 else "-",
                 "rank": i, "text": f"{'+' if x >= 0 else ''}{num(float(x))}", "at": float(x)}
                for i, (n, lab, x) in enumerate(zip(names, labels(v, names), values, strict=True))
            ]  # fmt: skip
            x: dict[str, Any] = {"field": "value", "type": "quantitative", "title": "attribution"}
            x2 = None
        else:
            steps = waterfall_steps(v, max_features)
            rows = [
                {**s, "sign": "+" if s["value"] >= 0 else "-", "rank": len(steps) - i,
                 "text": f"{'+' if s['value'] >= 0 else ''}{num(float(s['value']))}",
                 "at": max(s["start"], s["end"])}
                for i, s in enumerate(steps)
            ]  # fmt: skip
            x = {"field": "start", "type": "quantitative", "title": None, "scale": {"zero": False}}
            x2 = {"field": "end"}
            spec["title"] = {
                "text": title(v),
                "subtitle": f"E[f(x)] = {num(v.base)} → f(x) = {num(v.output)}",
            }
        y = {"field": "label", "type": "nominal", "sort": {"field": "rank"}, "title": None}
        encoding = {"y": y, "x": x, "color": sign, "tooltip": tooltip}
        bars: dict[str, Any] = {"mark": "bar", "encoding": encoding}
        if x2 is not None:
            bars["encoding"]["x2"] = x2
        text_x = {"field": "at", "type": "quantitative"}
        numbers = {
            "mark": {"type": "text", "align": "left", "dx": 3, "fontSize": 10},
            "encoding": {"y": y, "x": text_x, "text": {"field": "text"}},
        }
        layers = [bars, numbers]
        if kind == "waterfall":
            for at, name in ((v.base, "E[f(x)]"), (v.output, "f(x)")):
                layers.append({
                    "data": {"values": [{"x": at, "label": f"{name} = {num(at)}"}]},
                    "mark": {"type": "rule", "strokeDash": [3, 3], "color": "#888"},
                    "encoding": {"x": {"field": "x", "type": "quantitative"},
                                 "tooltip": [{"field": "label"}]},
                })  # fmt: skip
        spec.update(data={"values": rows}, layer=layers)
    elif kind == "interactions":
        grid = interaction_matrix(v)
        rows = [
            {"row": v.names[r], "col": v.names[c], "value": float(grid[r, c])}
            for r in range(grid.shape[0])
            for c in range(grid.shape[1])
        ]
        limit = float(np.abs(grid).max()) or 1.0
        axis = {"title": None}
        spec.update(
            data={"values": rows},
            mark={"type": "rect"},
            encoding={
                "x": {"field": "col", "type": "ordinal", "sort": None, "axis": axis},
                "y": {"field": "row", "type": "ordinal", "sort": None, "axis": axis},
                "color": {
                    "field": "value",
                    "type": "quantitative",
                    "scale": {"scheme": "redblue", "reverse": True, "domain": [-limit, limit]},
                    "title": "attribution",
                },
                "tooltip": [{"field": "value", "type": "quantitative"}],
            },
        )
    elif kind == "text":
        rows = [
            {"order": i, "word": n, "value": float(x), "sign": "+" if x >= 0 else "-"}
            for i, (n, x) in enumerate(zip(v.names, v.values, strict=True))
        ]
        spec.update(
            data={"values": rows},
            mark="bar",
            encoding={
                "x": {"field": "order", "type": "ordinal", "axis": None},
                "y": {"field": "value", "type": "quantitative", "title": "attribution"},
                "color": sign,
                "tooltip": [{"field": "word"}, {"field": "value", "type": "quantitative"}],
            },
        )
    else:
        raise InvalidInput(f"unknown plot kind {kind!r}")
    return spec


VEGA_SIDE = 64  # larger images are drawn in blocks (their means): at most 64×64 cells


def _blocks(a: np.ndarray, f: int) -> np.ndarray:
    """Means over f×f blocks of [H, W, ...] (the last blocks may be smaller)."""
    if f == 1:
        return a
    h, w = a.shape[:2]
    return np.array(
        [
            [a[r : r + f, c : c + f].mean(axis=(0, 1)) for c in range(0, w, f)]
            for r in range(0, h, f)
        ]
    )


def _vega_heatmap(v: View, classes: Classes, channels: str, value_range: Range) -> dict[str, Any]:
    """The input (in colour for RGB) beside the attributions over a faint copy of it: one panel
    per map (channels=each: r, g, b); superpixel boundaries marked."""
    maps = image_maps(v, channels)
    grey = image_of(v)
    assert maps is not None and grey is not None  # image_maps(strict=True) raises instead
    h, w = grey.shape
    colour = colour_of(v, value_range)
    labels = segment_labels(v, h, w)
    f = -(-max(h, w) // VEGA_SIDE)
    grey_b = _blocks(grey, f)
    colour_b = None if colour is None else _blocks(colour, f)
    edges = None if labels is None else _blocks(segment_edges(labels).astype(float), f) > 0
    fields = ["value"] if len(maps) == 1 else [f"value_{name}" for name, _ in maps]
    blocks = [_blocks(grid, f) for _, grid in maps]
    rows = []
    for r in range(grey_b.shape[0]):
        for c in range(grey_b.shape[1]):
            row: dict[str, Any] = {"row": r * f, "col": c * f, "pixel": float(grey_b[r, c])}
            row.update({k: float(b[r, c]) for k, b in zip(fields, blocks, strict=True)})
            if colour_b is not None:
                rgb = np.round(255 * colour_b[r, c]).astype(int)
                row["rgb"] = "#{:02x}{:02x}{:02x}".format(*rgb)
            if edges is not None:
                row["edge"] = bool(edges[r, c])
            rows.append(row)
    limit = max(float(np.abs(b).max()) for b in blocks) or 1.0
    cell: dict[str, Any] = {
        "x": {"field": "col", "type": "ordinal", "sort": None, "axis": None},
        "y": {"field": "row", "type": "ordinal", "sort": None, "axis": None},
    }
    if colour_b is not None:
        shade: dict[str, Any] = {"field": "rgb", "type": "nominal", "scale": None, "legend": None}
    else:
        shade = {"field": "pixel", "type": "quantitative", "scale": {"scheme": "greys"},
                 "legend": None}  # fmt: skip
    faint = {"mark": {"type": "rect", "opacity": 0.5 if colour_b is not None else 0.25},
             "encoding": {**cell, "color": shade}}  # fmt: skip
    layers: list[dict[str, Any]] = [{"mark": "rect", "encoding": {**cell, "color": shade}}]
    original: dict[str, Any] = {"title": "input", "layer": layers}
    if classes:
        original["title"] = {"text": "input", "subtitle": top_classes_text(classes)}
    boundary = {"transform": [{"filter": "datum.edge"}],
                "mark": {"type": "rect", "color": "#ffd600", "opacity": 0.8},
                "encoding": cell}  # fmt: skip
    panels: list[dict[str, Any]] = []
    for (name, _), field in zip(maps, fields, strict=True):
        heat = {
            "mark": {"type": "rect", "opacity": 0.85},
            "encoding": {
                **cell,
                "color": {
                    "field": field,
                    "type": "quantitative",
                    "scale": {"scheme": "redblue", "reverse": True, "domain": [-limit, limit]},
                    "title": "attribution",
                },
                "tooltip": [{"field": field, "type": "quantitative", "title": "attribution"}],
            },
        }
        caption = "attributions" if name == "sum" else f"attributions ({name} channel)"
        panels.append({"title": caption, "layer": [faint, heat]})
    if edges is not None:
        for layered in (layers, *(panel["layer"] for panel in panels)):
            layered.append(boundary)
    return {
        "data": {"values": rows},
        "hconcat": [original, *panels],
        "resolve": {"scale": {"color": "independent"}},
    }
