"""A self-contained HTML report of a sweep: its spec, progress, best run, the comparison
table and one inline SVG chart per metric (no scripts, no external files)."""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from monkey.tracking.plots import Series, svg_chart

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td.t{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:1em}
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


def sweep_report(status: dict[str, Any], table: dict[str, Any],
                 charts: dict[str, dict[str, Series]]) -> str:
    """The HTML page: STATUS from sweep_status, TABLE from compare, CHARTS metric -> runs."""
    spec = status["spec"]
    metric = spec.get("metric")
    rows = []
    for row in table["rows"]:
        cells = "".join(
            f'<td class="{"t" if not isinstance(row.get(c), (int, float)) else "n"}">'
            f"{escape(cell(row.get(c)))}</td>" for c in table["columns"])
        rows.append(f"<tr>{cells}</tr>")
    head = "".join(f"<th>{escape(c)}</th>" for c in table["columns"])
    counts = ", ".join(f"{n} {s}" for s, n in sorted(status["counts"].items()))
    best = status.get("best")
    best_text = (f"{escape(best['job'])}: {escape(metric['name'])} = {best['value']:.4g} "
                 f"({escape(json.dumps(best['params']))})") if best and metric else "-"
    params = "; ".join(f"{escape(k)}: {escape(json.dumps(v))}"
                       for k, v in spec["parameters"].items())
    svgs = "".join(f"<figure>{svg_chart(runs, name)}</figure>" for name, runs in charts.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>monkey sweep {escape(status['id'])}</title><style>{STYLE}</style></head>
<body>
<h1>Sweep {escape(status['id'])} <small>({escape(status['name'])})</small></h1>
<p id="summary">State <b>{escape(status['state'])}</b>; {status['done']} of {status['total']}
runs ended ({escape(counts)}). Created {time.strftime('%Y-%m-%d %H:%M', time.localtime(status['created_at']))}.</p>
<p>Command: <code>{escape(' '.join(spec['command']))}</code><br>
Method: {escape(spec['method'])}; parameters: {params}<br>
Metric: {escape(f"{metric['name']} ({metric['goal']})") if metric else '-'}; best run: {best_text}</p>
<h2>Runs</h2>
<table id="runs"><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>
<h2>Metrics</h2>
<div class="charts">{svgs}</div>
</body></html>
"""
