"""Monkey Web's tables as CSV files: the jobs list (its filters, sort and chosen columns,
every page of it) and a sweep's runs table (its columns and sort), as the pages show them."""

from __future__ import annotations

import csv
import io
import time

from monkey.server.web import views

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

MOST_ROWS = 10_000  # jobs a CSV of the jobs list holds at most


def _csv(header: list[str], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_safe(v) for v in row] for row in rows)
    return out.getvalue()


def _safe(value: Any) -> Any:
    """VALUE for a cell: None empty; text a spreadsheet would run as a formula quoted."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            float(value)
            return value  # a number such as -1.5
        except ValueError:
            return "'" + value
    return value


def jobs_csv(
    m: Monkey,
    filters: dict[str, str],
    sort: str | None,
    reverse: bool,
    columns: list[str],
) -> str:
    """The jobs list as the page shows it (FILTERS, SORT, REVERSE, the chosen COLUMNS), every
    page of it up to MOST_ROWS jobs, with each job's creation time in place of its age."""
    rows: list[list[Any]] = []
    before, start = None, 0
    owners = False
    labels: list[str] = []
    while len(rows) < MOST_ROWS:
        page = views.jobs_page(m, filters, before, sort, reverse, start, columns)
        owners, labels = page["owners"], [c["label"] for c in page["columns"]]
        for r in page["rows"]:
            rows.append(
                [
                    r["juid"],
                    r["name"],
                    " ".join(r["tags"]),
                    r["sweep_name"],
                    *([r["owner"]] if owners else []),
                    r["shown"],
                    r["provider"],
                    r["attempts"],
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"])),
                    r["runtime"],
                    r["exit"],
                    *r["extra"],
                    r["metrics"],
                    r["command"],
                    r["error"] or "",
                ]
            )
        if page["next"] is None:
            break
        if sort:
            start = int(page["next"])
        else:
            before = page["next"]
    header = ["job", "name", "tags", "sweep", *(["owner"] if owners else []), "state"]
    header += ["provider", "tries", "created", "runtime", "exit", *labels]
    return _csv([*header, "metrics", "command", "error"], rows[:MOST_ROWS])


def runs_csv(data: dict[str, Any], jobs: list[str] | None = None) -> str:
    """A sweep's runs table (``views.sweep_page``'s DATA): its columns in its order, the
    values whole (not rounded as the page shows them); only the runs JOBS when given (those
    the parallel coordinates' selection keeps)."""
    columns = data["columns"]
    header = [c["name"] + (f" {c['sub']}" if c["sub"] else "") for c in columns]
    keep = set(jobs or ())
    rows = [
        [r.get(c["key"]) for c in columns]
        for r in data["table"]["rows"]
        if not keep or r["job"] in keep
    ]
    return _csv(header, rows)
