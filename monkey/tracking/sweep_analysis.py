"""Sweep analysis: which parameters matter, the best run, and progress over time; drawn as
inline SVG (parallel coordinates, a scatter per parameter, a best-so-far curve) for
`monkey report`, and as numbers for `sweep status`.

Importance method ("variance split", a one-way fANOVA): for each parameter, the share of
the metric's variance explained by grouping the runs on that parameter's values
(eta squared = between-group sum of squares / total sum of squares). Numeric parameters with
more than ``BINS`` distinct values (random search) are grouped into ``BINS`` quantile bins
first. Each share is in [0, 1]; interactions between parameters are not credited to either.
A parameter is ranked only when its groups hold two runs each on average (``REPEATS``): with
no repeated value every run is its own group and the share is 1.0 whatever the parameter
does, so such parameters are listed as unranked with the number of runs that would do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from monkey.tracking.charts import nice_ticks, tick_label, value_colour

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

METHOD = "variance split (one-way fANOVA, eta squared per parameter)"
BINS = 5
REPEATS = 2
BEST = "#d62728"


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def groups(values: Sequence[Any]) -> list[str]:
    """A group key per run: the value itself, or its quantile bin for many numeric values."""
    if _numeric(values) and len(set(values)) > BINS:
        order = sorted(values)
        edges = [order[min(len(order) - 1, len(order) * k // BINS)] for k in range(1, BINS)]
        return [str(sum(v >= e for e in edges)) for v in values]
    return [repr(v) for v in values]


def runs_needed(values: Sequence[Any]) -> int:
    """How many runs it takes to rank a parameter with these VALUES (one per run): two per
    group of runs sharing a value (per quantile bin for a numeric one that never repeats)."""
    distinct = len(set(map(repr, values)))
    if _numeric(values) and (distinct > BINS or distinct == len(values)):
        return REPEATS * BINS
    return REPEATS * distinct


def constants(params: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Parameter -> its value, for those every run has with one value (`epochs` a script
    logs with log_params): nothing to rank."""
    names = list(dict.fromkeys(k for p in params for k in p))
    out = {}
    for name in names:
        values = [repr(p[name]) if name in p else None for p in params]
        if len(params) > 1 and None not in values and len(set(values)) == 1:
            out[name] = params[0][name]
    return out


