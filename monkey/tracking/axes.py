"""A job page's chart axes: x by step, epoch or wall time since the run's start. Pure
functions; the series are cut down where they are read (monkey.tracking.series)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator

XS = ("step", "epoch", "time")
EPOCH = "epoch"  # the metric whose values, logged with steps, map steps to epochs


def epoch_mapper(
    points: Iterable[tuple[int | None, float | None]],
) -> Callable[[float], float] | None:
    """From the (step, epoch) POINTS of the ``epoch`` metric, a step -> epoch function:
    linear between two logged points (step 150 between (100, 1) and (200, 2) is epoch
    1.5), the first epoch before the first point, the last after the last. None when no
    point has both a step and a finite epoch."""
    known: dict[float, float] = {}
    for step, epoch in points:
        if step is not None and epoch is not None and epoch == epoch and abs(epoch) != float("inf"):
            known[float(step)] = float(epoch)  # a step logged twice: its last epoch
    if not known:
        return None
    steps = sorted(known)
    epochs = [known[s] for s in steps]

    def at(step: float) -> float:
        i = bisect.bisect_right(steps, step)
        if i == 0:
            return epochs[0]
        if i == len(steps):
            return epochs[-1]
        s0, s1 = steps[i - 1], steps[i]
        return epochs[i - 1] + (epochs[i] - epochs[i - 1]) * (step - s0) / (s1 - s0)

    return at


def xs(
    rows: Iterable[tuple[int | None, float | None, float]],
    by: str,
    start: float,
    epoch: Callable[[float], float] | None = None,
) -> Iterator[tuple[float, float | None]]:
    """(x, value) of a series' (step, value, wall) ROWS: x the step, the EPOCH of the
    step, or the seconds since START (the run's start); a point without a step falls back
    to its time since START."""
    for step, value, wall in rows:
        if by == "step" and step is not None:
            yield float(step), value
        elif by == "epoch" and step is not None and epoch is not None:
            yield epoch(float(step)), value
        else:
            yield wall - start, value
