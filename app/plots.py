"""Plots of an explain response: one explanation as a View (its players, their labels and
values, an image's maps and segments), which the renderers draw: Vega-Lite specs in
app/plot_vega.py, matplotlib figures in app/plot_images.py (shap.Explanation arguments in
app/plot_shap.py).

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
Channels = Literal["sum", "r", "g", "b", "each"]
Range = tuple[float, float] | None  # the model's input_range, when known
Maps = list[tuple[str, np.ndarray]]  # attribution maps [H, W] with their channel: sum, r, g, b
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


def colour_of(v: View, value_range: Range = None) -> np.ndarray | None:
    """An RGB instance (3×H×W, channels first) as colours [H, W, 3] in [0, 1], or None.

    `value_range`: the model's input_range; without it [0, 1] or [0, 255] when the values lie
    there, else their own minimum and maximum (one scale for the three channels: hues stay)."""
    try:
        data = np.asarray(v.explanation.data, dtype=float)
    except (TypeError, ValueError):
        return None
    if data.ndim != 3 or data.shape[0] != 3 or data.size == 0 or not np.all(np.isfinite(data)):
        return None
    lo, hi = value_range if value_range is not None else _own_range(data)
    scaled = (data - lo) / (hi - lo) if hi > lo else np.zeros_like(data)
    return np.asarray(np.clip(scaled, 0, 1).transpose(1, 2, 0))


def _own_range(data: np.ndarray) -> tuple[float, float]:
    lo, hi = float(data.min()), float(data.max())
    if lo >= 0 and hi <= 1:
        return 0.0, 1.0
    if lo >= 0 and hi <= 255:
        return 0.0, 255.0
    return lo, hi


def image_map(v: View, strict: bool = True) -> np.ndarray | None:
    """Attributions spread over pixels [H, W]: one value per pixel (channels summed), one per
    patch named patch_<row>_<col>, or one per superpixel (details.segments)."""
    maps = image_maps(v, "sum", strict)
    return None if maps is None else maps[0][1]


def image_maps(v: View, channels: str = "sum", strict: bool = True) -> Maps | None:
    """Attribution maps [H, W] with their names: one, summed over channels ("sum"), or with
    pixel attributions of an RGB image (3×H×W values) a channel's own ("r", "g", "b") or all
    three ("each")."""
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
    if n % (h * w) == 0 and n >= h * w:  # pixel attributions [C, H, W]
        planes = v.values.reshape(-1, h, w)
        if channels == "sum":
            return [("sum", np.asarray(planes.sum(axis=0)))]
        if len(planes) != 3:
            raise InvalidInput(
                f"channels={channels} needs pixel attributions of an RGB image (3 values per "
                f"pixel); this explanation has {len(planes)}: use channels=sum"
            )
        if channels == "each":
            return [(name, np.asarray(planes[i])) for i, name in enumerate("rgb")]
        return [(channels, np.asarray(planes["rgb".index(channels)]))]
    if channels != "sum":
        raise InvalidInput(
            f"channels={channels} applies to pixel attributions (gradient explainers); each of "
            "these players covers every channel: use channels=sum"
        )
    labels = segment_labels(v, h, w)
    if labels is not None:
        return [("sum", np.asarray(v.values[labels]))]
    grid = _patch_grid(v, h, w)
    if grid is not None:
        return [("sum", grid)]
    if strict:
        raise InvalidInput(
            "the players of this explanation are neither pixels, patches nor superpixels"
        )
    return None


def _patch_grid(v: View, h: int, w: int) -> np.ndarray | None:
    """Players patch_<row>_<col>: each value over its patch (parameters.patch_size; without
    it, the patch size that the grid of names covers the image with)."""
    matches = [PATCH.match(name) for name in v.names]
    if not matches or not all(matches):
        return None
    cells = [(int(m.group(1)), int(m.group(2))) for m in matches if m is not None]
    size = v.parameters.get("patch_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        sr = sc = size
    else:
        sr = -(-h // (max(r for r, _ in cells) + 1))
        sc = -(-w // (max(c for _, c in cells) + 1))
    grid = np.zeros((h, w))
    for (r, c), value in zip(cells, v.values, strict=True):
        grid[r * sr : (r + 1) * sr, c * sc : (c + 1) * sc] = value
    return grid


def segment_labels(v: View, h: int, w: int) -> np.ndarray | None:
    """The player of each pixel [H, W] from details.segments ({"shape": [H, W], "rle": [player,
    count, player, count, ...]}, run-length encoded in row-major order), or None without it."""
    seg = (v.explanation.details or {}).get("segments")
    if seg is None:
        return None
    rle = seg.get("rle") if isinstance(seg, dict) else None
    shape = seg.get("shape") if isinstance(seg, dict) else None
    if (
        shape != [h, w]
        or not isinstance(rle, list)
        or len(rle) % 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in rle)
    ):
        raise InvalidInput(
            f"details.segments must be {{shape: [{h}, {w}], rle: [player, count, ...]}} with "
            "non-negative integers"
        )
    players, counts = np.asarray(rle[0::2], dtype=np.int64), np.asarray(rle[1::2], dtype=np.int64)
    if int(counts.sum()) != h * w or (len(players) and int(players.max()) >= len(v.values)):
        raise InvalidInput(
            f"details.segments must cover the {h}×{w} pixels with players in "
            f"[0, {len(v.values)})"
        )
    return np.repeat(players, counts).reshape(h, w)


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


def segment_edges(labels: np.ndarray) -> np.ndarray:
    """Pixels [H, W] whose right or lower neighbour lies in another segment: one-pixel lines."""
    edge = np.zeros(labels.shape, dtype=bool)
    edge[:, :-1] |= labels[:, :-1] != labels[:, 1:]
    edge[:-1, :] |= labels[:-1, :] != labels[1:, :]
    return edge


def top_classes_text(classes: list[tuple[str, float]]) -> str:
    """'6: 97.1% · 5: 1.2% · 8: 0.9%'."""
    return " · ".join(f"{name}: {100 * p:.1f}%" for name, p in classes)
