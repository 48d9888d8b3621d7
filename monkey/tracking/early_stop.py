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
    """Median stopping rule: stop a running run whose best value up to step k is worse than
    the median, over the other runs that reached k, of their mean value up to k (their
    running average). k is the run's latest step, or the latest step ``min_runs`` other runs
    have reached when it is ahead of them: a run that started first or runs fastest is
    judged too. Needs ``min_runs`` such runs and k >= ``min_steps``."""
    finite = {juid: _finite_length(c) for juid, c in curves.items()}
    stop = set()
    for juid in running:
        curve = curves.get(juid) or []
        lengths = sorted((n for other, n in finite.items() if other != juid), reverse=True)
        if len(lengths) < min_runs:
            continue
        k = min(len(curve), lengths[min_runs - 1])
        if k < min_steps:
            continue
        others = [
            sum(c[:k]) / k for other, c in curves.items() if other != juid and finite[other] >= k
        ]
        if max(curve[:k]) < median(others):
            stop.add(juid)
    return stop


def _finite_length(curve: list[float]) -> int:
    """How many values CURVE has before its first NaN or infinity."""
    return next((i for i, v in enumerate(curve) if not math.isfinite(v)), len(curve))


def asha_stop(curves: Curves, running: set[str], min_steps: int = 1, eta: int = 3) -> set[str]:
    """Asynchronous successive halving: rungs at steps min_steps * eta**r. A running run
    that has reached a rung goes on only if its value there is in the top 1/eta of the
    values every run recorded at that rung; the first runs at a rung always go on, and a run
    ahead of the others is judged at its highest rung that ``eta`` runs have reached."""
    stop = set()
    longest = max((len(c) for c in curves.values()), default=0)
    rungs = []
    step = min_steps
    while step <= longest:
        rungs.append(step)
        step *= eta
    for juid in running:
        curve = curves.get(juid) or []
        for rung in reversed([r for r in rungs if len(curve) >= r]):
            recorded = sorted(
                (c[rung - 1] for c in curves.values() if len(c) >= rung), reverse=True
            )
            keep = len(recorded) // eta
            if keep >= 1:  # judged at its highest rung that enough runs reached
                if curve[rung - 1] < recorded[keep - 1]:
                    stop.add(juid)
                break
    return stop
