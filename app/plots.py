"""Plots of an explain response: matplotlib PNG/SVG, Vega-Lite specs, shap.Explanation arguments.

Everything here reads the response body only (API.md shape), so it serves every explainer:
players are features (bar, waterfall), pixels or patches of an image (heatmap), pieces of a text
(highlighted words), and interaction terms (matrix).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.errors import InvalidInput

Kind = Literal["auto", "bar", "waterfall", "heatmap", "text", "interactions"]
Format = Literal["png", "svg", "vega-lite", "shap"]
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
    raw: dict[str, Any]
    parameters: dict[str, Any]


def view(body: dict[str, Any], index: int) -> View:
    explanations = body["data"]["explanations"]
    if not 0 <= index < len(explanations):
        raise InvalidInput(f"index must be in [0, {len(explanations)}), got {index}")
    e = explanations[index]
    names = list(body["data"]["feature_names"])
    if e.get("players"):
        names = [p["text"] for p in e["players"]]
    values = np.asarray(e["values"], dtype=float)
    numbers = [*values, e["base_value"], e["instance_output_value"]]
    if len(values) == 0 or not np.all(np.isfinite(numbers)):
        raise InvalidInput("an explanation needs finite values, base value and output to plot")
    with np.errstate(over="ignore"):  # waterfalls and summed tails add values up
        running = np.cumsum(np.concatenate([[e["base_value"]], np.abs(values)]))
    if not np.isfinite(running[-1]) or abs(float(running[-1])) > 1e300:
        raise InvalidInput("the values are too large to plot (their sum overflows)")
    if len(names) != len(values):
        names = [f"player {i}" for i in range(len(values))]
    return View(
        names=names,
        values=values,
        base=float(e["base_value"]),
        output=float(e["instance_output_value"]),
        output_name=str(e.get("output_name", e.get("output_index", ""))),
        explainer=str(body["meta"].get("explainer", "")),
        additive=bool(body["meta"].get("additive", True)),
        raw=e,
        parameters=dict(body["meta"].get("parameters") or {}),
    )


def auto_kind(v: View) -> str:
    if v.raw.get("players"):
        return "text"
    if image_map(v, strict=False) is not None:
        return "heatmap"
    return "waterfall" if v.additive else "bar"


def _image(v: View) -> np.ndarray | None:
    """The instance as [H, W] grey levels (channels averaged), or None if it is no image."""
    try:
        data = np.asarray(v.raw.get("data"), dtype=float)
    except (TypeError, ValueError):
        return None
    if data.ndim == 3:
        data = data.mean(axis=0)
    return data if data.ndim == 2 else None


def image_map(v: View, strict: bool = True) -> np.ndarray | None:
    """Attributions spread over pixels [H, W]: one value per pixel (channels summed), or one per
    patch named patch_<row>_<col> with parameters.patch_size."""
    image = _image(v)
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
    inter = v.raw.get("interactions")
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
    steps, level = [], v.base
    for name, value in reversed(list(zip(names, values, strict=True))):
        steps.append({"player": name, "start": level, "end": level + value, "value": value})
        level += value
    return steps


# ----------------------------------------------------------------------------- matplotlib


def figure(body: dict[str, Any], kind: str, index: int, max_features: int) -> Any:
    """A matplotlib Figure (no pyplot: safe in worker threads)."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    v = view(body, index)
    kind = auto_kind(v) if kind == "auto" else kind
    title = f"{v.explainer}: {v.output_name} = {v.output:.4g} (base {v.base:.4g})"
    if kind in ("bar", "waterfall"):
        names, values = top(v, max_features)
        fig = Figure(figsize=(7, 0.35 * len(names) + 1.3))
        ax = fig.add_subplot()
        if kind == "bar":
            ax.barh(names[::-1], values[::-1], color=[_sign(x) for x in values[::-1]])
            ax.axvline(0, color="black", linewidth=0.8)
        else:
            steps = waterfall_steps(v, max_features)
            ax.barh(
                [s["player"] for s in steps],
                [s["value"] for s in steps],
                left=[s["start"] for s in steps],
                color=[_sign(s["value"]) for s in steps],
            )
            ax.axvline(v.base, color="grey", linestyle="--", linewidth=0.8)
            ax.axvline(v.output, color="black", linestyle=":", linewidth=0.8)
            ax.use_sticky_edges = False  # bars start anywhere: keep a margin on both sides
            ax.margins(x=0.05)
        ax.set_xlabel("attribution" if kind == "bar" else "output")
    elif kind == "heatmap":
        grid, image = image_map(v), _image(v)
        if grid is None or image is None:  # image_map(strict=True) raises first
            raise InvalidInput("a heatmap needs an image instance")
        fig = Figure(figsize=(5, 4.4))
        ax = fig.add_subplot()
        ax.imshow(image, cmap="gray_r")
        limit = float(np.abs(grid).max()) or 1.0
        shown = ax.imshow(
            grid, cmap="bwr", alpha=0.6, norm=TwoSlopeNorm(0, vmin=-limit, vmax=limit)
        )
        fig.colorbar(shown, ax=ax, label="attribution")
        ax.set_xticks([])
        ax.set_yticks([])
    elif kind == "text":
        fig = _text_figure(v)
    elif kind == "interactions":
        matrix = interaction_matrix(v)
        fig = Figure(figsize=(6, 5))
        ax = fig.add_subplot()
        limit = float(np.abs(matrix).max()) or 1.0
        shown = ax.imshow(matrix, cmap="bwr", norm=TwoSlopeNorm(0, vmin=-limit, vmax=limit))
        ax.set_xticks(range(len(v.names)), v.names, rotation=90)
        ax.set_yticks(range(len(v.names)), v.names)
        fig.colorbar(shown, ax=ax, label=str(v.raw["interactions"].get("index", "interaction")))
    else:
        raise InvalidInput(f"unknown plot kind {kind!r}")
    fig.suptitle(title, fontsize=10)
    _margins(fig, kind, v.names)
    return fig


