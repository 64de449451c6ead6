"""Plots of an explain response: the players and their labels and Vega-Lite specs (the
matplotlib figures are in app/plot_images.py, shap.Explanation arguments in app/plot_shap.py).

Everything here reads the typed answer only (app/schemas.py ExplainResponse: what the service
returns, or the JSON an explain route answered), so it serves every explainer:
players are features (bar, waterfall), pixels or patches of an image (heatmap), pieces of a text
(highlighted words), and interaction terms (matrix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.errors import InvalidInput
from app.schemas import ExplainResponse, ExplanationOut

Kind = Literal["auto", "bar", "waterfall", "heatmap", "text", "interactions"]
Format = Literal["png", "svg", "vega-lite", "shap"]
Classes = list[tuple[str, float]] | None  # (class name, probability), most probable first
VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"
PATCH = re.compile(r"^patch_(\d+)_(\d+)$")
POSITIVE, NEGATIVE = "#d62728", "#1f77b4"  # shap's convention: red raises the output


@dataclass(frozen=True)
class View:
    """One explanation of a response, with the names of its players."""

    names: list[str]
    values: np.ndarray  # [n_players]
    base: float
    output: float
    output_name: str
    explainer: str
    additive: bool
    explanation: ExplanationOut
    parameters: dict[str, Any]
    model: str = ""
    feature_values: list[Any] | None = None  # the instance's value per player (tables)


def view(answer: ExplainResponse, index: int) -> View:
    """Explanation `index` of a typed answer, with its players' names."""
    explanations = answer.data.explanations
    if not 0 <= index < len(explanations):
        raise InvalidInput(f"index must be in [0, {len(explanations)}), got {index}")
    e = explanations[index]
    names = list(answer.data.feature_names)
    if e.players:
        names = [p.text for p in e.players]
    values = np.asarray(e.values, dtype=float)
    numbers = [*values, e.base_value, e.instance_output_value]
    if len(values) == 0 or not np.all(np.isfinite(numbers)):
        raise InvalidInput("an explanation needs finite values, base value and output to plot")
    with np.errstate(over="ignore"):  # waterfalls and summed tails add values up
        running = np.cumsum(np.concatenate([[e.base_value], np.abs(values)]))
    if not np.isfinite(running[-1]) or abs(float(running[-1])) > 1e300:
        raise InvalidInput("the values are too large to plot (their sum overflows)")
    if len(names) != len(values):
        names = [f"player {i}" for i in range(len(values))]
    return View(
        names=names,
        values=values,
        base=e.base_value,
        output=e.instance_output_value,
        output_name=e.output_name,
        explainer=answer.meta.explainer,
        additive=answer.meta.additive,
        explanation=e,
        parameters=answer.meta.parameters,
        model=answer.model_name,
        feature_values=_feature_values(e.data, len(values)),
    )


def _feature_values(data: Any, n: int) -> list[Any] | None:
    if data is None or isinstance(data, str):
        return None
    try:
        flat = np.ravel(np.asarray(data, dtype=object)).tolist()
    except ValueError:  # ragged
        return None
    return flat if len(flat) == n else None


