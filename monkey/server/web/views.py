"""What Monkey Web's pages show, read through the facade in a worker thread (plain dicts
and lists the templates render)."""

from __future__ import annotations

import time

from monkey.models import TERMINAL, MonkeyError, State
from monkey.models import run_time as duration
from monkey.server.web.job_extras import extras
from monkey.server.web.render import cell, clock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

PAGE = 50  # jobs a page shows
SEARCH_HITS = 500  # jobs a full-text search narrows to at most
FILTERS = ("state", "provider", "owner", "sweep", "name", "tag", "q")
ACTIONS = ("cancel", "pause", "resume", "retry")


# The jobs list's sortable columns (monkey.store.web.JOB_SORTS) and whether each sorts
# high first on the first click: the newest, longest-running, most tried first.
JOB_SORTS = {
    **dict.fromkeys(("job", "name", "sweep", "owner", "state", "provider", "age"), False),
    **dict.fromkeys(("tries", "runtime", "exit"), True),
}


MOST_COLUMNS = 20  # chosen columns of the jobs list, at most
_COLUMN_KINDS = ("param", "last", "best")


def check_columns(chosen: list[str]) -> list[str]:
    """The jobs list's chosen columns CHOSEN (``param:NAME``, ``last:METRIC``,
    ``best:METRIC``), checked: a MonkeyError names the first wrong one."""
    if len(chosen) > MOST_COLUMNS:
        raise MonkeyError(f"{len(chosen)} columns: choose at most {MOST_COLUMNS}")
    for key in chosen:
        kind, _, name = key.partition(":")
        if kind not in _COLUMN_KINDS or not name or len(name) > 200:
            raise MonkeyError(f"column {key[:60]!r}: use param:NAME, last:METRIC or best:METRIC")
    return list(dict.fromkeys(chosen))


def _column_label(key: str) -> str:
    kind, _, name = key.partition(":")
    return name if kind == "param" else f"{name} {kind}"


