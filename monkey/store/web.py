"""Queries of Monkey Web's pages: a page of jobs after a cursor (keyset on the indexed
``seq`` order, so the 1,000th page costs what the first does) and the last change to any
job (what the live pages watch)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from monkey.models import Job
from monkey.store.rows import _JOB_COLUMNS, _job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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
        before: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Up to LIMIT jobs newest first, older than job BEFORE (its id) when given; NAME
        matches a part of the job's name; JUIDS (a search's hits) keeps only those."""
        where, args = _page_filter(state, provider, owner, sweep, name, juids)
        if before is not None:
            where.append("seq < COALESCE((SELECT seq FROM jobs WHERE juid = ?), -1)")
            args.append(before)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY seq DESC LIMIT {max(1, int(limit))}"
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
    ) -> int:
        """How many jobs ``job_page`` pages through with the same filters."""
        where, args = _page_filter(state, provider, owner, sweep, name, juids)
        sql = "SELECT COUNT(*) FROM jobs" + (" WHERE " + " AND ".join(where) if where else "")
        return int(self.db.execute(sql, args).fetchone()[0])

    def metric_counts(self, juid: str) -> dict[str, tuple[int, int]]:
        """Series name -> (its points, how many of them have a step) of job JUID."""
        rows = self.db.execute(
            "SELECT s.name, COUNT(*), COUNT(m.step) FROM metric_series s "
            "JOIN metrics m ON m.series = s.id WHERE s.juid = ? GROUP BY s.id ORDER BY s.name",
            (juid,),
        )
        return {name: (int(n), int(steps)) for name, n, steps in rows}

    def metric_rows(self, juid: str, name: str) -> Iterator[tuple[int | None, float | None, float]]:
        """The (step, value, wall) of job JUID's series NAME in logging order, read as they
        are consumed (a million points never held at once)."""
        row = self.db.execute(
            "SELECT id FROM metric_series WHERE juid = ? AND name = ?", (juid, name)
        ).fetchone()
        if row is not None:  # by the series' own index: no join per point
            yield from self.db.execute(
                "SELECT step, value, wall FROM metrics WHERE series = ? ORDER BY rowid", (row[0],)
            )

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
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("state", state), ("provider", provider), ("owner", owner)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if sweep:
        where.append("sweep = ?")
        args.append(sweep)
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("name LIKE ? ESCAPE '\\'")
        args.append(f"%{escaped}%")
    if juids is not None:
        where.append(f"juid IN ({', '.join('?' * len(juids)) or 'NULL'})")
        args += juids
    return where, args
