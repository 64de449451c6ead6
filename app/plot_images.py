"""Matplotlib figures (PNG, SVG) of one explanation of a response, after shap's plots.

Bars and waterfalls label each player with its value ('31.2 = bmi'), the waterfall runs from
E[f(x)] to f(x) with both marked; an image heatmap stands beside the original (with its top
classes when the model is known); text keeps every character of the input, coloured where a
player lies, with a colour legend. No pyplot: safe in worker threads.
"""

from __future__ import annotations

import io
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


def _sign(value: float) -> str:
    return POSITIVE if value >= 0 else NEGATIVE


def _diverging() -> Any:
    """Blue through transparent to red (shap's red_transparent_blue, in our two colours)."""
    from matplotlib.colors import LinearSegmentedColormap, to_rgb

    blue, red = to_rgb(NEGATIVE), to_rgb(POSITIVE)
    return LinearSegmentedColormap.from_list(
        "attribution", [(0.0, (*blue, 1.0)), (0.5, (1.0, 1.0, 1.0, 0.0)), (1.0, (*red, 1.0))]
    )


def figure(
    body: ExplainResponse,
    kind: str,
    index: int,
    max_features: int,
    classes: Classes = None,
    channels: str = "sum",
    value_range: Range = None,
) -> Any:
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    v = view(body, index)
    kind = auto_kind(v) if kind == "auto" else kind
    if kind in ("bar", "waterfall"):
        fig = _bars(v, kind, max_features)
    elif kind == "heatmap":
        fig = _heatmap(v, classes, channels, value_range)
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
        index_name = (v.explanation.interactions or {}).get("index", "interaction")
        fig.colorbar(shown, ax=ax, label=str(index_name))
        _margins(fig, kind, v.names)
    else:
        raise InvalidInput(f"unknown plot kind {kind!r}")
    fig.suptitle(title(v), fontsize=10)
    return fig


