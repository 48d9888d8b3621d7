"""One table of runs: parameters (flattened), summaries, and final/best metric values."""

from __future__ import annotations

import math
import re

from monkey.models import Job
from monkey.store import Store
from monkey.tracking.ingest import flatten

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_LOWER_IS_BETTER = re.compile(r"loss|err|perplex|mse|mae|rmse|nll|time|latency", re.I)
FIXED = ("job", "name", "state")


def goal_of(metric: str, goals: dict[str, str]) -> str:
    """'max' or 'min': the sweep's goal for its metric, else a guess from the name."""
    return goals.get(metric) or ("min" if _LOWER_IS_BETTER.search(metric) else "max")


def compare(
    store: Store,
    jobs: list[Job],
    goals: dict[str, str] | None = None,
    sort: str | None = None,
    reverse: bool = False,
    system: bool = False,
) -> dict[str, Any]:
    """{"columns": [...], "rows": [{column: value}]} sorted by ``sort`` (best first for a
    metric column; None keeps the given order)."""
    goals = goals or {}
    juids = [j.juid for j in jobs]
    stats = store.metric_stats(juids)
    summaries = store.summaries(juids)
    metric_names = sorted(
        {n for per in stats.values() for n in per if system or not n.startswith("sys/")}
    )
    param_names: dict[str, None] = {}
    flat = {}
    for job in jobs:
        flat[job.juid] = flatten(job.params)
        param_names.update(dict.fromkeys(flat[job.juid]))
    summary_names = sorted({n for per in summaries.values() for n in per})
    taken = set(FIXED) | set(metric_names) | {f"{m}:best" for m in metric_names}
    pcol = {p: (f"param:{p}" if p in taken else p) for p in param_names}
    taken |= set(pcol.values())
    scol = {s: (f"summary:{s}" if s in taken else s) for s in summary_names}
    columns = [*FIXED, *pcol.values(), *scol.values()]
    for m in metric_names:
        columns += [m, f"{m}:best"]
    rows = []
    for job in jobs:
        row: dict[str, Any] = {"job": job.juid, "name": job.name, "state": job.state.value}
        for p, col in pcol.items():
            row[col] = flat[job.juid].get(p)
        for s, col in scol.items():
            row[col] = summaries[job.juid].get(s)
        for m in metric_names:
            st = stats[job.juid].get(m)
            best = None
            if st is not None:
                best = st["max"] if goal_of(m, goals) == "max" else st["min"]
            row[m] = st["last"] if st else None
            row[f"{m}:best"] = best
        rows.append(row)
    if sort is not None:
        if sort not in columns:
            from monkey.models import MonkeyError

            raise MonkeyError(f"no column {sort!r} to sort by; columns: {', '.join(columns)}")
        rows = sort_rows(rows, sort, descending(sort, metric_names, goals) != reverse)
    return {"columns": columns, "rows": rows}


def descending(column: str, metrics: list[str], goals: dict[str, str]) -> bool:
    """Whether COLUMN sorts high values first: a metric (or its :best) whose goal is max."""
    metric = column.removesuffix(":best")
    return metric in metrics and goal_of(metric, goals) == "max"


def sort_rows(rows: list[dict[str, Any]], column: str, descending: bool) -> list[dict[str, Any]]:
    """Rows ordered by COLUMN; missing and NaN values always last."""

    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    present = [r for r in rows if not missing(r.get(column))]
    absent = [r for r in rows if missing(r.get(column))]
    numeric = all(isinstance(r[column], (int, float)) for r in present)
    present.sort(key=lambda r: r[column] if numeric else str(r[column]), reverse=descending)
    return present + absent