def jobs_page(
    m: Monkey,
    filters: dict[str, str],
    before: str | None,
    sort: str | None = None,
    reverse: bool = False,
    start: int = 0,
    columns: list[str] | None = None,
) -> dict[str, Any]:
    """A page of the jobs list: {"rows", "total", "next" (the cursor of the next page or
    None), "owners" (whether to show them), "providers", "states", "searched", "columns"
    (COLUMNS, chosen: each row's "extra" holds their cells), "offered" (the parameters and
    metrics of the page's jobs, to choose from)}; by SORT
    (a key of JOB_SORTS; REVERSE: the other way) the page from the START-th job, "next"
    the start of the next one. The sweep filter takes a sweep's id, name or prefix; the
    name filter a part of the name or a shell-style pattern."""
    from monkey.tracking.compare import goal_of

    columns = columns or []
    if sort is not None and sort not in JOB_SORTS and sort not in columns:
        raise MonkeyError(
            f"sort by {sort[:60]!r}: use one of {', '.join(JOB_SORTS)} or a chosen column"
        )
    state = filters.get("state") or None
    if state is not None and state not in {s.value for s in State}:
        raise MonkeyError(f"state {state!r}: use one of {', '.join(s.value for s in State)}")
    juids = None
    text = filters.get("q", "").strip()
    hits: dict[str, dict[str, Any]] = {}
    if text:
        hits = {hit["job"]: hit for hit in m.search(text, SEARCH_HITS)}
        juids = list(hits)
    tag = filters.get("tag", "").strip() or None
    if tag is not None:
        from monkey.facade.notes import check_tags

        check_tags([tag])
    where: dict[str, Any] = {
        "state": state,
        "provider": filters.get("provider") or None,
        "owner": filters.get("owner") or None,
        "sweep": m.sweep_id(filters["sweep"]) if filters.get("sweep") else None,
        "name": filters.get("name") or None,
        "juids": juids,
        "tag": tag,
    }
    now = time.time()
    by, high_first = sort, bool(sort) and JOB_SORTS.get(sort or "", False)
    if sort and sort.partition(":")[0] in ("last", "best"):  # best first, as a sweep's table
        kind, _, name = sort.partition(":")
        high_first = goal_of(name, {}) == "max"
        by = f"{'max' if high_first else 'min'}:{name}" if kind == "best" else sort
    descending = bool(high_first) != reverse
    table = m.jobs_table(
        where,
        now=now,
        stats=any(not c.startswith("param:") for c in columns),
        before=before,
        limit=PAGE + 1,
        sort=by,
        descending=descending,
        offset=start,
    )
    jobs = table["jobs"]
    more = len(jobs) > PAGE
    jobs = jobs[:PAGE]
    ids = [j.juid for j in jobs]
    runtimes, owners, tags = table["runtimes"], table["owners"], table["tags"]
    metrics, sweeps, stats = table["metrics"], table["sweeps"], table["stats"]
    from monkey.tracking.ingest import flatten

    params = {j.juid: flatten(j.params or {}) for j in jobs}
    rows = []
    for j in jobs:
        shown = j.shown_state
        hit = hits.get(j.juid)
        sweep = sweeps.get(j.sweep) if j.sweep else None
        rows.append(
            {
                "juid": j.juid,
                "name": j.name,
                "owner": owners.get(j.juid) or "",
                "state": j.state.value,
                "shown": shown,
                "provider": j.provider,
                "attempts": j.attempts,
                "age": ago(now - j.created_at),
                "created": j.created_at,
                "runtime": duration(runtimes.get(j.juid)),
                "exit": "" if j.exit_code is None else str(j.exit_code),
                "command": j.command,
                "metrics": _few_metrics(metrics.get(j.juid, {})),
                "sweep": j.sweep,
                "tags": tags.get(j.juid, []),
                "sweep_name": (sweep or {}).get("name") or j.sweep or "",
                "error": _error(m, j.juid, j.attempts) if j.state == State.FAILED else None,
                "found": hit and {"line": hit["line"].strip(), "source": hit["source"]},
                "extra": [_chosen(c, params[j.juid], stats.get(j.juid, {})) for c in columns],
            }
        )
    offered = sorted({f"param:{p}" for per in params.values() for p in per})
    names = sorted({n for per in metrics.values() for n in per if not n.startswith("sys/")})
    offered += [f"{kind}:{n}" for n in names for kind in ("last", "best")]
    return {
        "rows": rows,
        "total": table["total"],
        "next": (str(start + PAGE) if sort else ids[-1]) if more else None,
        "page_size": PAGE,
        "descending": descending,
        "columns": [{"key": c, "label": _column_label(c)} for c in columns],
        "offered": [
            {"key": c, "label": _column_label(c), "on": c in columns}
            for c in dict.fromkeys([*offered, *columns])
        ],
        "owners": table["users"] > 1,
        "providers": sorted(m.providers) if _providers_ok(m) else [],
        "states": [s.value for s in State],
        "searched": text,
    }


def _chosen(key: str, params: dict[str, Any], stats: dict[str, Any]) -> str:
    """A chosen column's cell: a parameter, or a metric's last or best value."""
    from monkey.tracking.compare import goal_of

    kind, _, name = key.partition(":")
    if kind == "param":
        return cell(params.get(name))
    st = stats.get(name)
    if not st:
        return "-"
    if kind == "last":
        return cell(st["last"])
    return cell(st["max"] if goal_of(name, {}) == "max" else st["min"])


def _error(m: Monkey, juid: str, attempts: int) -> str | None:
    """A failed job's error line, from its last attempt's stderr."""
    from monkey.client_agent import rundir
    from monkey.server.web.errors import error_line

    if not attempts:
        return None
    return error_line(m.home.run_dir(juid, attempts) / rundir.stream_log("stderr"))


def _providers_ok(m: Monkey) -> bool:
    try:
        m.providers  # noqa: B018 - a broken providers.yml leaves the filter free text
        return True
    except MonkeyError:
        return False


def _few_metrics(values: dict[str, float | None], most: int = 3) -> str:
    """The last values of a job's first few series, system series (sys/...) left out as
    the dashboard does."""
    mine = sorted((k, v) for k, v in values.items() if not k.startswith("sys/"))
    shown = [f"{k}={_number(v)}" for k, v in mine[:most]]
    return " ".join(shown) + (" …" if len(mine) > most else "")


