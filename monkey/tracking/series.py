"""A job's metric series as its charts ask for them: the whole, the window a zoom shows
(``lo`` to ``hi`` on the x axis), or the points logged since the page's last; each cut
down to what WIDTH pixels show: a pixel's lowest and highest point, so a spike one point
wide stays visible.

Reading a long series costs about a second per million points, so each series is read
once into a ``Summary``: its points per BLOCK rowids, with each block's lowest and highest
step, time and value. Summaries are cached by job, metric and the last rowid they cover
(a finished job's is read once; a running job's grows by its new blocks only). A window
of at most RAW points is read from the store (a range of the series' index) and cut down
exactly; a larger one, and the whole, from the blocks."""

from __future__ import annotations

import bisect
import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from monkey.models import MonkeyError
from monkey.tracking import axes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store import Store

BLOCK = 32  # rowids per block of a summary
RAW = 50_000  # points of a window read one by one at most (about 0.1 s); more: by blocks
CACHED = 20_000_000  # points summarised in the cache at most (a few MB per million)
NAN = math.nan
# A summary's columns, one value per block.
KEY, FIRST, LAST, COUNT, STEPS, STEP_LO, STEP_HI, WALL_LO, WALL_HI, LOW, HIGH = range(11)

Points = tuple[list[float], list[float | None]]


@dataclass(frozen=True)
class Summary:
    """Series SERIES' points FIRST..LAST (rowids) in blocks: COLS (each an array, one
    value per block, NaN for none); POINTS of them, STEPS with a step."""

    series: int
    first: int
    last: int
    cols: tuple[array[float], ...]
    points: int
    steps: int

    def grown(self, store: Store, ends: tuple[int, int]) -> Summary:
        """This summary as of ENDS' last rowid: the blocks from the one of its last point
        (or of ENDS' last, when that is older: another request saw a newer state) read
        again, the others kept (the same summary when nothing changed)."""
        if ends[1] == self.last:
            return self
        cut = min(self.last, ends[1]) // BLOCK if self.last >= 0 else 0
        kept = bisect.bisect_left(self.cols[KEY], cut)
        cols = tuple(c[:kept] for c in self.cols)
        for row in store.metric_blocks(self.series, cut * BLOCK, BLOCK):
            for c, v in zip(cols, row):
                c.append(NAN if v is None else v)
        points, steps = int(sum(cols[COUNT])), int(sum(cols[STEPS]))
        return Summary(self.series, self.first, ends[1], cols, points, steps)

    @classmethod
    def read(cls, store: Store, series: int, ends: tuple[int, int]) -> Summary:
        empty = cls(series, ends[0], -1, tuple(array("d") for _ in range(11)), 0, 0)
        return empty.grown(store, ends)

    def by(self, wanted: str, epoch: Callable[[float], float] | None) -> str:
        """The x axis this series is drawn by: WANTED when every point has a step (epoch:
        when there is an EPOCH mapping, else the step), else the time."""
        if self.steps != self.points:
            return "time"
        return "step" if wanted == "epoch" and epoch is None else wanted

    def spans(
        self, by: str, start: float, epoch: Callable[[float], float] | None
    ) -> tuple[list[float], list[float]]:
        """Each block's lowest and highest x, by BY (see ``axes.xs``)."""
        c = self.cols
        if by == "time":
            return [w - start for w in c[WALL_LO]], [w - start for w in c[WALL_HI]]
        if by == "epoch" and epoch is not None:
            a, b = [epoch(s) for s in c[STEP_LO]], [epoch(s) for s in c[STEP_HI]]
            return [min(p) for p in zip(a, b)], [max(p) for p in zip(a, b)]
        return list(c[STEP_LO]), list(c[STEP_HI])