def num(x: float) -> str:
    """A number people read: 4 significant digits, no exponent between 1e-3 and 1e5."""
    if not np.isfinite(x):
        return str(x)
    a = abs(x)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{x:.2e}"
    if a < 1:
        return f"{x:.3g}"
    decimals = max(0, 3 - int(np.floor(np.log10(a))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def title(v: View) -> str:
    """model · explainer · target · f(x), as a reader names them."""
    parts = [v.model, v.explainer, v.output_name, f"f(x) = {num(v.output)}"]
    return " · ".join(p for p in parts if p)


def labels(v: View, names: list[str]) -> list[str]:
    """shap's labels: 'value = feature' where the instance gives one value per player."""
    if v.feature_values is None:
        return list(names)
    values = dict(zip(v.names, v.feature_values, strict=True))
    return [
        f"{num(float(values[n]))} = {n}" if isinstance(values.get(n), int | float) else n
        for n in names
    ]


def left_out(v: View) -> None:
    """400 for an image answer whose instance was left out (data null, data_digest given)."""
    digest = v.explanation.data_digest
    if v.explanation.data is None and digest is not None and len(digest.get("shape", [])) >= 2:
        raise InvalidInput(
            f"this answer left its {'x'.join(map(str, digest['shape']))} image out (data null, "
            "data_digest): explain with \"return_inputs\": true to plot it, or call "
            "POST /v2/models/{model}/explain/{explainer}/plot, which explains and plots at once"
        )


def auto_kind(v: View) -> str:
    left_out(v)
    if v.explanation.players:
        return "text"
    if image_map(v, strict=False) is not None:
        return "heatmap"
    return "waterfall" if v.additive else "bar"


def image_of(v: View) -> np.ndarray | None:
    """The instance as [H, W] grey levels (channels averaged), or None if it is no image."""
    try:
        data = np.asarray(v.explanation.data, dtype=float)
    except (TypeError, ValueError):
        return None
    if data.ndim == 3:
        data = data.mean(axis=0)
    return data if data.ndim == 2 else None


def image_map(v: View, strict: bool = True) -> np.ndarray | None:
    """Attributions spread over pixels [H, W]: one value per pixel (channels summed), or one per
    patch named patch_<row>_<col> with parameters.patch_size."""
    image = image_of(v)
    if image is None:
        if strict:
            raise InvalidInput("a heatmap needs an image instance (data as [H, W] or [C, H, W])")
        return None
    h, w = image.shape
    n = len(v.values)
    if h * w == 0:
        if strict:
            raise InvalidInput("the instance is an empty image")
        return None
    if n % (h * w) == 0 and n >= h * w:
        return np.asarray(v.values.reshape(-1, h, w).sum(axis=0))
    size = int(v.parameters.get("patch_size", 0) or 0)
    matches = [PATCH.match(name) for name in v.names]
    if size > 0 and all(matches):
        grid = np.zeros((h, w))
        for m, value in zip(matches, v.values, strict=True):
            r, c = int(m.group(1)) * size, int(m.group(2)) * size  # type: ignore[union-attr]
            grid[r : r + size, c : c + size] = value
        return grid
    if strict:
        raise InvalidInput("the players of this explanation are neither pixels nor patches")
    return None


def interaction_matrix(v: View) -> np.ndarray:
    """Order-1 and order-2 terms as a symmetric [n, n] matrix (main effects on the diagonal)."""
    inter = v.explanation.interactions
    if not inter or not isinstance(inter.get("values"), dict):
        raise InvalidInput("this explanation has no interactions (ask an interaction index)")
    n = len(v.values)
    matrix = np.zeros((n, n))
    for key, value in inter["values"].items():
        try:
            idx = [int(i) for i in str(key).split(",") if i.strip() != ""]
        except ValueError:
            raise InvalidInput(f"interaction key {key!r} is not a list of player indices") from None
        if not isinstance(value, int | float) or not np.isfinite(value):
            raise InvalidInput(f"interaction {key!r} is not a finite number")
        if any(not 0 <= i < n for i in idx):
            raise InvalidInput(f"interaction key {key!r} names a player outside [0, {n})")
        if len(idx) == 1:
            matrix[idx[0], idx[0]] = value
        elif len(idx) == 2:
            matrix[idx[0], idx[1]] = matrix[idx[1], idx[0]] = value
    return matrix


def top(v: View, max_features: int) -> tuple[list[str], np.ndarray]:
    """The largest |values| first; the rest summed into one 'N other' entry."""
    order = np.argsort(-np.abs(v.values), kind="stable")
    names = [v.names[i] for i in order[:max_features]]
    values = v.values[order[:max_features]]
    if len(order) > max_features:
        names.append(f"{len(order) - max_features} other players")
        values = np.append(values, v.values[order[max_features:]].sum())
    return names, values


def waterfall_steps(v: View, max_features: int) -> list[dict[str, Any]]:
    """Bars from the base value to the output: the smallest contributions first, as shap does."""
    names, values = top(v, max_features)
    shown = labels(v, names)
    steps, level = [], v.base
    for name, label, value in reversed(list(zip(names, shown, values, strict=True))):
        steps.append(
            {"player": name, "label": label, "start": level, "end": level + value, "value": value}
        )
        level += value
    return steps


# ----------------------------------------------------------------------------- Vega-Lite


def vega_lite(
    body: ExplainResponse,
    kind: str,
    index: int,
    max_features: int,
    classes: Classes = None,
) -> dict[str, Any]:
    """A Vega-Lite v6 specification with the data inline; `classes`: the top class
    probabilities of an image, shown under the original."""
    v = view(body, index)
    kind = auto_kind(v) if kind == "auto" else kind
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
    elif kind in ("heatmap", "interactions"):
        grid = image_map(v) if kind == "heatmap" else interaction_matrix(v)
        assert grid is not None  # image_map(strict=True) raises instead
        image = image_of(v) if kind == "heatmap" else None

        def label(i: int) -> int | str:
            return i if image is not None else v.names[i]

        rows = [
            {
                "row": label(r),
                "col": label(c),
                "value": float(grid[r, c]),
                **({"pixel": float(image[r, c])} if image is not None else {}),
            }
            for r in range(grid.shape[0])
            for c in range(grid.shape[1])
        ]
        limit = float(np.abs(grid).max()) or 1.0
        cell: dict[str, dict[str, Any]] = {
            "x": {"field": "col", "type": "ordinal", "sort": None, "axis": None},
            "y": {"field": "row", "type": "ordinal", "sort": None, "axis": None},
        }
        if image is None:
            cell["x"]["axis"] = cell["y"]["axis"] = {"title": None}
        heat = {
            "mark": {"type": "rect", "opacity": 0.85 if image is not None else 1.0},
            "encoding": {
                **cell,
                "color": {
                    "field": "value",
                    "type": "quantitative",
                    "scale": {"scheme": "redblue", "reverse": True, "domain": [-limit, limit]},
                    "title": "attribution",
                },
                "tooltip": [{"field": "value", "type": "quantitative"}],
            },
        }
        if image is None:
            spec.update(data={"values": rows}, **heat)
        else:
            grey = {"field": "pixel", "type": "quantitative", "scale": {"scheme": "greys"},
                    "legend": None}  # fmt: skip
            faint = {"mark": {"type": "rect", "opacity": 0.25}, "encoding": {**cell, "color": grey}}
            original = {"title": "input", "mark": "rect", "encoding": {**cell, "color": grey}}
            if classes:
                original["title"] = {"text": "input", "subtitle": top_classes_text(classes)}
            spec.update(
                data={"values": rows},
                hconcat=[original, {"title": "attributions", "layer": [faint, heat]}],
                resolve={"scale": {"color": "independent"}},
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


def top_classes_text(classes: list[tuple[str, float]]) -> str:
    """'6: 97.1% · 5: 1.2% · 8: 0.9%'."""
    return " · ".join(f"{name}: {100 * p:.1f}%" for name, p in classes)