def unranked(params: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Parameter -> runs needed, for the parameters too few runs repeat to rank (constants
    left out)."""
    fixed = constants(params)
    names = [k for k in dict.fromkeys(k for p in params for k in p) if k not in fixed]
    out = {}
    for name in names:
        values = [p.get(name) for p in params]
        if len(values) < REPEATS * len(set(groups(values))):
            out[name] = max(runs_needed(values), len(values) + 1)
    return out


def importance(params: Sequence[dict[str, Any]], metric: Sequence[float]) -> dict[str, float]:
    """Parameter -> share of the metric's variance its values explain, highest first; only
    parameters whose values repeat enough to be ranked (see ``unranked``)."""
    n = len(metric)
    mean = sum(metric) / n if n else 0.0
    total = sum((v - mean) ** 2 for v in metric)
    skip = {**unranked(params), **constants(params)}
    names = [k for k in dict.fromkeys(k for p in params for k in p) if k not in skip]
    out = {}
    for name in names:
        keys = groups([p.get(name) for p in params])
        sums: dict[str, list[float]] = {}
        for key, v in zip(keys, metric):
            sums.setdefault(key, []).append(v)
        between = sum(len(vs) * (sum(vs) / len(vs) - mean) ** 2 for vs in sums.values())
        out[name] = between / total if total > 0 else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def best_so_far(runs: Sequence[tuple[float, float]], goal: str) -> list[tuple[float, float]]:
    """(time a run ended, its value) in end order -> the best value reached by each time."""
    out: list[tuple[float, float]] = []
    for t, v in sorted(runs):
        best = v if not out else (max if goal == "max" else min)(out[-1][1], v)
        out.append((t, best))
    return out


def analyse(runs: Sequence[dict[str, Any]], goal: str) -> dict[str, Any]:
    """RUNS [{job, params, value, ended}] with a value -> importance, the parameters too few
    runs repeat to rank (-> runs needed), those with one value (constants), best run, best
    so far."""
    scored = [r for r in runs if r.get("value") is not None and math.isfinite(r["value"])]
    if not scored:
        return {
            "method": METHOD,
            "importance": {},
            "unranked": {},
            "constants": {},
            "best": None,
            "best_so_far": [],
        }
    pick = max if goal == "max" else min
    best = pick(scored, key=lambda r: r["value"])
    return {
        "method": METHOD,
        "importance": importance([r["params"] for r in scored], [r["value"] for r in scored]),
        "unranked": unranked([r["params"] for r in scored]),
        "constants": constants([r["params"] for r in scored]),
        "best": best["job"],
        "best_so_far": best_so_far(
            [(r["ended"], r["value"]) for r in scored if r.get("ended") is not None], goal
        ),
    }


# -- drawing ----------------------------------------------------------------------------


def scale(values: Sequence[Any]) -> tuple[list[float], list[tuple[float, str]]]:
    """Values -> positions in [0, 1] and (position, label) ticks; categories evenly spaced."""
    if _numeric(values):
        ticks = nice_ticks(min(values), max(values))
        lo, hi = ticks[0], ticks[-1]
        step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
        span = (hi - lo) or 1.0
        return (
            [(v - lo) / span for v in values],
            [((t - lo) / span, tick_label(t, step)) for t in ticks],
        )
    cats = list(dict.fromkeys(repr(v) for v in values))
    pos = {c: (i + 0.5) / len(cats) for i, c in enumerate(cats)}
    return [pos[repr(v)] for v in values], [(pos[c], c.strip("'")) for c in cats]


def parallel_axes(
    runs: Sequence[dict[str, Any]], metric: str
) -> tuple[list[str], list[tuple[list[float], list[tuple[float, str]]]]]:
    """The axes of parallel coordinates, each parameter then the metric, and per axis each
    run's position in [0, 1] with the axis's ticks (as ``scale``)."""
    names = list(dict.fromkeys(k for r in runs for k in r["params"]))
    columns = [[r["params"].get(n) for r in runs] for n in names] + [[r["value"] for r in runs]]
    return [*names, metric], [scale(col) for col in columns]


def best_last(runs: Sequence[dict[str, Any]], best: str | None) -> list[int]:
    """Indexes of RUNS with the best run's last, so it is drawn over the others."""
    return sorted(range(len(runs)), key=lambda i: runs[i]["job"] == best)


def metric_colours(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Each run's colour on the sequential scale of the metric's values."""
    values = [r["value"] for r in runs]
    lo, hi = min(values, default=0.0), max(values, default=0.0)
    return [value_colour((v - lo) / ((hi - lo) or 1)) for v in values]


def parallel_coordinates(
    runs: Sequence[dict[str, Any]],
    metric: str,
    best: str | None,
    width: int = 1200,
    height: int = 360,
) -> str:
    """One vertical axis per parameter and one for the metric; a line per run, coloured by
    its metric value; the best run drawn last, thick, in red."""
    axes, scaled = parallel_axes(runs, metric)
    top, bottom, left, right = 30, 30, 60, 60
    gap = (width - left - right) / max(1, len(axes) - 1)
    ph = height - top - bottom
    parts = [
        f'<svg class="parallel" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif">'
    ]
    colours = metric_colours(runs)
    for i in best_last(runs, best):
        is_best = runs[i]["job"] == best
        colour = BEST if is_best else colours[i]
        points = " ".join(
            f"{left + k * gap:.1f},{top + ph - scaled[k][0][i] * ph:.1f}" for k in range(len(axes))
        )
        parts.append(
            f'<polyline class="run{" best" if is_best else ""}" fill="none" '
            f'stroke="{colour}" stroke-width="{3 if is_best else 1.2}" '
            f'stroke-opacity="{1 if is_best else 0.7}" points="{points}">'
            f"<title>{escape(runs[i]['job'])}</title></polyline>"
        )
    for k, name in enumerate(axes):
        x = left + k * gap
        parts.append(
            f'<g class="axis"><line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" '
            f'y2="{top + ph}" stroke="#333"/><text class="axis-name" x="{x:.1f}" '
            f'y="{top - 10}" font-size="12" text-anchor="middle" font-weight="bold">'
            f"{escape(name)}</text>"
        )
        for pos, label in scaled[k][1]:
            parts.append(
                f'<text class="tick" x="{x - 5:.1f}" y="{top + ph - pos * ph + 4:.1f}" '
                f'font-size="10" text-anchor="end">{escape(label)}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _frame(
    title: str, xlabel: str, xs: Sequence[Any], ys: Sequence[float], width: int, height: int
) -> tuple[list[str], Any, Any]:
    """An SVG with axes and ticks for XS (numbers or categories) and YS; returns its opening
    parts and the functions placing an x and a y value."""
    left, right, top, bottom = 56, 12, 24, 36
    pw, ph = width - left - right, height - top - bottom
    xpos, xticks = scale(list(xs))
    ypos, yticks = scale(list(ys))
    parts = [
        f'<svg class="scatter" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {width} {height}" font-family="system-ui,sans-serif">'
        f'<text x="{left}" y="15" font-size="12" font-weight="bold">{escape(title)}</text>'
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>'
    ]
    for pos, label in xticks:
        parts.append(
            f'<text class="xtick" x="{left + pos * pw:.1f}" y="{top + ph + 14}" '
            f'font-size="10" text-anchor="middle">{escape(label)}</text>'
        )
    for pos, label in yticks:
        parts.append(
            f'<text class="ytick" x="{left - 5}" y="{top + ph - pos * ph + 4:.1f}" '
            f'font-size="10" text-anchor="end">{escape(label)}</text>'
        )
    parts.append(
        f'<text x="{left + pw / 2}" y="{height - 4}" font-size="11" '
        f'text-anchor="middle">{escape(xlabel)}</text>'
    )
    return (parts, lambda i: left + xpos[i] * pw, lambda i: top + ph - ypos[i] * ph)


def scatter(
    runs: Sequence[dict[str, Any]],
    param: str,
    metric: str,
    best: str | None,
    width: int = 380,
    height: int = 260,
) -> str:
    """The metric against one parameter, a dot per run; the best run's dot red and larger."""
    runs = [r for r in runs if param in r["params"]]
    parts, px, py = _frame(
        f"{metric} by {param}",
        param,
        [r["params"][param] for r in runs],
        [r["value"] for r in runs],
        width,
        height,
    )
    for i, r in enumerate(runs):
        is_best = r["job"] == best
        parts.append(
            f'<circle class="dot{" best" if is_best else ""}" cx="{px(i):.1f}" '
            f'cy="{py(i):.1f}" r="{6 if is_best else 4}" '
            f'fill="{BEST if is_best else "#1f77b4"}" fill-opacity="0.8">'
            f"<title>{escape(r['job'])}: {r['value']:.4g}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def minutes(curve: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """A best-so-far curve as minutes since the first run ended, and the best values."""
    t0 = curve[0][0] if curve else 0.0
    return [(t - t0) / 60 for t, _ in curve], [v for _, v in curve]


def progress(
    curve: Sequence[tuple[float, float]], metric: str, width: int = 760, height: int = 260
) -> str:
    """The best value so far against minutes since the first run ended (a step line)."""
    if not curve:
        return ""
    xs, ys = minutes(curve)
    parts, px, py = _frame(f"best {metric} so far", "minutes", xs, ys, width, height)
    steps = []
    for i in range(len(curve)):
        if i:
            steps.append(f"{px(i):.1f},{py(i - 1):.1f}")
        steps.append(f"{px(i):.1f},{py(i):.1f}")
    parts.append(
        f'<polyline class="best-so-far" fill="none" stroke="{BEST}" stroke-width="2" '
        f'points="{" ".join(steps)}"/></svg>'
    )
    return "".join(parts)


def too_few(analysis: dict[str, Any]) -> str:
    """The sentence saying which parameters cannot be ranked yet and how many runs would do;
    empty when every parameter is ranked."""
    skip = analysis.get("unranked") or {}
    if not skip:
        return ""
    n = len(analysis.get("runs") or []) or None
    needed = max(skip.values())
    which = "parameters" if not analysis["importance"] else ", ".join(skip)
    have = f"{n} runs with a value, " if n else ""
    return (
        f"too few runs to rank {which} ({have}their values need repeats); "
        f"about {needed} runs would do"
    )
