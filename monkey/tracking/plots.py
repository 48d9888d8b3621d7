"""Charts of metric series: in the terminal (plotext), as PNG (matplotlib, optional) and as
inline SVG (no dependency; used by HTML reports).

A series is [(step, value, wall_time)]; x is the step where one was logged, else the
point's position in logging order (1, 2, ...). NaN values are left out of charts.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from monkey.models import MonkeyError
from monkey.tracking.charts import colours, nice_ticks, tick_label

Series = list[tuple[int | None, float, float]]


def xy(series: Series, x: str = "step") -> tuple[list[float], list[float]]:
    """The points of a series to draw, in x order: x by step (or index), or seconds since its
    start. Steps logged out of order (a resumed run, a late validation) are drawn in order."""
    points = []
    start = series[0][2] if series else 0.0
    for i, (step, value, wall) in enumerate(series, start=1):
        if value is None or math.isnan(value) or math.isinf(value):
            continue
        points.append((wall - start if x == "time" else (step if step is not None else i), value))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def terminal_plot(lines: dict[str, Series], title: str, width: int | None = None,
                  height: int | None = None, x: str = "step", colour: bool = False) -> str:
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
    plt.xlabel("seconds" if x == "time" else "step")
    text = plt.build()
    return text if colour else plt.uncolorize(text)


def png_plot(lines: dict[str, Series], metric: str, out: str | Path, x: str = "step",
             size: tuple[int, int] = (1000, 600)) -> Path:
    """Write a PNG of SIZE pixels comparing the series; returns its path."""
    try:
        import matplotlib
    except ImportError:
        raise MonkeyError("PNG plots need matplotlib: pip install 'monkey[plot]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    dpi = 100
    fig, ax = plt.subplots(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    try:
        for colour, (label, series) in zip(colours(len(lines)), lines.items()):
            xs, ys = xy(series, x)
            ax.plot(xs, ys, label=label, color=colour,
                    marker="o" if len(xs) <= 30 else None, markersize=3)
        ax.set_xlabel("seconds" if x == "time" else "step")
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize="small")
        path = Path(out)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def svg_chart(lines: dict[str, Series], title: str, width: int = 640, height: int = 320,
              x: str = "step") -> str:
    """A self-contained SVG line chart with axes, ticks and a legend."""
    left, right, top, bottom = 60, 150, 28, 36
    pw, ph = width - left - right, height - top - bottom
    data = {label: xy(s, x) for label, s in lines.items()}
    xs_all = [v for xs, _ in data.values() for v in xs]
    ys_all = [v for _, ys in data.values() for v in ys]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{left}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>']
    if not xs_all:
        parts.append(f'<text x="{left}" y="{top + ph / 2}" font-size="12">no data</text></svg>')
        return "".join(parts)
    xticks = nice_ticks(min(xs_all), max(xs_all), integer=x == "step")
    yticks = nice_ticks(min(ys_all), max(ys_all))
    x0, x1 = xticks[0], xticks[-1]
    y0, y1 = yticks[0], yticks[-1]

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                 'stroke="#999"/>')
    ystep, xstep = yticks[1] - yticks[0], xticks[1] - xticks[0]
    for yv in yticks:
        parts.append(f'<text class="ytick" x="{left - 6}" y="{py(yv) + 4:.1f}" font-size="10" '
                     f'text-anchor="end">{tick_label(yv, ystep)}</text>')
    for xv in xticks:
        parts.append(f'<text class="xtick" x="{px(xv):.1f}" y="{top + ph + 14}" font-size="10" '
                     f'text-anchor="middle">{tick_label(xv, xstep)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 4}" font-size="11" '
                 f'text-anchor="middle">{"seconds" if x == "time" else "step"}</text>')
    for i, (colour, (label, (xs, ys))) in enumerate(zip(colours(len(data)), data.items())):
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(xs, ys))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{points}"><title>{escape(label)}</title></polyline>')
        ly = top + 12 + 16 * i
        parts.append(f'<line x1="{left + pw + 10}" y1="{ly - 4}" x2="{left + pw + 26}" '
                     f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text class="legend" x="{left + pw + 30}" y="{ly}" font-size="11">'
                     f'{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
