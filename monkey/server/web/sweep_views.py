"""A sweep page's analysis: which column is its metric and which are its parameters, what
the parallel coordinates draw (one axis per parameter and the metric, one line per run),
and how much of the metric's variance each parameter explains. Pure functions over the
runs table of ``Monkey.compare``."""

from __future__ import annotations

import math

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOG_SPAN = 100.0  # a positive numeric axis spanning this ratio or more is drawn on a log scale
MIN_RUNS = 3  # fewer runs with a metric: no importance (nothing to explain)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _numeric(value) and math.isfinite(value)


def metric_column(columns: list[str], spec_metric: str | None) -> str | None:
    """The column the analysis is on: the sweep's metric's best value, else the first
    metric's last value, else None (no metric logged yet)."""
    if spec_metric and f"{spec_metric}:best" in columns:
        return f"{spec_metric}:best"
    firsts = [c[: -len(":best")] for c in columns if c.endswith(":best")]
    return firsts[0] if firsts else None


def param_columns(columns: list[str], names: list[str]) -> list[str]:
    """The columns of parameters NAMES (flattened), as ``compare`` named them (a parameter
    whose name a metric took is ``param:NAME``)."""
    out = []
    for name in names:
        col = f"param:{name}" if f"param:{name}" in columns else name
        if col in columns:
            out.append(col)
    return out


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _r2(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return 0.0 if sxx == 0 or syy == 0 else min(1.0, sxy * sxy / (sxx * syy))


def _eta2(groups: list[str], ys: list[float]) -> float:
    """Between-group sum of squares over the total (one-way ANOVA's η²)."""
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    if total == 0:
        return 0.0
    by: dict[str, list[float]] = {}
    for g, y in zip(groups, ys):
        by.setdefault(g, []).append(y)
    between = sum(len(v) * (sum(v) / len(v) - mean) ** 2 for v in by.values())
    return min(1.0, between / total)


def importance(rows: list[dict[str, Any]], params: list[str], metric: str) -> list[dict[str, Any]]:
    """For each parameter of PARAMS, the share of METRIC's variance over ROWS it explains:
    {"param", "score" (0..1, or None when fewer than MIN_RUNS runs have both values or
    the parameter never varies), "method", "n"}, highest first.

    A parameter whose values repeat (a grid, a categorical choice: at most half as many
    distinct values as runs) is scored by η² (one-way ANOVA: the metric's variance between
    its values over the total; a curve that peaks in the middle counts in full); a
    numeric one whose values rarely repeat (a random search) by ρ², the squared Spearman
    rank correlation (monotonic effects, whatever the scale)."""
    out = []
    for p in params:
        pairs: list[tuple[Any, float]] = [
            (r.get(p), float(r[metric]))  # _finite: a number
            for r in rows
            if r.get(p) is not None and _finite(r.get(metric))
        ]
        xs = [x for x, _ in pairs]
        ys = [y for _, y in pairs]
        distinct = {repr(x) for x in xs}
        numeric = all(_finite(x) for x in xs)
        score: float | None
        if numeric and len(distinct) > len(xs) / 2:
            method = "ρ²"
            score = _r2(_ranks([float(x) for x in xs]), _ranks(ys)) if len(xs) else 0.0
        else:
            method = "η²"
            score = _eta2([repr(x) for x in xs], ys) if xs else 0.0
        if len(pairs) < MIN_RUNS or len(distinct) < 2:
            score = None
        out.append({"param": p, "score": score, "method": method, "n": len(pairs)})
    out.sort(key=lambda d: (d["score"] is None, -float(d["score"] or 0.0), d["param"]))
    return out


def _axis(name: str, values: list[Any]) -> dict[str, Any]:
    """One axis: numeric (min, max, log when positive and wide) or categorical (its
    levels in order)."""
    present = [v for v in values if v is not None]
    if present and all(_finite(v) for v in present):
        low, high = min(present), max(present)
        log = low > 0 and high / low >= LOG_SPAN
        return {"name": name, "kind": "num", "min": low, "max": high, "log": log}
    levels = sorted({_text(v) for v in present}, key=_natural)
    return {"name": name, "kind": "cat", "levels": levels}


def _text(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, str) else _short(value)


def _short(value: Any) -> str:
    import json

    return json.dumps(value) if not _numeric(value) else f"{value:.6g}"


def _natural(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def parcoords(
    rows: list[dict[str, Any]], params: list[str], metric: str | None, goal: str
) -> dict[str, Any]:
    """What the parallel coordinates draw: {"axes": one per parameter, then the metric;
    "metric", "goal"; "runs": [{"job", "v": each axis's value (a number, a level's text
    or None), "m": the metric or None}]}."""
    names = [*params, *([metric] if metric else [])]
    axes = [_axis(n, [r.get(n) for r in rows]) for n in names]
    runs = []
    for r in rows:
        values: list[Any] = []
        for a in axes:
            v = r.get(a["name"])
            if v is None or (a["kind"] == "num" and not _finite(v)):
                values.append(None)
            else:
                values.append(v if a["kind"] == "num" else _text(v))
        m = r.get(metric) if metric else None
        runs.append({"job": r["job"], "v": values, "m": m if _finite(m) else None})
    return {"axes": axes, "metric": metric, "goal": goal, "runs": runs}


def constant_params(rows: list[dict[str, Any]], columns: list[str], names: list[str]) -> list[str]:
    """The parameters of NAMES whose value is the same in every one of ROWS (two or more
    runs): nothing to compare there."""
    if len(rows) < 2:
        return []
    return [
        name
        for name, col in zip(names, param_columns(columns, names))
        if len({repr(r.get(col)) for r in rows}) == 1
    ]


GROUPS = {"run": "", "goal": "Goal metric", "param": "Parameters", "metric": "Metrics"}
GROUPS["summary"] = "Summary"


def runs_columns(
    columns: list[str], params: list[str], metric: str | None, hidden: list[str]
) -> list[dict[str, str]]:
    """The runs table's columns as the page shows them: {"key" (``compare``'s column),
    "kind" (run, goal, param, metric or summary), "name", "sub" ("best", "last" or "")}.
    The job and its state first, then the goal METRIC's best and last, the parameter
    columns PARAMS, the other metrics (last, best), the summaries and the run's name;
    the columns HIDDEN left out."""
    base = metric.removesuffix(":best") if metric else None
    metrics = [c.removesuffix(":best") for c in columns if c.endswith(":best")]
    goal = [c for c in (f"{base}:best", base) if base in metrics and c in columns]
    taken = {"job", "state", "name", *goal, *params, *hidden}
    others = [c for m in metrics if m != base for c in (m, f"{m}:best")]
    summaries = [c for c in columns if c not in taken and c not in others]

    def one(key: str, kind: str) -> dict[str, str]:
        name, sub = key, ""
        if kind in ("goal", "metric"):
            name, sub = key.removesuffix(":best"), ("best" if key.endswith(":best") else "last")
        elif kind in ("param", "summary"):
            name = key.removeprefix(f"{kind}:")
        return {"key": key, "kind": kind, "name": name, "sub": sub}

    return [
        one("job", "run"),
        one("state", "run"),
        *(one(c, "goal") for c in goal),
        *(one(c, "param") for c in params),
        *(one(c, "metric") for c in others),
        *(one(c, "summary") for c in summaries),
        one("name", "run"),
    ]


def column_groups(shown: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The header above the columns SHOWN: one {"label", "span"} per run of one kind."""
    groups: list[dict[str, Any]] = []
    for c in shown:
        label = GROUPS[c["kind"]]
        if groups and groups[-1]["label"] == label:
            groups[-1]["span"] += 1
        else:
            groups.append({"label": label, "span": 1})
    return groups


def analysis(
    table: dict[str, Any], param_names: list[str], spec_metric: dict[str, Any] | None
) -> dict[str, Any]:
    """The sweep page's analysis of TABLE (``Monkey.compare``'s): {"metric", "params",
    "importance", "parcoords"}."""
    columns = table["columns"]
    metric = metric_column(columns, (spec_metric or {}).get("name"))
    params = param_columns(columns, param_names)
    base = metric[: -len(":best")] if metric and metric.endswith(":best") else metric
    from monkey.tracking.compare import goal_of

    goals = {spec_metric["name"]: spec_metric["goal"]} if spec_metric else {}
    goal = goal_of(base, goals) if base else "max"
    rows = table["rows"]
    return {
        "metric": metric,
        "params": params,
        "importance": importance(rows, params, metric) if metric else [],
        "parcoords": parcoords(rows, params, metric, goal),
    }
