"""Queries of Monkey Web's pages: a page of jobs after a cursor (keyset on the indexed
``seq`` order, so the 1,000th page costs what the first does) and the last change to any
job (what the live pages watch)."""

from __future__ import annotations

import sqlite3

from monkey.models import Job
from monkey.store.rows import _JOB_COLUMNS, _job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# What the jobs page sorts by: a column, or the attempts' run time summed (a live one up
# to the page's now, the one argument).
JOB_SORTS = {
    "job": "seq",
    "name": "name",
    "owner": "owner",
    "state": "state",
    "provider": "provider",
    "sweep": "sweep",
    "tries": "attempts",
    "age": "-created_at",  # the youngest first
    "runtime": "(SELECT SUM(COALESCE(a.ended_at, ?) - a.started_at) FROM attempts a "
    "WHERE a.juid = jobs.juid AND a.started_at IS NOT NULL)",
    "exit": "exit_code",
}


# A metric's value per job for the jobs page's sort: its last point, or its lowest or
# highest (the one argument: the series' name).
_SERIES = (
    "FROM metric_series s JOIN metrics m ON m.series = s.id WHERE s.juid = jobs.juid AND s.name = ?"
)
_METRIC_SORTS = {
    "last": f"(SELECT m.value {_SERIES} ORDER BY m.rowid DESC LIMIT 1)",
    "min": f"(SELECT MIN(m.value) {_SERIES})",
    "max": f"(SELECT MAX(m.value) {_SERIES})",
}


def _sort_by(sort: str, now: float) -> tuple[str, list[Any]]:
    """The ORDER BY expression of SORT (a key of JOB_SORTS, ``param:NAME`` (a flattened
    parameter: dots go down) or ``last|min|max:METRIC``) and its arguments."""
    if sort in JOB_SORTS:
        by = JOB_SORTS[sort]
        return by, [now] if "?" in by else []
    kind, _, name = sort.partition(":")
    if kind == "param":
        import json

        return "json_extract(params, ?)", ["$." + ".".join(json.dumps(p) for p in name.split("."))]
    return _METRIC_SORTS[kind], [name]


class WebQueries:
    """Mixin for Store: the jobs page's reads."""

    db: sqlite3.Connection

    def job_page(
        self,
        *,
        state: str | None = None,
        provider: str | None = None,
        owner: str | None = None,
        sweep: str | None = None,
        name: str | None = None,
        juids: list[str] | None = None,
        tag: str | None = None,
        before: str | None = None,
        limit: int = 50,
        sort: str | None = None,
        descending: bool = False,
        offset: int = 0,
        now: float = 0.0,
    ) -> list[Job]:
        """Up to LIMIT jobs newest first, older than job BEFORE (its id) when given, else
        from the OFFSET-th; or,
        by SORT (see ``_sort_by``; DESCENDING; the jobs without a value last, newest first
        among equals), from the
        OFFSET-th on. NAME matches a part of the job's name, or all of it when it is a
        shell-style pattern ('exp-*'); JUIDS (a search's hits) keeps only those, TAG only
        the jobs tagged so; NOW is
        when a running attempt's run time ends."""
        where, args = _page_filter(state, provider, owner, sweep, name, juids, tag)
        if before is not None and sort is None:
            where.append("seq < COALESCE((SELECT seq FROM jobs WHERE juid = ?), -1)")
            args.append(before)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if sort is None:  # from job BEFORE on, or the OFFSET-th
            sql += f" ORDER BY seq DESC LIMIT {max(1, int(limit))}"
            if before is None and offset:
                sql += f" OFFSET {max(0, int(offset))}"
        else:  # the page's ids sorted first (narrow rows), then their rows read
            by, more = _sort_by(sort, now)
            order = "DESC" if descending else "ASC"
            picked = "SELECT seq FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
            picked += f" ORDER BY {by} IS NULL, {by} {order}, seq DESC"
            picked += f" LIMIT {max(1, int(limit))} OFFSET {max(0, int(offset))}"
            seqs = [r[0] for r in self.db.execute(picked, args + more * 2)]
            rank = {q: i for i, q in enumerate(seqs)}
            rows = self.db.execute(
                f"SELECT seq, {_JOB_COLUMNS} FROM jobs WHERE seq IN ({', '.join('?' * len(seqs))})",
                seqs,
            ).fetchall()
            return [_job(r[1:]) for r in sorted(rows, key=lambda r: rank[r[0]])]
        return [_job(r) for r in self.db.execute(sql, args)]

    def count_page(
        self,
        *,
        state: str | None = None,
        provider: str | None = None,
        owner: str | None = None,
        sweep: str | None = None,
        name: str | None = None,
        juids: list[str] | None = None,
        tag: str | None = None,
    ) -> int:
        """How many jobs ``job_page`` pages through with the same filters."""
        where, args = _page_filter(state, provider, owner, sweep, name, juids, tag)
        sql = "SELECT COUNT(*) FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        return int(self.db.execute(sql, args).fetchone()[0])

    def metric_first_wall(self, juid: str) -> float | None:
        """When job JUID logged its first metric point (the first of each series, by its
        own index: no scan of a long series), or None."""
        firsts = self.db.execute(
            "SELECT (SELECT wall FROM metrics WHERE series = s.id ORDER BY rowid LIMIT 1) "
            "FROM metric_series s WHERE s.juid = ?",
            (juid,),
        ).fetchall()
        walls = [w for (w,) in firsts if w is not None]
        return min(walls) if walls else None

    def last_job_change(self) -> tuple[float, int]:
        """(the latest ``updated_at`` of any job, how many jobs): changes when a job is
        added, changes state or is removed (the jobs_updated index answers)."""
        row = self.db.execute("SELECT MAX(updated_at), COUNT(*) FROM jobs").fetchone()
        return float(row[0] or 0.0), int(row[1])


def _page_filter(
    state: str | None,
    provider: str | None,
    owner: str | None,
    sweep: str | None,
    name: str | None,
    juids: list[str] | None,
    tag: str | None = None,
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    if tag:
        where.append("juid IN (SELECT juid FROM job_tags WHERE tag = ?)")
        args.append(tag)
    for column, value in (("state", state), ("provider", provider), ("owner", owner)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if sweep:
        where.append("sweep = ?")
        args.append(sweep)
    if name and any(c in name for c in "*?["):  # shell-style, as `monkey compare --name`
        where.append("name GLOB ?")
        args.append(name.replace("[!", "[^"))
    elif name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("name LIKE ? ESCAPE '\\'")
        args.append(f"%{escaped}%")
    if juids is not None:
        where.append(f"juid IN ({', '.join('?' * len(juids)) or 'NULL'})")
        args += juids
    return where, args
