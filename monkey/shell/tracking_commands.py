"""Tracking commands: metrics, plot, report, compare, diff, export, search (sweeps: see
sweep_commands.py).

Parser builders take the parser class like those of cli.py; commands are glue over the
``Monkey`` facade. Only argparse and the standard library are imported up here.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time

from monkey.models import whole_number
from monkey.shell.common import (
    ParserClass,
    UsageError,
    job_argument,
    make_parser,
    monkey,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey


def finite_json(value: Any) -> None:
    """Print VALUE as JSON, NaN and infinities as null."""
    sys.stdout.write(json.dumps(_finite(value), indent=2, default=str, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    """VALUE with NaN and infinities as the strings "NaN", "Infinity", "-Infinity" (JSON has
    no such numbers; jq and browsers refuse bare ``NaN``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def fmt(value: Any) -> str:
    """A value for a table cell: numbers to 4 significant digits, nothing as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


# -- parsers --------------------------------------------------------------------------


def metrics_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(cls, "metrics", "Show a job's metrics: a summary per series, or the points.")
    job_argument(p)
    p.add_argument("--name", "-n", help="only this metric (prints its points)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="every point as JSON")
    out.add_argument("--csv", action="store_true", help="every point as CSV")
    out.add_argument("--plot", action="store_true", help="draw the series in the terminal")
    p.add_argument(
        "--x",
        choices=("step", "time"),
        default="step",
        help="x axis of --plot: step (default) or seconds since the start",
    )
    p.set_defaults(func=cmd_metrics)
    return p


def _selection(p: argparse.ArgumentParser) -> None:
    """--jobs, --name and --since: a set of jobs, the filters narrowing each other."""
    p.add_argument("--jobs", "-j", nargs="+", default=[], metavar="JOB", help="these jobs")
    p.add_argument(
        "--name",
        "-n",
        metavar="PATTERN",
        help="jobs whose name matches PATTERN (shell-style: 'resnet-*')",
    )
    p.add_argument(
        "--since", "-s", metavar="AGE", help="jobs created in the last AGE (90m, 12h, 7d)"
    )


def _selected(
    m: Monkey, refs: list[str], name: str | None, since: str | None
) -> tuple[list[str], str]:
    """The jobs chosen by REFS, --name and --since, oldest first, and words saying how."""
    juids, words = m.select_jobs(refs, name, since)
    return list(juids), words


def plot_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "plot",
        "Write a PNG comparing metrics across jobs or a sweep's runs "
        "(needs matplotlib): one panel per metric, runs named by what differs.",
    )
    job_argument(p, "job", "*", help="job ids, prefixes, or `last`")
    _selection(p)
    p.add_argument("--sweep", help="every run of this sweep (default metric: the sweep's)")
    p.add_argument(
        "--metric",
        "-m",
        action="append",
        default=[],
        help="a metric to draw (repeat for several: one panel each)",
    )
    p.add_argument("--out", "-o", required=True, help="the PNG (or .svg, .pdf) file to write")
    p.add_argument(
        "--x",
        choices=("step", "epoch", "time"),
        default="step",
        help="x axis: step (default), the logged epoch, or seconds since the start",
    )
    p.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        metavar="W",
        help="EMA smoothing weight in [0, 1), e.g. 0.6 (the raw line stays faint)",
    )
    p.add_argument("--log-y", action="store_true", help="a log scale for the values")
    p.add_argument("--size", default="1000x600", metavar="WxH", help="pixels (default 1000x600)")
    p.set_defaults(func=cmd_plot)
    return p


def report_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "report",
        "Write a self-contained HTML report of a sweep, or of any set of "
        "jobs (--jobs, --name, --since).",
    )
    p.add_argument("sweep", nargs="?", help="sweep id (sw-...), unique prefix, or `last`")
    p.add_argument("--out", "-o", required=True, help="the HTML file to write")
    _selection(p)
    p.set_defaults(func=cmd_report)
    return p


def compare_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls, "compare", "Compare runs: parameters, final and best metrics in one table."
    )
    job_argument(p, "jobs", "*", help="job ids, prefixes, or `last`")
    p.add_argument("--sweep", "-s", help="every run of this sweep (ranked on its metric)")
    p.add_argument("--sort", metavar="COLUMN", help="sort by a column (metrics: best first)")
    p.add_argument("--reverse", action="store_true", help="reverse the order")
    p.add_argument("--sys", action="store_true", help="include system metrics (sys/...)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--csv", action="store_true", help="print CSV")
    p.set_defaults(func=cmd_compare)
    return p


def diff_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "diff",
        "What differs between two jobs: command, parameters, environment, code, git, data, Python.",
    )
    job_argument(p, "jobs", 2, help="two job ids, prefixes, or `last`")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_diff)
    return p


def search_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "search",
        "Jobs whose command or output holds these words (in this order), "
        "newest first, each with its last matching line.",
    )
    p.add_argument("text", nargs="+", metavar="WORDS", help='e.g. "CUDA out of memory"')
    p.add_argument("--limit", "-l", type=int, default=50, help="at most N jobs (default 50)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_search)
    return p


# -- commands -------------------------------------------------------------------------


def cmd_metrics(args: argparse.Namespace) -> int:
    m = monkey()
    juid = m.resolve(args.job)
    series = m.metrics(juid, args.name)
    if args.json:
        finite_json(
            {
                name: [{"step": s, "value": v, "time": w} for s, v, w in pts]
                for name, pts in series.items()
            }
        )
    elif args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(["job", "name", "step", "value", "time"])
        for name, pts in series.items():
            writer.writerows(
                [juid, name, "" if s is None else s, repr(v), f"{w:.6f}"] for s, v, w in pts
            )
    elif not series:
        print(f"job {juid} has logged no metrics yet")
    elif args.plot:
        from monkey.shell.table import use_colour
        from monkey.tracking.plots import terminal_plot

        shown = (
            series
            if args.name
            else {k: v for k, v in series.items() if not k.startswith("sys/")} or series
        )
        for name, pts in shown.items():
            print(
                terminal_plot(
                    {name: pts}, f"{juid} {name}", x=args.x, colour=use_colour(sys.stdout)
                )
            )
    elif args.name:
        from monkey.shell.table import render

        render(
            ["STEP", "VALUE", "TIME"],
            [
                [fmt(s), fmt(v), time.strftime("%H:%M:%S", time.localtime(w))]
                for s, v, w in series[args.name]
            ],
        )
    else:
        from monkey.shell.table import render

        rows = []
        for name, pts in series.items():
            values = [v for _, v, _ in pts if not math.isnan(v)]
            last_step = pts[-1][0]
            rows.append(
                [
                    name,
                    str(len(pts)),
                    fmt(last_step),
                    fmt(pts[-1][1]),
                    fmt(min(values) if values else None),
                    fmt(max(values) if values else None),
                ]
            )
        render(["METRIC", "POINTS", "STEP", "LAST", "MIN", "MAX"], rows)
    return 0


def _size(text: str) -> tuple[int, int]:
    w, sep, h = text.lower().partition("x")
    width, height = whole_number(w) or 0, whole_number(h) or 0
    if not sep or not (50 <= width <= 10000) or not (50 <= height <= 10000):
        raise UsageError(
            f"monkey plot: --size {text!r} is not WIDTHxHEIGHT in pixels, e.g. 1000x600"
        )
    return width, height


def cmd_plot(args: argparse.Namespace) -> int:
    size = _size(args.size)
    m = monkey()
    refs = [*args.job, *args.jobs]
    if args.name or args.since:
        refs = _selected(m, refs, args.name, args.since)[0]
    if not refs and not args.sweep:
        raise UsageError(
            "monkey plot: name the jobs (JOB..., --jobs, --name or --since), or --sweep S"
        )
    print(
        m.plot(
            refs,
            args.metric,
            args.out,
            x=args.x,
            size=size,
            smooth=args.smooth,
            log_y=args.log_y,
            sweep=args.sweep,
        )
    )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    found = monkey().search(" ".join(args.text), args.limit)
    if args.json:
        finite_json(found)
        return 0
    for hit in found:
        print(
            f"{hit['job']}  {hit['state']:<9}  {hit['name']}  ({hit['source']})\n    {hit['line'].strip()}"
        )
    if not found:
        print("no job matches")
    return 0 if found else 1


def export_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "export",
        "Write jobs, parameters, metrics and output as a tidy SQLite "
        "database (--to) or CSV files (--csv) for pandas, Datasette or any SQLite tool.",
    )
    p.epilog = (
        "Tables: jobs, params, metrics, summaries, attempts, outputs, sweeps (long: one "
        "fact per row), with full-text search over commands (jobs_fts) and output "
        "(outputs_fts). Exporting again into the same file updates it."
    )
    p.add_argument(
        "jobs", nargs="*", metavar="JOB", help="job ids, prefixes, or `last` (default: every job)"
    )
    p.add_argument("--sweep", metavar="S", help="the runs of this sweep")
    p.add_argument("--name", metavar="GLOB", help="jobs whose name matches GLOB, e.g. 'exp-*'")
    p.add_argument("--since", metavar="AGE", help="jobs created in the last AGE (30m, 12h, 7d)")
    p.add_argument("--to", metavar="FILE.db", help="the SQLite file to write or update")
    p.add_argument("--csv", metavar="DIR", help="write one CSV file per table into DIR")
    p.add_argument("--json", action="store_true", help="print the row counts as JSON")
    p.set_defaults(func=cmd_export)
    return p


def cmd_export(args: argparse.Namespace) -> int:
    m = monkey()
    if not args.to and not args.csv:
        raise UsageError("monkey export: say where: --to runs.db (a SQLite file) and/or --csv DIR")
    if args.jobs and args.sweep:
        raise UsageError("monkey export: give either jobs or --sweep, not both")
    refs = args.jobs
    if args.name or args.since:
        if args.sweep:
            refs = m.export_jobs(None, args.sweep)
        refs, _ = _selected(m, refs, args.name, args.since)
        counts = m.export(refs, to=args.to, csv_dir=args.csv)
    else:
        counts = m.export(refs or None, sweep=args.sweep, to=args.to, csv_dir=args.csv)
    if args.json:
        finite_json(counts)
        return 0
    where = " and ".join(w for w in (args.to, args.csv and f"{args.csv}/*.csv") if w)
    print(
        f"exported {counts['jobs']} jobs ({counts['params']} parameters, {counts['metrics']} "
        f"metric points, {counts['outputs']} outputs) to {where}"
    )
    if args.to:
        print(
            f"open it with: sqlite3 {args.to}  |  datasette {args.to}  |  "
            f"pandas.read_sql('select * from metrics', sqlite3.connect('{args.to}'))",
            file=sys.stderr,
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    m = monkey()
    chosen = args.jobs or args.name or args.since
    if bool(args.sweep) == bool(chosen):
        raise UsageError(
            "monkey report: give a sweep, or jobs with --jobs, --name or --since (not both)"
        )
    if args.sweep:
        print(m.report(args.sweep, args.out))
    else:
        juids, title = _selected(m, args.jobs, args.name, args.since)
        print(m.report(None, args.out, jobs=juids, title=title))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    m = monkey()
    table = m.compare(
        args.jobs or None, sweep=args.sweep, sort=args.sort, reverse=args.reverse, system=args.sys
    )
    columns, rows = table["columns"], table["rows"]
    costs = m.costs([r["job"] for r in rows])
    if costs:  # a column only when some run has a known price
        columns = [*columns, "cost"]
        for r in rows:
            r["cost"] = round(costs[r["job"]]["total"], 6) if r["job"] in costs else None
    if args.json:
        finite_json(rows)
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({c: "" if r.get(c) is None else r[c] for c in columns} for r in rows)
    else:
        from monkey.shell.table import render
        from monkey.store.cost import dollars

        headers = [
            "#",
            *(c.upper() if c in ("job", "name", "state", "cost") else c for c in columns),
        ]
        name = headers.index("NAME") if "NAME" in headers else None
        kept = 1 + columns.index(table["sorted_by"]) if table.get("sorted_by") in columns else None
        left_out = render(
            headers,
            [
                [str(i), *(dollars(r[c]) if c == "cost" else fmt(r.get(c)) for c in columns)]
                for i, r in enumerate(rows, start=1)
            ],
            flex=name,
            drop=[i for i in range(len(headers) - 1, 2, -1) if i != kept],
        )
        if left_out:
            print(
                f"{left_out} columns left out to fit the terminal; see them with --json or --csv",
                file=sys.stderr,
            )
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    result = monkey().diff(*args.jobs)
    if args.json:
        finite_json(result)
        return 0
    a, b = result["jobs"]
    print(f"--- {a}\n+++ {b}")
    same = True
    for section in (
        "rerun_of",
        "command",
        "params",
        "env",
        "datasets",
        "resources",
        "image",
        "python",
        "packages",
    ):
        value = result.get(section)
        if not value:
            continue
        same = False
        print(f"\n[{section}]")
        if isinstance(value, list):
            print(f"- {fmt(value[0])}\n+ {fmt(value[1])}")
            continue
        for key, (va, vb) in value.items():
            print(f"  {key}: {fmt(va)} -> {fmt(vb)}")
    git = result.get("git")
    if git:
        same = False
        print("\n[git]")
        for key in ("commit", "branch", "dirty"):
            if key in git:
                print(f"  {key}: {fmt(git[key][0])} -> {fmt(git[key][1])}")
        if git.get("uncommitted"):
            print("  uncommitted changes differ:")
            sys.stdout.write(git["uncommitted"])
    code = result.get("code")
    if code:
        same = False
        print("\n[code]")
        for label in ("added", "removed", "changed"):
            for path in code[label]:
                print(f"  {label}: {path}")
        if code["diff"]:
            print()
            sys.stdout.write(code["diff"])
    if same:
        print(
            "\nno differences in command, parameters, environment, code, git, data, image or Python"
        )
    return 0
