"""Charts of metric series: in the terminal (plotext), as PNG (matplotlib, optional) and as
inline SVG (no dependency; used by HTML reports). All use the chart model of
monkey/tracking/charts.py: one y-axis per metric (small multiples for several metrics),
legends outside the data, runs named by what differs, nice ticks, EMA smoothing, log y.

A series is [(step, value, wall_time)]; x is the step where one was logged, else the
point's position in logging order (1, 2, ...); or seconds since the run's start ("time");
or the run's logged ``epoch`` metric at that step ("epoch"). NaN values are left out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from monkey.models import MonkeyError
from monkey.tracking.charts import colours, ema, log_ticks, nice_ticks, tick_label, value_colour

Series = list[tuple[int | None, float, float]]
X_AXES = ("step", "epoch", "time")
X_LABELS = {"step": "step", "epoch": "epoch", "time": "seconds"}


@dataclass
class Style:
    """How to draw: x axis, EMA weight (0: raw), log y, and colour by a parameter's value
    (``by``: run -> value, named ``by_name``; used past 20 runs)."""

    x: str = "step"
    smooth: float = 0.0
    log_y: bool = False
    by: dict[str, float] = field(default_factory=dict)
    by_name: str = ""
    epochs: dict[str, Series] = field(default_factory=dict)  # run -> its "epoch" series


def xy(
    series: Series, x: str = "step", epoch: Series | None = None
) -> tuple[list[float], list[float]]:
    """The points of a series to draw, in x order: x by step (or index), seconds since its
    start, or epoch (the run's ``epoch`` value logged at or before the point's step). Steps
    logged out of order (a resumed run, a late validation) are drawn in order."""
    points = []
    start = series[0][2] if series else 0.0
    marks = sorted((s if s is not None else i, v) for i, (s, v, _) in enumerate(epoch or [], 1))
    steps = [m[0] for m in marks]
    for i, (step, value, wall) in enumerate(series, start=1):
        if value is None or math.isnan(value) or math.isinf(value):
            continue
        at = step if step is not None else i
        if x == "time":
            points.append((wall - start, value))
        elif x == "epoch":
            k = bisect.bisect_right(steps, at) - 1
            if k >= 0:
                points.append((marks[k][1], value))
        else:
            points.append((at, value))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def run_colours(runs: list[str], style: Style) -> dict[str, str]:
    """Run -> colour: the 20-colour palette, or by ``style.by`` values past 20 runs."""
    if len(runs) > 20 and style.by:
        lo, hi = min(style.by.values()), max(style.by.values())
        return {
            r: value_colour((style.by[r] - lo) / (hi - lo) if hi > lo and r in style.by else 0.0)
            for r in runs
        }
    return dict(zip(runs, colours(len(runs))))


def plot_points(
    lines: Mapping[str, Series], style: Style
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Run -> (xs, raw ys, drawn ys): smoothed when asked, positive only on a log scale."""
    out = {}
    for run, series in lines.items():
        xs, ys = xy(series, style.x, style.epochs.get(run))
        if style.log_y:
            keep = [i for i, v in enumerate(ys) if v > 0]
            xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
        out[run] = (xs, ys, ema(ys, style.smooth) if style.smooth else ys)
    return out


def _runs(metrics: Mapping[str, Mapping[str, Series]]) -> list[str]:
    return list(dict.fromkeys(r for lines in metrics.values() for r in lines))


def terminal_plot(
    lines: dict[str, Series],
    title: str,
    width: int | None = None,
    height: int | None = None,
    x: str = "step",
    colour: bool = False,
) -> str:
    """A plotext chart of the series, as text."""
    import plotext as plt

    plt.clear_figure()
    plt.theme("clear")
    if width and height:
        plt.plot_size(width, height)
    for label, series in lines.items():
        xs, ys = xy(series, x)
        if xs:
            plt.plot(xs, ys, label=label if len(lines) > 1 else None, marker="braille")
    plt.title(title)
    plt.xlabel(X_LABELS.get(x, x))
    text = plt.build()
    return text if colour else plt.uncolorize(text)


