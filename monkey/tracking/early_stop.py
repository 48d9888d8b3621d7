"""Early termination rules over logged metrics: pure functions, no I/O.

A run's curve is its list of metric values in logging order; "step k" is the k-th value
(1-based), so runs that log once per epoch are compared epoch by epoch. Values are
oriented so that larger is better (``goal: min`` negates them) and NaN counts as worst.
"""

from __future__ import annotations

import math
from statistics import median

Curves = dict[str, list[float]]


def oriented(values: list[float | None], goal: str) -> list[float]:
    """Values turned so that larger is better; NaN becomes -inf."""
    sign = -1.0 if goal == "min" else 1.0
    return [-math.inf if v is None or v != v else sign * v for v in values]


def median_stop(
    curves: Curves, running: set[str], min_steps: int = 3, min_runs: int = 3
) -> set[str]:
    """Median stopping rule: stop a running run whose best value up to its latest step k
    is worse than the median, over the other runs that reached k, of their mean value up
    to k (their running average). Needs ``min_runs`` such runs and k >= ``min_steps``."""
    stop = set()
    for juid in running:
        curve = curves.get(juid) or []
        k = len(curve)
        if k < min_steps:
            continue
        others = [
            sum(c[:k]) / k
            for other, c in curves.items()
            if other != juid and len(c) >= k and all(math.isfinite(v) for v in c[:k])
        ]
        if len(others) < min_runs:
            continue
        if max(curve[:k]) < median(others):
            stop.add(juid)
    return stop


def asha_stop(curves: Curves, running: set[str], min_steps: int = 1, eta: int = 3) -> set[str]:
    """Asynchronous successive halving: rungs at steps min_steps * eta**r. A running run
    that has reached a rung goes on only if its value there is in the top 1/eta of the
    values every run recorded at that rung; the first runs at a rung always go on."""
    stop = set()
    longest = max((len(c) for c in curves.values()), default=0)
    rungs = []
    step = min_steps
    while step <= longest:
        rungs.append(step)
        step *= eta
    for juid in running:
        curve = curves.get(juid) or []
        reached = [r for r in rungs if len(curve) >= r]
        if not reached:
            continue
        rung = reached[-1]
        recorded = sorted((c[rung - 1] for c in curves.values() if len(c) >= rung), reverse=True)
        keep = len(recorded) // eta
        if keep >= 1 and curve[rung - 1] < recorded[keep - 1]:
            stop.add(juid)
    return stop