class SeriesCache:
    """Summaries by (job, metric name), the least recently used dropped beyond MOST
    points; safe across threads (a series is read by one of them at a time)."""

    def __init__(self, most: int = CACHED) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], Summary] = OrderedDict()
        self._reading: dict[tuple[str, str], threading.Lock] = {}

    def summary(self, store: Store, juid: str, name: str, series: int) -> Summary | None:
        """Series NAME (id SERIES) of job JUID as it is now, or None when it has no point."""
        key = (juid, name)
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:  # two requests for a new series: one reads it, the other waits
            ends = store.metric_ends(series)
            with self._lock:
                old = self._items.get(key)
            if ends is None:
                return None
            if old is None or old.series != series or old.first != ends[0]:
                now = Summary.read(store, series, ends)
            else:
                now = old.grown(store, ends)
            with self._lock:
                older = old is not None and old.last > now.last and old.first == now.first
                self._items[key] = old if older and old is not None else now  # never back
                self._items.move_to_end(key)
                total = sum(s.points for s in self._items.values())
                while total > self.most and len(self._items) > 1:
                    gone, dropped = self._items.popitem(last=False)
                    self._reading.pop(gone, None)
                    total -= dropped.points
            return now


def job_series(
    store: Store,
    cache: SeriesCache,
    juid: str,
    width: int = 1000,
    by: str = "step",
    window: tuple[float, float] | None = None,
    since: int | None = None,
    names: list[str] | None = None,
) -> dict[str, Any]:
    """Metric name -> {"x", "y", "points", "by", "last"} of job JUID's series (NAMES, or
    all): the whole (or the WINDOW (lo, hi) on the x axis, with the nearest point on each
    side) cut down to WIDTH pixels (``decimate``), or with SINCE (a rowid) only the points
    logged after it, cut down as the page draws them (WIDTH pixels across the WINDOW shown,
    else across the whole); "points": how many it has in all, "last": the rowid of its
    last (the page's next SINCE); values with 7 significant digits. x BY "step" (when every point has one, else the time), "epoch"
    (steps mapped through the logged ``epoch`` metric, else the step) or "time" (seconds
    since the run started)."""
    if by not in axes.XS:
        raise MonkeyError(f"x by {by!r}: use one of {', '.join(axes.XS)}")
    with store.reading():  # one state of the store: "last" is where every series stands
        return _series(store, cache, juid, width, by, window, since, names)


def _series(
    store: Store,
    cache: SeriesCache,
    juid: str,
    width: int,
    by: str,
    window: tuple[float, float] | None,
    since: int | None,
    names: list[str] | None,
) -> dict[str, Any]:
    ids = store.metric_series_ids(juid)
    epoch = None
    if by == "epoch" and axes.EPOCH in ids:
        rows = store.metric_window(ids[axes.EPOCH], -1)
        epoch = axes.epoch_mapper((s, v) for _, s, v, _ in rows)
    job = store.get_job(juid)
    began = [t for t in (job and job.started_at, store.metric_first_wall(juid)) if t]
    start = min(began, default=0.0)  # the run's start, or its first point if a retry began later
    out: dict[str, Any] = {}
    for name, sid in ids.items():
        if names and name not in names:
            continue
        s = cache.summary(store, juid, name, sid)
        if s is None:
            continue
        shown = s.by(by, epoch)
        if since is not None and s.last <= since:
            continue  # nothing new
        if since is not None:
            x, y = _added(store, s, shown, start, epoch, since, window, width)
        else:
            x, y = _drawn(store, s, shown, start, epoch, window, width)
        out[name] = {
            "x": [_short(v, 9) for v in x],
            "y": [_short(v, 7) for v in y],
            "points": s.points,
            "by": shown,
            "last": s.last,
        }
    return out


def _short(v: float | None, digits: int) -> float | None:
    """V with DIGITS significant digits at most (a whole number as an int; infinite as
    None, a gap): what a chart shows, in a few bytes of JSON."""
    if v is None or not math.isfinite(v):
        return None
    if v.is_integer() and abs(v) < 2**53:
        return int(v)
    return float(f"{v:.{digits}g}")