def png_plot(
    metrics: dict[str, dict[str, Series]],
    out: str | Path,
    style: Style | None = None,
    size: tuple[int, int] = (1000, 600),
) -> Path:
    """Write a PNG (or SVG/PDF by suffix) of SIZE pixels: one panel per metric, each with its
    own y-axis, a legend outside the data naming the runs; returns its path."""
    try:
        import matplotlib
    except ImportError:
        raise MonkeyError(
            "PNG plots need matplotlib: pip install matplotlib (or '.[plot]' in monkey's clone)"
        ) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    style = style or Style()
    runs = _runs(metrics)
    palette = run_colours(runs, style)
    dpi = 100
    n = max(1, len(metrics))
    fig, axes = plt.subplots(
        n,
        1,
        figsize=(size[0] / dpi, size[1] / dpi),
        dpi=dpi,
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    try:
        for ax, (metric, lines) in zip(axes[:, 0], metrics.items()):
            for run, (xs, raw, ys) in plot_points(lines, style).items():
                if style.smooth:
                    ax.plot(xs, raw, color=palette[run], alpha=0.2, linewidth=1)
                ax.plot(
                    xs,
                    ys,
                    label=run,
                    color=palette[run],
                    marker="o" if len(xs) <= 30 else None,
                    markersize=3,
                )
            ax.set_ylabel(metric)
            if style.log_y:
                ax.set_yscale("log")
            if style.x in ("step", "epoch"):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel(X_LABELS[style.x])
        if len(runs) > 20 and style.by:
            from matplotlib.colors import LinearSegmentedColormap, Normalize

            from monkey.tracking.charts import SEQUENTIAL

            cmap = LinearSegmentedColormap.from_list("monkey", SEQUENTIAL)
            values = list(style.by.values())
            mappable = plt.cm.ScalarMappable(Normalize(min(values), max(values)), cmap)
            fig.colorbar(mappable, ax=axes[:, 0].tolist(), label=style.by_name)
        elif runs:
            fig.legend(
                *axes[0, 0].get_legend_handles_labels(), loc="outside right upper", fontsize="small"
            )
        path = Path(out)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def axis(lo: float, hi: float, integer: bool, log: bool) -> tuple[list[float], list[str]]:
    """Ticks and their labels for data in [lo, hi]."""
    if log:
        ticks = log_ticks(lo, hi)
        return ticks, [f"{t:g}" for t in ticks]
    ticks = nice_ticks(lo, hi, integer=integer)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    return ticks, [tick_label(t, step) for t in ticks]


def svg_panel(
    lines: Mapping[str, Series],
    title: str,
    palette: Mapping[str, str],
    style: Style,
    box: tuple[float, float, float, float],
) -> str:
    """One metric's panel (its own axes and ticks) inside BOX = (left, top, width, height)."""
    bx, by, bw, bh = box
    left, top = bx + 56, by + 22
    pw, ph = bw - 56 - 10, bh - 22 - 34
    data = plot_points(lines, style)
    xs_all = [v for xs, _, _ in data.values() for v in xs]
    ys_all = [v for _, raw, ys in data.values() for v in (*raw, *ys)]
    parts = [
        f'<g class="panel" data-metric="{escape(title)}">',
        f'<text class="title" x="{left}" y="{by + 14}" font-size="13" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    if not xs_all:
        why = "no values above 0 for a log scale" if style.log_y else "no data"
        parts.append(f'<text x="{left}" y="{top + ph / 2}" font-size="12">{why}</text></g>')
        return "".join(parts)
    xticks, xtext = axis(min(xs_all), max(xs_all), style.x in ("step", "epoch"), False)
    yticks, ytext = axis(min(ys_all), max(ys_all), False, style.log_y)
    fy = math.log10 if style.log_y else float
    x0, x1, y0, y1 = xticks[0], xticks[-1], fy(yticks[0]), fy(yticks[-1])

    def px(v: float) -> float:
        return left + (v - x0) / ((x1 - x0) or 1) * pw

    def py(v: float) -> float:
        return top + ph - (fy(v) - y0) / ((y1 - y0) or 1) * ph

    parts.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>'
    )
    for yv, text in zip(yticks, ytext):
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(yv):.1f}" y2="{py(yv):.1f}" '
            'stroke="#eee"/>'
            f'<text class="ytick" x="{left - 6}" y="{py(yv) + 4:.1f}" font-size="10" '
            f'text-anchor="end">{text}</text>'
        )
    for xv, text in zip(xticks, xtext):
        parts.append(
            f'<text class="xtick" x="{px(xv):.1f}" y="{top + ph + 14}" font-size="10" '
            f'text-anchor="middle">{text}</text>'
        )
    parts.append(
        f'<text class="xlabel" x="{left + pw / 2}" y="{top + ph + 30}" font-size="11" '
        f'text-anchor="middle">{X_LABELS[style.x]}</text>'
    )
    for run, (xs, raw, ys) in data.items():
        if style.smooth:
            points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(xs, raw))
            parts.append(
                f'<polyline class="raw" fill="none" stroke="{palette[run]}" '
                f'stroke-opacity="0.25" points="{points}"/>'
            )
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(xs, ys))
        parts.append(
            f'<polyline class="line" fill="none" stroke="{palette[run]}" '
            f'stroke-width="1.5" points="{points}"><title>{escape(run)}</title>'
            "</polyline>"
        )
        if len(xs) == 1:  # a lone point draws no line: mark it
            parts.append(
                f'<circle class="point" cx="{px(xs[0]):.1f}" cy="{py(ys[0]):.1f}" '
                f'r="4" fill="{palette[run]}"><title>{escape(run)}: {ys[0]:.4g}'
                "</title></circle>"
            )
    parts.append("</g>")
    return "".join(parts)