def _bars(v: View, kind: str, max_features: int) -> Any:
    from matplotlib.figure import Figure

    names, values = top(v, max_features)
    shown = labels(v, names)
    fig = Figure(figsize=(7.5, 0.35 * len(names) + 1.6))
    ax = fig.add_subplot()
    rows = np.arange(len(names))[::-1]  # the largest on top
    if kind == "bar":
        ax.barh(rows, values, color=[_sign(x) for x in values], height=0.7)
        ax.axvline(0, color="black", linewidth=0.8)
        ends, starts = list(values), [0.0] * len(values)
        ax.set_xlabel("attribution")
    else:
        steps = waterfall_steps(v, max_features)[::-1]  # the largest first, as names
        starts = [s["start"] for s in steps]
        ends = [s["end"] for s in steps]
        ax.barh(rows, [s["value"] for s in steps], left=starts, height=0.7,
                color=[_sign(s["value"]) for s in steps])  # fmt: skip
        for at, name, where in ((v.base, "E[f(x)]", "bottom"), (v.output, "f(x)", "top")):
            ax.axvline(at, color="#888", linestyle="--", linewidth=0.8)
            marker = ax.secondary_xaxis("top" if where == "top" else -0.09)
            marker.set_xticks([at], [f"{name} = {num(at)}"])
            marker.tick_params(colors="#555", length=0)
            marker.spines[where].set_visible(False)
    span = max(max(ends + starts) - min(ends + starts), 1e-12)
    for r, start, end in zip(rows, starts, ends, strict=True):
        value = end - start
        ax.text(max(start, end) + 0.01 * span, r, f"{'+' if value >= 0 else ''}{num(value)}",
                va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(rows, shown)
    ax.use_sticky_edges = False  # bars start anywhere: keep a margin on both sides
    ax.margins(x=0.12)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    _margins(fig, kind, shown)
    return fig


def _heatmap(v: View, classes: Classes, channels: str, value_range: Range) -> Any:
    """The original on the left (in colour for RGB), the attributions over a paler copy on the
    right (shap's image_plot; channels=each: one panel per channel); superpixel boundaries in
    yellow; the top classes under the original."""
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    maps, grey = image_maps(v, channels), image_of(v)
    if maps is None or grey is None:  # image_maps(strict=True) raises first
        raise InvalidInput("a heatmap needs an image instance")
    colour = colour_of(v, value_range)
    labels = segment_labels(v, *grey.shape)
    edges = None
    if labels is not None:
        edges = np.zeros((*grey.shape, 4))
        edges[segment_edges(labels)] = (1.0, 0.84, 0.0, 0.9)
    panels = 1 + len(maps)
    fig = Figure(figsize=(4 * panels, 4.4))
    axes = [fig.add_subplot(1, panels, k + 1) for k in range(panels)]
    if colour is not None:
        axes[0].imshow(colour, interpolation="nearest")
    else:
        axes[0].imshow(grey, cmap="gray_r", interpolation="nearest")
    axes[0].set_title("input", fontsize=9)
    if classes:
        axes[0].set_xlabel(top_classes_text(classes), fontsize=9)
    limit = max(float(np.abs(grid).max()) for _, grid in maps) or 1.0
    norm = TwoSlopeNorm(0, vmin=-limit, vmax=limit)
    shown = None
    for ax, (name, grid) in zip(axes[1:], maps, strict=True):
        if colour is not None:  # paler, still in its colours where attributions are ~0
            ax.imshow(colour, alpha=0.5, interpolation="nearest")
        else:
            ax.imshow(grey, cmap="gray_r", alpha=0.2, interpolation="nearest")
        shown = ax.imshow(grid, cmap=_diverging(), norm=norm, interpolation="nearest")
        channel = "" if name == "sum" else f" ({name} channel)"
        ax.set_title(f"attributions to {v.output_name}{channel}", fontsize=9)
    if edges is not None:
        for ax in axes:
            ax.imshow(edges, interpolation="nearest")
    assert shown is not None  # image_maps gives at least one map
    bar = fig.colorbar(shown, ax=axes[-1], fraction=0.046, pad=0.04)
    bar.set_label("attribution: red raises, blue lowers", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    right = 1 - 1.12 / (4 * panels)  # 1.12 in for the colour bar
    fig.subplots_adjust(left=0.03, right=right, top=0.86, bottom=0.1, wspace=0.08)
    return fig


def _margins(fig: Any, kind: str, names: list[str]) -> None:
    """Fixed margins sized from the labels: tight_layout would draw the figure twice."""
    width_in, height_in = fig.get_size_inches()
    label_in = 0.08 * min(40, max((len(n) for n in names), default=4)) + 0.3  # ~10 pt chars
    top = 1 - 0.55 / height_in
    if kind in ("bar", "waterfall"):
        bottom = (0.95 if kind == "waterfall" else 0.6) / height_in
        fig.subplots_adjust(
            left=min(0.6, label_in / width_in), right=0.97, top=top, bottom=bottom
        )
    elif kind == "interactions":
        side = min(0.45, label_in / min(width_in, height_in))
        fig.subplots_adjust(left=side, right=0.95, top=top, bottom=side)


def segments(v: View) -> list[tuple[str, float | None]]:
    """The text in reading order as (piece, value): players with their values, the characters
    between them (spaces, punctuation, the final '.') with None. Without the source text, the
    players joined by spaces."""
    text, players = v.explanation.data, v.explanation.players or []
    spans = [(p.start, p.end, i) for i, p in enumerate(players)]
    if isinstance(text, str) and all(text[s:e] == players[i].text for s, e, i in spans):
        out: list[tuple[str, float | None]] = []
        at = 0
        for start, end, i in sorted(spans):
            if start < at:  # overlapping spans: the first one wins
                continue
            if start > at:
                out.append((text[at:start], None))
            out.append((text[start:end], float(v.values[i])))
            at = end
        if at < len(text):
            out.append((text[at:], None))
        return out
    pieces: list[tuple[str, float | None]] = []
    for name, value in zip(v.names, v.values, strict=True):
        pieces += [(name, float(value)), (" ", None)]
    return pieces[:-1]


def _text_figure(v: View) -> Any:
    """Every character in reading order, players on a background coloured by their value
    (monospace layout), and a colour bar."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    width = 88  # characters per line at 10 pt on 8 inches
    lines: list[list[tuple[int, str, float | None]]] = [[]]
    col = 0
    for piece, value in segments(v):
        words = [piece] if value is not None else piece.replace("\n", " ").split(" ")
        for k, word in enumerate(words):
            if k:  # the space between two words of a gap
                col += 1
            if col + len(word) > width and lines[-1]:
                lines.append([])
                col = 0
            if word:
                lines[-1].append((col, word, value))
            col += len(word)
    height = 0.4 * len(lines) + 1.4
    fig = Figure(figsize=(8, height))
    ax = fig.add_axes((0.02, 0.85 / height, 0.96, 1 - 1.3 / height))
    ax.set_xlim(0, 96)
    ax.set_ylim(len(lines) - 0.5, -0.5)
    ax.axis("off")
    limit = float(np.abs(v.values).max()) or 1.0
    norm, cmap = TwoSlopeNorm(0, vmin=-limit, vmax=limit), colormaps["bwr"]
    for row, items in enumerate(lines):
        for col, piece, value in items:
            box, ink = None, "black"
            if value is not None:
                box = {"facecolor": cmap(norm(value)), "edgecolor": "none", "pad": 1.5}
                ink = "white" if abs(float(norm(value)) - 0.5) > 0.33 else "black"
            ax.text(col, row, piece, family="monospace", va="center", bbox=box, color=ink)
    legend = fig.add_axes((0.3, 0.35 / height, 0.4, 0.13 / height))
    bar = fig.colorbar(ScalarMappable(norm, cmap), cax=legend, orientation="horizontal")
    bar.set_label("attribution: red raises the output, blue lowers it", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    return fig


def image_bytes(
    body: ExplainResponse,
    fmt: str,
    kind: str,
    index: int,
    max_features: int,
    classes: Classes = None,
    channels: str = "sum",
    value_range: Range = None,
) -> bytes:
    buf = io.BytesIO()
    fig = figure(body, kind, index, max_features, classes, channels, value_range)
    try:
        fig.savefig(buf, format=fmt, dpi=100, metadata={"Date": None} if fmt == "svg" else None)
    except (ValueError, OverflowError) as exc:  # e.g. values too large to lay out
        raise InvalidInput(f"cannot draw this explanation: {exc}") from None
    return buf.getvalue()