def _margins(fig: Any, kind: str, names: list[str]) -> None:
    """Fixed margins sized from the labels: tight_layout would draw the figure twice."""
    width_in, height_in = fig.get_size_inches()
    label_in = 0.09 * min(30, max((len(n) for n in names), default=4)) + 0.3  # ~10 pt chars
    top = 1 - 0.45 / height_in
    if kind in ("bar", "waterfall"):
        fig.subplots_adjust(
            left=min(0.6, label_in / width_in), right=0.97, top=top, bottom=0.6 / height_in
        )
    elif kind == "interactions":
        side = min(0.45, label_in / min(width_in, height_in))
        fig.subplots_adjust(left=side, right=0.95, top=top, bottom=side)
    elif kind == "heatmap":
        fig.subplots_adjust(left=0.04, right=0.96, top=top, bottom=0.04)
    else:
        fig.subplots_adjust(left=0.02, right=0.98, top=top, bottom=0.02)


def _sign(value: float) -> str:
    return POSITIVE if value >= 0 else NEGATIVE


def _text_figure(v: View) -> Any:
    """Words in reading order, each on a background coloured by its value (monospace layout)."""
    from matplotlib import colormaps
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    width, col = 88, 0  # characters per line at 10 pt on 8 inches
    lines: list[list[tuple[int, str, float]]] = []
    line: list[tuple[int, str, float]] = []
    for name, value in zip(v.names, v.values, strict=True):
        if col + len(name) > width and line:
            lines.append(line)
            line, col = [], 0
        line.append((col, name, value))
        col += len(name) + 1
    lines.append(line)
    fig = Figure(figsize=(8, 0.45 * len(lines) + 1.0))
    ax = fig.add_subplot()
    ax.set_xlim(0, 96)
    ax.set_ylim(len(lines), -0.5)
    ax.axis("off")
    limit = float(np.abs(v.values).max()) or 1.0
    norm, cmap = TwoSlopeNorm(0, vmin=-limit, vmax=limit), colormaps["bwr"]
    for row, items in enumerate(lines):
        for col, name, value in items:
            ax.text(
                col,
                row,
                name,
                family="monospace",
                va="center",
                bbox={"facecolor": cmap(norm(value)), "edgecolor": "none", "pad": 1.5},
            )
    return fig


def image_bytes(body: dict[str, Any], fmt: str, kind: str, index: int, max_features: int) -> bytes:
    buf = io.BytesIO()
    fig = figure(body, kind, index, max_features)
    try:
        fig.savefig(buf, format=fmt, dpi=100, metadata={"Date": None} if fmt == "svg" else None)
    except (ValueError, OverflowError) as exc:  # e.g. values too large to lay out
        raise InvalidInput(f"cannot draw this explanation: {exc}") from None
    return buf.getvalue()


# ----------------------------------------------------------------------------- Vega-Lite