def _added(
    store: Store,
    s: Summary,
    by: str,
    start: float,
    epoch: Callable[[float], float] | None,
    since: int,
    shown: tuple[float, float] | None,
    width: int,
) -> Points:
    """Series S's points logged after rowid SINCE, cut down at the scale the page draws
    them: WIDTH pixels across SHOWN (the x range on screen; None: the whole series)."""
    rows = store.metric_window(s.series, since)
    points = list(axes.xs((r[1:] for r in rows), by, start, epoch))
    if not points:
        return [], []
    if shown is None:
        los, his = s.spans(by, start, epoch)
        shown = (min(los), max(his))
    lo, hi = min(x for x, _ in points), max(x for x, _ in points)
    pixel = (shown[1] - shown[0]) / width
    return decimate(points, lo, hi, max(1, math.ceil((hi - lo) / pixel)) if pixel > 0 else width)


def _drawn(
    store: Store,
    s: Summary,
    by: str,
    start: float,
    epoch: Callable[[float], float] | None,
    window: tuple[float, float] | None,
    width: int,
) -> Points:
    """Series S's points in WINDOW (all: None) cut down to WIDTH pixels: read one by one
    when they are at most RAW, else from its blocks."""
    los, his = s.spans(by, start, epoch)
    blocks = range(len(los))
    if window is not None:  # the blocks it crosses, and one on each side
        lo, hi = window
        crossed = [i for i in blocks if his[i] >= lo and los[i] <= hi]
        if not crossed:  # between two blocks (a gap in x): the points either side
            crossed = [next((i for i in blocks if los[i] > hi), len(los)) - 1]
        blocks = range(max(0, crossed[0] - 1), min(len(los), crossed[-1] + 2))
    if not blocks:
        return [], []
    c = s.cols
    if sum(c[COUNT][i] for i in blocks) <= RAW:
        rows = store.metric_window(s.series, int(c[FIRST][blocks[0]]) - 1, int(c[LAST][blocks[-1]]))
        return _cut(axes.xs((r[1:] for r in rows), by, start, epoch), window, width)

    def ends() -> Iterable[tuple[float, float | None]]:  # each block's lowest and highest
        for i in blocks:  # at its middle; the first and last block at the series' ends
            mid = los[i] if i == 0 else his[i] if i == len(los) - 1 else (los[i] + his[i]) / 2
            yield mid, c[LOW][i]
            if c[HIGH][i] != c[LOW][i]:
                yield mid, c[HIGH][i]

    return _cut(ends(), window, width)


def _cut(
    points: Iterable[tuple[float, float | None]], window: tuple[float, float] | None, width: int
) -> Points:
    """``decimate`` over WINDOW, or over the POINTS' own x range when None."""
    if window is None:
        listed = list(points)
        if not listed:
            return [], []
        xs = [x for x, _ in listed]
        window, points = (min(xs), max(xs)), listed
    return decimate(points, window[0], window[1], width)


def decimate(
    points: Iterable[tuple[float, float | None]], lo: float, hi: float, width: int
) -> Points:
    """What a chart WIDTH pixels wide shows of POINTS (x, y) from x LO to HI: all of them
    (in their order, a missing value as None: a gap) when they are at most 2 * WIDTH,
    else each pixel's lowest and highest (by x; missing values left out); and the nearest
    point on each side of the window, for its lines to reach the edges."""
    inside: list[tuple[float, float | None]] = []
    before: tuple[float, float] | None = None
    after: tuple[float, float] | None = None
    for x, y in points:
        if y is not None and y != y:
            y = None
        if lo <= x <= hi:
            inside.append((x, y))
        elif y is None:
            continue
        elif x < lo:
            if before is None or x >= before[0]:
                before = (x, y)
        elif after is None or x < after[0]:
            after = (x, y)
    if len(inside) > 2 * width:
        scale = width / ((hi - lo) or 1.0)
        low: dict[int, tuple[float, float]] = {}
        high: dict[int, tuple[float, float]] = {}
        for x, y in inside:
            if y is None:
                continue
            p = min(width - 1, int((x - lo) * scale))
            if p not in low or y < low[p][1]:
                low[p] = (x, y)
            if p not in high or y > high[p][1]:
                high[p] = (x, y)
        inside = []
        for p in sorted(low):
            inside.extend(sorted({low[p], high[p]}))
    kept = ([before] if before else []) + inside + ([after] if after else [])
    return [x for x, _ in kept], [y for _, y in kept]
