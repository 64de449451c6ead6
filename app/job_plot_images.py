"""PNG and SVG (matplotlib, no pyplot: safe in worker threads) of a finished audit's global
plots (app/job_plots.py): summary bars, beeswarm, dependence; a panel per class for the
beeswarm and dependence plots of an audit over several classes."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

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
from app.plots import NEGATIVE, POSITIVE


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
        shares = class_shares(a, index)
        left = np.zeros(len(labels))
        palette = ["#008bfb", "#ff0052", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e"]
        for k, (name, share) in enumerate(shares.items()):
            if rest:
                rest_share = class_shares(a, others)[name].sum()
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