def _number(v: float | None) -> str:
    return "nan" if v is None else f"{v:.4g}"


def job_page(m: Monkey, ref: str, user: dict[str, Any]) -> dict[str, Any]:
    """Everything the job page shows: ``Monkey.info`` (but its metrics' summary: the
    charts show them) plus what USER may do to it."""
    info = m.info(ref, metrics=False)
    info["note"] = _dated(info.get("note"))
    state = State(info["state"])
    mine = user["admin"] or info.get("owner") == user["name"]
    actions = []
    if mine:
        if state not in TERMINAL:
            actions.append("cancel")
        if state in (State.QUEUED, State.DISPATCHING, State.RUNNING):
            actions.append("pause")
        if state == State.PAUSED:
            actions.append("resume")
        if state in TERMINAL:
            actions.append("retry")
    now = time.time()
    limit = info["resources"].get("time")
    from monkey.facade.waiting import tries_text
    from monkey.server.web.confirm import job_questions

    return {
        "info": info,
        "editable": mine,  # its note and tags (the owner or an admin)
        "actions": actions,
        "ask": job_questions(info, actions),
        "live": state not in TERMINAL,
        "siblings": _siblings(m, info),
        "failure": (  # its error line, beside "failed — exit 1"
            _error(m, info["job"], max((a["n"] for a in info["attempts_detail"]), default=0))
            if state == State.FAILED
            else None
        ),
        "limit": duration(limit) if limit else "none",
        "tries": tries_text(info),  # as `monkey info` says them
        "attempts": [
            {
                **a,
                "start": clock(a.get("started_at")),
                "end": clock(a.get("ended_at")),
                "ran": duration(
                    (a.get("ended_at") or now) - a["started_at"] if a.get("started_at") else None
                ),
            }
            for a in info["attempts_detail"]
        ],
        "events": [{**e, "when": clock(e["ts"])} for e in info["events"][-200:]],
        "cost": info.get("cost"),
        **extras(m, info, user),  # datasets, outputs, rerun form (job_extras.py)
    }


def _dated(note: dict[str, Any] | None) -> dict[str, Any] | None:
    """A note with ``when`` it was written, as the pages show times."""
    return note and {**note, "when": clock(note["at"])}


OVERLAID = 20  # other runs of a sweep a job page's charts may overlay, at most


def _siblings(m: Monkey, info: dict[str, Any]) -> list[str]:
    """The other runs of the job's sweep (the first OVERLAID), for its charts' overlay."""
    if not info.get("sweep"):
        return []
    juids = m.sweep_jobs(info["sweep"])[1]
    return [j for j in juids if j != info["job"]][:OVERLAID]


def ago(seconds: float) -> str:
    return duration(max(0.0, seconds)) + " ago"


SWEEP_ACTIONS = ("cancel", "pause", "resume", "retry")


def sweeps_page(m: Monkey) -> dict[str, Any]:
    """The sweeps, newest first, with their jobs' counts by state."""
    return {"sweeps": m.sweeps()}


