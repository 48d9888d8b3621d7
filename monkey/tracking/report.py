"""A self-contained HTML report of a sweep — its spec, progress, best run (highlighted), the
comparison table, sweep analysis (parameter importance, parallel coordinates, a scatter per
parameter, best so far over time) and the metrics as small multiples — or of any set of
jobs (the table and the metrics), all inline SVG as wide as the page (no scripts, no
external files)."""

from __future__ import annotations

import json
import time
from html import escape

from monkey.tracking import sweep_analysis as sa
from monkey.tracking.plots import Series, Style, run_colours, single_valued, svg_charts, svg_values

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
.table-wrap{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td.t{text-align:left}
.charts svg{width:100%;height:auto;display:block}
.scatters{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:1em}
tr.best td{background:#fde2e2;font-weight:bold}
.bar{display:inline-block;background:#1f77b4;height:10px}
code{background:#f3f3f3;padding:1px 4px}
"""


def cell(value: Any) -> str:
    """A table cell's text: numbers to 4 significant digits, nothing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _runs_and_charts(
    table: dict[str, Any],
    charts: dict[str, dict[str, Series]],
    style: Style | None,
    analysis: dict[str, Any] | None,
) -> str:
    """The runs table (the best run's row marked) and the metrics as small multiples."""
    rows = []
    for row in table["rows"]:
        cells = "".join(
            f'<td class="{_cell_class(c, row.get(c))}">{escape(cell(row.get(c)))}</td>'
            for c in table["columns"]
        )
        best_row = analysis and row.get("job") == analysis.get("best")
        mark = ' class="best"' if best_row else ""
        rows.append(f"<tr{mark}>{cells}</tr>")
    head = "".join(f"<th>{escape(c)}</th>" for c in table["columns"])
    return f"""<h2>Runs</h2>
<div class="table-wrap"><table id="runs"><thead><tr>{head}</tr></thead>
<tbody>{"".join(rows)}</tbody></table></div>
{analysis_html(analysis) if analysis else ""}
<h2>Metrics</h2>
{_metrics_html(charts, style)}"""


def _cell_class(column: str, value: Any) -> str:
    """``id`` for job ids (never wrapped), ``t`` for text, ``n`` for numbers."""
    if column == "job":
        return "t id"
    return "n" if isinstance(value, (int, float)) else "t"


def _metrics_html(charts: dict[str, dict[str, Series]], style: Style | None) -> str:
    """Line charts of the metrics logged over steps, and a bar per run (with its value) for
    those each run logged once (``test_acc``), in the same run colours."""
    if not charts:
        return "<p>no metrics logged</p>"
    style = style or Style()
    once = {m: lines for m, lines in charts.items() if lines and single_valued(lines)}
    series = {m: lines for m, lines in charts.items() if m not in once}
    palette = run_colours(list(dict.fromkeys(r for ls in charts.values() for r in ls)), style)
    out = f'<div class="charts">{svg_charts(series, style)}</div>' if series else ""
    if once:
        out += (
            "<h3>Values logged once</h3>"
            f'<div class="charts values">{svg_values(once, palette)}</div>'
        )
    return out


def jobs_report(
    title: str,
    jobs: list[dict[str, Any]],
    table: dict[str, Any],
    charts: dict[str, dict[str, Series]],
    style: Style | None = None,
) -> str:
    """The HTML page of any set of JOBS ({"job", "state", "command"}): TITLE says how they were
    chosen; TABLE from compare, CHARTS metric -> runs."""
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    commands = sorted({j["command"] for j in jobs})
    shown = "<br>".join(f"<code>{escape(c)}</code>" for c in commands[:5])
    more = f"<br>and {len(commands) - 5} more" if len(commands) > 5 else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>monkey report: {escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p id="summary">{len(jobs)} jobs ({escape(states)}).</p>
<p>Commands:<br>{shown}{more}</p>
{_runs_and_charts(table, charts, style, None)}
</body></html>
"""


def sweep_report(
    status: dict[str, Any],
    table: dict[str, Any],
    charts: dict[str, dict[str, Series]],
    style: Style | None = None,
    analysis: dict[str, Any] | None = None,
) -> str:
    """The HTML page: STATUS from sweep_status, TABLE from compare, CHARTS metric -> runs,
    ANALYSIS from ``Monkey.sweep_analysis``."""
    spec = status["spec"]
    metric = spec.get("metric")
    counts = ", ".join(f"{n} {s}" for s, n in sorted(status["counts"].items()))
    best = status.get("best")
    best_text = (
        (
            f"{escape(best['job'])}: {escape(metric['name'])} = {best['value']:.4g} "
            f"({escape(json.dumps(best['params']))})"
        )
        if best and metric
        else "-"
    )
    params = "; ".join(
        f"{escape(k)}: {escape(json.dumps(v))}" for k, v in spec["parameters"].items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>monkey sweep {escape(status["id"])}</title><style>{STYLE}</style></head>
<body>
<h1>Sweep {escape(status["id"])} <small>({escape(status["name"])})</small></h1>
<p id="summary">State <b>{escape(status["state"])}</b>; {status["done"]} of {status["total"]}
runs ended ({escape(counts)}). Created {time.strftime("%Y-%m-%d %H:%M", time.localtime(status["created_at"]))}.</p>
<p>Command: <code>{escape(" ".join(spec["command"]))}</code><br>
Method: {escape(spec["method"])}; parameters: {params}<br>
Metric: {escape(f"{metric['name']} ({metric['goal']})") if metric else "-"}; best run: {best_text}</p>
{_runs_and_charts(table, charts, style, analysis)}
</body></html>
"""


def analysis_html(analysis: dict[str, Any]) -> str:
    """The sweep-analysis section: importance, parallel coordinates, scatters, progress."""
    metric = analysis.get("metric")
    runs = analysis["runs"]
    if not metric or not runs:
        return (
            "<h2>Analysis</h2><p>no run has logged the sweep's metric"
            f"{' ' + escape(repr(metric['name'])) if metric else ''}</p>"
        )
    name, best = metric["name"], analysis["best"]
    bars = "".join(
        f'<tr><td class="t">{escape(k)}</td><td>{v:.3f}</td><td class="t"><span class="bar" '
        f'style="width:{max(1, round(v * 300))}px"></span></td></tr>'
        for k, v in analysis["importance"].items()
    )
    scatters = "".join(
        sa.scatter(runs, k, name, best)
        for k in [*analysis["importance"], *analysis.get("unranked", {})]
    )
    note = sa.too_few(analysis)
    ranked = (
        f"""<table id="importance"><thead><tr><th>parameter</th><th>importance</th><th></th>
</tr></thead><tbody>{bars}</tbody></table>"""
        if bars
        else ""
    )
    return f"""<h2>Analysis</h2>
<p>Best run: <b>{escape(best)}</b> (red below). Parameter importance on {escape(name)}
by {escape(analysis["method"])}:</p>
{ranked}{f'<p id="too-few">{escape(note)}</p>' if note else ""}
<h3>Parameters and {escape(name)}</h3>
<div class="charts">{sa.parallel_coordinates(runs, name, best)}</div>
<div class="scatters">{scatters}</div>
<h3>Progress</h3>
<div class="charts">{sa.progress(analysis["best_so_far"], name)}</div>
"""
