"""Queries the dashboard polls: jobs changed since a moment, live attempts with their figures."""

from __future__ import annotations

import sqlite3

from monkey.models import Job
from monkey.store.rows import _JOB_COLUMNS, _job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class DashboardQueries:
    """Mixin for Store: cheap reads that let a UI redraw only what changed."""

    db: sqlite3.Connection

    def jobs_updated_since(self, since: float) -> list[Job]:
        """Jobs whose record changed at or after ``since`` (epoch seconds), newest first."""
        rows = self.db.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE updated_at >= ? ORDER BY +seq DESC", (since,)
        )
        return [_job(r) for r in rows]

    def live_attempt_figures(self) -> list[dict[str, Any]]:
        """Every live attempt with its job's name and provider and its last heartbeat figures."""
        rows = self.db.execute(
            "SELECT a.juid, a.n, a.instance, j.provider, j.name, a.started_at, a.heartbeat_at, "
            "a.cpu, a.rss, a.gpus FROM attempts a JOIN jobs j ON j.juid = a.juid "
            "WHERE a.state = 'live' ORDER BY a.instance, a.juid"
        )
        keys = (
            "juid",
            "n",
            "instance",
            "provider",
            "name",
            "started_at",
            "heartbeat_at",
            "cpu",
            "rss",
            "gpus",
        )
        return [dict(zip(keys, r)) for r in rows]

    def latest_metric_values(self, juids: list[str]) -> dict[str, dict[str, float | None]]:
        """juid -> series name -> the last value logged (None for NaN), for jobs that have any."""
        out: dict[str, dict[str, float | None]] = {}
        for start in range(0, len(juids), 500):
            chunk = juids[start : start + 500]
            rows = self.db.execute(
                "SELECT s.juid, s.name, (SELECT m.value FROM metrics m WHERE m.series = s.id "
                "ORDER BY m.rowid DESC LIMIT 1) FROM metric_series s "
                f"WHERE s.juid IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            for juid, name, value in rows:
                out.setdefault(juid, {})[name] = value
        return out