def svg_charts(
    metrics: Mapping[str, Mapping[str, Series]],
    style: Style | None = None,
    width: int = 1200,
    panel_height: int = 300,
) -> str:
    """A self-contained SVG: one panel per metric (two columns when several), and one legend
    outside the data naming each run (or a colour bar past 20 runs coloured by a parameter).
    It scales to the width of its container (``width="100%"`` over a viewBox)."""
    style = style or Style()
    runs = _runs(metrics)
    palette = run_colours(runs, style)
    legend_w = 220
    cols = 1 if len(metrics) <= 1 else 2
    rows = max(1, math.ceil(len(metrics) / cols))
    pw = (width - legend_w) / cols
    legend_h = 20 + 16 * len(runs) + (60 if len(runs) > 20 and style.by else 0)
    height = max(rows * panel_height, legend_h)
    title = ", ".join(metrics) or "no metrics"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 {width} '
        f'{height}" font-family="system-ui,sans-serif" role="img" '
        f'aria-label="{escape(title)}">'
    ]
    for i, (metric, lines) in enumerate(metrics.items()):
        box = ((i % cols) * pw, (i // cols) * panel_height, pw, panel_height)
        parts.append(svg_panel(lines, metric, palette, style, box))
    lx = width - legend_w + 10
    parts.append('<g class="legend-box">')
    y = 20
    if len(runs) > 20 and style.by:
        parts.append(_colour_bar(lx, y, style))
        y += 60
    for run in runs:
        parts.append(
            f'<line x1="{lx}" y1="{y - 4}" x2="{lx + 16}" y2="{y - 4}" '
            f'stroke="{palette[run]}" stroke-width="3"/>'
            f'<text class="legend" x="{lx + 20}" y="{y}" font-size="11">'
            f"{escape(run)}</text>"
        )
        y += 16
    parts.append("</g></svg>")
    return "".join(parts)


def single_valued(lines: Mapping[str, Series]) -> bool:
    """Whether no run has more than one value of the metric (e.g. a final test accuracy)."""
    return all(len(xy(series)[0]) <= 1 for series in lines.values())


def svg_values(
    metrics: Mapping[str, Mapping[str, Series]], palette: Mapping[str, str], width: int = 1200
) -> str:
    """Metrics logged once per run as one bar per run, its value written beside it (a line
    chart of one point per run would be an empty axis). Bars start at zero."""
    label_w, value_w, row_h = 380, 90, 18
    fits = (label_w - 12) // 7  # characters of a run's name that fit beside its bar
    bar_w = width - label_w - value_w - 20
    parts, y = [], 0
    for metric, lines in metrics.items():
        values = {run: xy(series)[1][0] for run, series in lines.items() if xy(series)[1]}
        lo, hi = min([0.0, *values.values()]), max([0.0, *values.values()])
        span = (hi - lo) or 1.0
        zero = label_w + (0 - lo) / span * bar_w
        parts.append(
            f'<g class="values" data-metric="{escape(metric)}">'
            f'<text class="title" x="0" y="{y + 16}" font-size="13" '
            f'font-weight="bold">{escape(metric)}</text>'
        )
        y += 24
        if not values:
            parts.append(f'<text x="0" y="{y + 12}" font-size="12">no data</text>')
            y += row_h
        for run, value in values.items():
            end = label_w + (value - lo) / span * bar_w
            left, w = min(zero, end), max(1.0, abs(end - zero))
            shown = run if len(run) <= fits else run[: fits - 1] + "…"
            parts.append(
                f'<text class="run" x="0" y="{y + 12}" font-size="11">'
                f"<title>{escape(run)}</title>{escape(shown)}</text>"
                f'<rect class="bar" x="{left:.1f}" y="{y + 2}" width="{w:.1f}" '
                f'height="{row_h - 6}" fill="{palette.get(run, "#1f77b4")}"/>'
                f'<text class="value" x="{max(zero, end) + 6:.1f}" y="{y + 12}" '
                f'font-size="11">{value:.4g}</text>'
            )
            y += row_h
        parts.append("</g>")
        y += 12
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 {width} {y}" '
        f'font-family="system-ui,sans-serif" role="img" '
        f'aria-label="{escape(", ".join(metrics))}">{"".join(parts)}</svg>'
    )


def _colour_bar(x: float, y: float, style: Style) -> str:
    """A horizontal gradient from the lowest to the highest value of ``style.by``."""
    lo, hi = min(style.by.values()), max(style.by.values())
    stops = "".join(
        f'<stop offset="{i / 10}" stop-color="{value_colour(i / 10)}"/>' for i in range(11)
    )
    return (
        f'<g class="colour-bar"><defs><linearGradient id="bar">{stops}</linearGradient>'
        f'</defs><text x="{x}" y="{y}" font-size="11">colour: {escape(style.by_name)}</text>'
        f'<rect x="{x}" y="{y + 6}" width="180" height="12" fill="url(#bar)"/>'
        f'<text x="{x}" y="{y + 32}" font-size="10">{lo:.4g}</text>'
        f'<text x="{x + 180}" y="{y + 32}" font-size="10" text-anchor="end">{hi:.4g}</text>'
        "</g>"
    )


def svg_chart(lines: dict[str, Series], title: str, x: str = "step") -> str:
    """One metric's chart (``svg_charts`` with a single panel)."""
    return svg_charts({title: lines}, Style(x=x))