def vega_lite(body: dict[str, Any], kind: str, index: int, max_features: int) -> dict[str, Any]:
    """A Vega-Lite v6 specification with the data inline."""
    v = view(body, index)
    kind = auto_kind(v) if kind == "auto" else kind
    sign = {
        "field": "sign",
        "type": "nominal",
        "scale": {"domain": ["+", "-"], "range": [POSITIVE, NEGATIVE]},
        "legend": None,
    }
    spec: dict[str, Any] = {
        "$schema": VEGA_LITE_SCHEMA,
        "title": f"{v.explainer}: {v.output_name} = {v.output:.4g} (base {v.base:.4g})",
    }
    if kind == "bar":
        names, values = top(v, max_features)
        rows = [
            {"player": n, "value": float(x), "sign": "+" if x >= 0 else "-", "rank": i}
            for i, (n, x) in enumerate(zip(names, values, strict=True))
        ]
        spec.update(
            data={"values": rows},
            mark="bar",
            encoding={
                "y": {"field": "player", "type": "nominal", "sort": {"field": "rank"}},
                "x": {"field": "value", "type": "quantitative", "title": "attribution"},
                "color": sign,
                "tooltip": [{"field": "player"}, {"field": "value", "type": "quantitative"}],
            },
        )
    elif kind == "waterfall":
        steps = waterfall_steps(v, max_features)
        rows = [
            {**s, "sign": "+" if s["value"] >= 0 else "-", "rank": len(steps) - i}
            for i, s in enumerate(steps)
        ]
        spec.update(
            data={"values": rows},
            mark="bar",
            encoding={
                "y": {"field": "player", "type": "nominal", "sort": {"field": "rank"}},
                "x": {"field": "start", "type": "quantitative", "title": "output"},
                "x2": {"field": "end"},
                "color": sign,
                "tooltip": [{"field": "player"}, {"field": "value", "type": "quantitative"}],
            },
        )
    elif kind in ("heatmap", "interactions"):
        grid = image_map(v) if kind == "heatmap" else interaction_matrix(v)
        assert grid is not None  # image_map(strict=True) raises instead
        image = _image(v) if kind == "heatmap" else None

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
        cell = {
            "x": {"field": "col", "type": "ordinal", "sort": None},
            "y": {"field": "row", "type": "ordinal", "sort": None},
        }
        heat = {
            "mark": {"type": "rect", "opacity": 0.6 if image is not None else 1.0},
            "encoding": {
                **cell,
                "color": {
                    "field": "value",
                    "type": "quantitative",
                    "scale": {"scheme": "redblue", "reverse": True, "domain": [-limit, limit]},
                },
                "tooltip": [{"field": "value", "type": "quantitative"}],
            },
        }
        layers: list[dict[str, Any]] = [heat]
        if image is not None:
            grey = {"field": "pixel", "type": "quantitative", "scale": {"scheme": "greys"}}
            layers.insert(0, {"mark": "rect", "encoding": {**cell, "color": grey}})
        spec.update(data={"values": rows}, layer=layers)
        if image is not None:
            spec["resolve"] = {"scale": {"color": "independent"}}
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


# ----------------------------------------------------------------------------- shap


def text_tokens(text: Any, players: list[dict[str, Any]]) -> list[str]:
    """Each player's text with the characters up to the next player ('The ', 'food ', ...), as
    shap's text maskers cut tokens: joined, they give back the text with its spaces and
    punctuation (what precedes the first player goes with it). Without the text, or when the
    offsets don't match it, a space wherever the offsets skip characters.
    (xai/results.py does the same on the client side, which does not import the service.)"""
    if not players:
        return []
    starts = [int(p["start"]) for p in players]
    ends = [int(p["end"]) for p in players]
    ordered = all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    if (
        isinstance(text, str)
        and ordered
        and all(text[p["start"] : p["end"]] == p["text"] for p in players)
    ):
        cuts = [0, *starts[1:], len(text)]
        return [text[cuts[i] : cuts[i + 1]] for i in range(len(players))]
    gaps = [s > e for e, s in zip(ends, starts[1:], strict=False)] + [False]
    return [p["text"] + (" " if gap else "") for p, gap in zip(players, gaps, strict=True)]


def shap_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of shap.Explanation (as JSON lists) for every explanation of a response.

    Tabular and image players share names, so values are [m, n]; text players differ per
    instance, so values and data are per-instance lists (shap's ragged text form): data holds
    the tokens with their spacing (shap.plots.text joins them as written), feature_names the
    players' words.
    """
    explanations = body["data"]["explanations"]
    ragged = any(e.get("players") for e in explanations)
    args: dict[str, Any] = {
        "values": [e["values"] for e in explanations],
        "base_values": [e["base_value"] for e in explanations],
        # each instance explains one output (its own target): shap's output_names and
        # output_indexes describe an output axis instead, so the names go to instance_names
        "instance_names": [f"{i}: {e.get('output_name')}" for i, e in enumerate(explanations)],
    }
    if ragged:
        players = [e.get("players") or [] for e in explanations]
        args["data"] = [
            text_tokens(e.get("data"), ps) for e, ps in zip(explanations, players, strict=True)
        ]
        args["feature_names"] = [[p["text"] for p in ps] for ps in players]
    else:
        args["feature_names"] = list(body["data"]["feature_names"])
        n = len(args["feature_names"])
        data: list[list[Any] | None] = []
        for e in explanations:
            flat = list(np.ravel(np.asarray(e["data"], dtype=object))) if e.get("data") else []
            data.append(flat if len(flat) == n else None)
        if all(row is not None for row in data):
            args["data"] = data
    if all(e.get("error_std") is not None for e in explanations):
        args["error_std"] = [e["error_std"] for e in explanations]
    return args
