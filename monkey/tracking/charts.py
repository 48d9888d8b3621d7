"""The chart model shared by the dashboard, PNG and HTML charts: colours, run labels, ticks,
smoothing. Pure functions, no drawing library.

- `colours(n)`: a palette distinct for 20 runs, adjacent entries far apart in hue and
  lightness; past 20 it repeats, never with two equal neighbours.
- `run_labels(params)`: names runs by the parameters that differ across them
  (``lr=0.03 layers=4``), not by job id.
- `nice_ticks(lo, hi)`: 1-2-5 steps covering the data (integers for steps), and
  `log_ticks` for a log scale.
- `ema(values, weight)`: exponential moving average, debiased as W&B's smoothing slider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# 20 colours (Tableau 20's hues, reordered so neighbours differ in hue and lightness).
PALETTE_20 = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)


def colours(n: int) -> list[str]:
    """``n`` colours, the first 20 all distinct; no two neighbours equal for any ``n``."""
    return [PALETTE_20[i % len(PALETTE_20)] for i in range(n)]


def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` as a tuple (plotext takes colours so)."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def run_labels(params: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Run id -> a label naming the parameters whose values differ across the runs,
    e.g. ``lr=0.03 layers=4``; the run id when none differ (or it has none)."""
    given = [p for p in params.values() if p]  # runs outside the sweep do not count
    names = list(dict.fromkeys(k for p in given for k in p))  # in the order logged
    differ = [k for k in names if len({repr(p.get(k)) for p in given}) > 1]
    out = {}
    for run, p in params.items():
        shown = [f"{k}={_short(p[k])}" for k in differ if k in p]
        out[run] = " ".join(shown) if shown else run
    if len(set(out.values())) < len(out):  # same parameters: tell them apart by id
        out = {run: f"{label} ({run})" if label != run else run for run, label in out.items()}
    return out


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def nice_step(span: float, count: int = 5) -> float:
    """A 1, 2 or 5 times a power of ten step giving about ``count`` ticks over ``span``."""
    raw = span / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Ticks at round values covering [lo, hi] (the first at or below lo, the last at or
    above hi); whole numbers only when ``integer`` (steps, epochs)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (1 if integer or lo == 0 else abs(lo) * 0.1)
    step = nice_step(hi - lo, count)
    if integer:
        step = max(1.0, round(step))
    first = math.floor(lo / step + 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(round((last - first) / step) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten covering [lo, hi] (both > 0)."""
    if lo <= 0 or hi <= 0:
        raise ValueError("a log scale needs values above 0")
    return [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def tick_label(value: float, step: float) -> str:
    """A tick's text with as many decimals as its step needs (0.05 -> 2, 20 -> 0)."""
    if step >= 1:
        return f"{value:.0f}" if abs(value) < 1e6 else f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with ``weight`` in [0, 1) (0: unsmoothed), debiased at the
    start so the curve does not rise from zero (as W&B and TensorBoard smooth)."""
    if not 0 <= weight < 1:
        raise ValueError("smoothing must be in [0, 1)")
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(last / norm)
    return out


# Viridis at 5 stops: dark to light, readable as an order in print and for colour-blind eyes.
SEQUENTIAL = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")


def value_colour(t: float) -> str:
    """The sequential colour at ``t`` in [0, 1] (colour by a parameter's value, past 20 runs)."""
    t = min(1.0, max(0.0, t)) * (len(SEQUENTIAL) - 1)
    i = min(int(t), len(SEQUENTIAL) - 2)
    a, b = rgb(SEQUENTIAL[i]), rgb(SEQUENTIAL[i + 1])
    f = t - i
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def colour_param(params: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The numeric parameter to colour runs by when they are too many for the palette: the
    one whose values differ most often across them; None when no numeric one differs."""
    counts: dict[str, int] = {}
    for p in params.values():
        for k, v in p.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                counts.setdefault(k, 0)
    for k in counts:
        counts[k] = len({p.get(k) for p in params.values() if k in p})
    best = max(counts, key=lambda k: counts[k], default=None)
    return best if best is not None and counts[best] > 1 else None