def sweep_page(
    m: Monkey,
    ref: str,
    user: dict[str, Any],
    sort: str | None,
    reverse: bool,
    constants: bool = False,
) -> dict[str, Any]:
    """A sweep's progress, best run and runs table (``Monkey.compare``: parameters, and
    each metric's last and best), sorted by SORT (best first for a metric); the actions
    USER may take on it (an admin, or the owner of every one of its jobs). Parameters
    with one value in every run are left out of the table and the analysis unless
    CONSTANTS."""
    status = m.sweep_status(ref)
    status["note"] = _dated(status.get("note"))
    table = m.compare(sweep=status["id"], sort=sort or None, reverse=reverse)
    owners = set(m.job_owners([j["job"] for j in status["jobs"]]).values())
    mine = user["admin"] or owners <= {user["name"]}
    from monkey.server.web import sweep_views
    from monkey.tracking.ingest import flatten

    names = list(dict.fromkeys(k for j in status["jobs"] for k in flatten(j["params"] or {})))
    same = sweep_views.constant_params(table["rows"], table["columns"], names)
    shown = names if constants else [n for n in names if n not in same]
    found = sweep_views.analysis(table, shown, status["spec"].get("metric"))
    fixed = sweep_views.param_columns(table["columns"], same)
    hidden = [] if constants else fixed
    columns = sweep_views.runs_columns(table["columns"], found["params"], found["metric"], hidden)
    first = table["rows"][0] if table["rows"] else {}
    best = (status.get("best") or {}).get("job")
    from monkey.server.web.confirm import sweep_questions
    from monkey.server.web.curves import curve_runs

    by_id = {j["job"]: j for j in status["jobs"]}  # the curves in the table's order
    return {
        "curves": curve_runs([by_id[r["job"]] for r in table["rows"] if r["job"] in by_id]),
        "report": _report_plots(m, status, [n for n in names if n not in same]),
        "sweep": status,
        "table": table,
        "columns": columns,
        "groups": sweep_views.column_groups(columns),
        "constants": [(n, cell(first.get(c))) for n, c in zip(same, fixed)],
        "showing_constants": constants,
        "analysis": found,
        "best": best,
        "early": set(status.get("stopped_early") or []),
        "editable": mine,  # its note and tags (the owner of every run or an admin)
        "actions": SWEEP_ACTIONS if mine and status["jobs"] else (),
        "ask": sweep_questions(m, status) if mine and status["jobs"] else {},
        "reverse": reverse,
    }


def _report_plots(m: Monkey, status: dict[str, Any], params: list[str]) -> dict[str, Any]:
    """What `monkey report` draws of a sweep's analysis (``monkey.tracking.sweep_analysis``,
    inline SVG): its metric against each parameter of PARAMS, one dot per run, and the best
    value so far as the runs ended."""
    from monkey.tracking import sweep_analysis as sa

    found = m.sweep_analysis(status["id"], status)
    metric, runs = found.get("metric"), found["runs"]
    if not metric or not runs:
        return {"scatters": [], "progress": ""}
    name = metric["name"]
    shown = [p for p in params if any(p in r["params"] for r in runs)]
    return {
        "metric": name,
        "scatters": [sa.scatter(runs, p, name, found["best"]) for p in shown],
        "progress": sa.progress(found["best_so_far"], name),
    }


_PROVIDER_SHOWN = ("name", "type", "queued", "running", "error")


def providers_page(m: Monkey) -> dict[str, Any]:
    """Each provider's jobs and what its kind describes (``Monkey.provider_status``), and
    the machines monkey created with their state, size, spot, age and cost so far."""
    status = m.provider_status()
    providers = [
        {
            **p,
            "more": ", ".join(
                f"{k} {cell(v)}" for k, v in p.items() if k not in _PROVIDER_SHOWN and v != []
            ),
        }
        for p in status["providers"]
    ]
    instances = [
        {
            **i,
            "age_text": duration(i["age"]),
            "idle_text": "-" if i.get("idle") is None else duration(i["idle"]),
            "cost_text": _dollars(i["cost"]),
        }
        for i in m.monkey_instances()
    ]
    return {"core": status["core"], "providers": providers, "instances": instances}


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def compare_page(m: Monkey, refs: list[str]) -> dict[str, Any]:
    """Jobs REFS side by side (``Monkey.compare``): one row per parameter or metric (last
    and best), one column per job; ``differs`` marks the rows whose values are not all
    the same."""
    if len(refs) < 2:
        raise MonkeyError("pick at least two jobs to compare (the boxes of the jobs list)")
    if len(refs) > 20:
        raise MonkeyError(f"{len(refs)} jobs: compare at most 20 at once")
    table = m.compare(refs)
    jobs = [r["job"] for r in table["rows"]]
    rows = []
    for column in table["columns"]:
        if column == "job":
            continue
        values = [cell(r.get(column)) for r in table["rows"]]
        rows.append({"name": column, "values": values, "differs": len(set(values)) > 1})
    from monkey.server.web.curves import curve_runs, jobs_of

    return {"jobs": jobs, "rows": rows, "curves": curve_runs(jobs_of(m, jobs))}
