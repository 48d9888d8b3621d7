"""Store queries of job dependencies (`run --after JOB`, `--after-any JOB`): a job waits
queued until each job it names has succeeded (or, with ``any``, ended); when one it needs to
succeed ends otherwise, the core cancels it (see ``doomed``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENDED = ("succeeded", "failed", "cancelled", "preempted", "lost")  # models.TERMINAL
# A queued sweep cell waits for a free slot of its sweep with not_before at HOLD; the
# core's sweep hook releases it (not_before = 0) when the sweep's max_parallel allows.
HOLD = 1e18
_UNMET = (
    "(p.state IS NULL OR CASE d.any WHEN 1 THEN p.state NOT IN "
    f"({', '.join(repr(s) for s in ENDED)}) ELSE p.state != 'succeeded' END)"
)
# A condition on a row of `jobs` (named `jobs`): it waits for another job.
WAITING = (
    "EXISTS (SELECT 1 FROM job_deps d LEFT JOIN jobs p ON p.juid = d.dep "
    f"WHERE d.juid = jobs.juid AND {_UNMET})"
)


def touch_dependents(db: sqlite3.Connection, dep: str, now: float) -> None:
    """Mark the queued jobs that wait for DEP as changed (``updated_at``): DEP's ending, or
    its start again, may let them go or hold them back (the dashboard and Monkey Web
    redraw changed jobs only). The jobs are looked up by id among DEP's dependents (`+state`
    keeps SQLite from walking every queued job instead: a cost per ending that grew with
    the queue)."""
    db.execute(
        "UPDATE jobs SET updated_at = ? WHERE +state = 'queued' "
        "AND juid IN (SELECT juid FROM job_deps WHERE dep = ?)",
        (now, dep),
    )


class DependencyStore:
    """Mixin of Store: table ``job_deps``."""

    db: sqlite3.Connection

    @staticmethod
    def _add_deps(db: sqlite3.Connection, juids: Sequence[str], deps: dict[str, bool]) -> None:
        """Make each of JUIDS wait for DEPS (job -> whether any ending will do)."""
        db.executemany(
            "INSERT OR REPLACE INTO job_deps(juid, dep, any) VALUES (?, ?, ?)",
            [(juid, dep, int(any_end)) for juid in juids for dep, any_end in deps.items()],
        )

    def dependencies(self, juid: str) -> list[dict[str, Any]]:
        """The jobs JUID runs after: [{"job", "any", "state" (None: removed), "met"}]."""
        rows = self.db.execute(
            f"SELECT d.dep, d.any, p.state, NOT {_UNMET} FROM job_deps d "
            "LEFT JOIN jobs p ON p.juid = d.dep WHERE d.juid = ? ORDER BY d.dep",
            (juid,),
        ).fetchall()
        return [{"job": r[0], "any": bool(r[1]), "state": r[2], "met": bool(r[3])} for r in rows]

    def waiting_on(self, juids: Iterable[str]) -> dict[str, list[str]]:
        """Of JUIDS, those waiting for other jobs: juid -> the jobs not yet as needed."""
        juids = list(juids)
        out: dict[str, list[str]] = {}
        for start in range(0, len(juids), 500):
            chunk = juids[start : start + 500]
            rows = self.db.execute(
                "SELECT d.juid, d.dep FROM job_deps d LEFT JOIN jobs p ON p.juid = d.dep "
                f"WHERE d.juid IN ({', '.join('?' * len(chunk))}) AND {_UNMET} ORDER BY d.dep",
                chunk,
            )
            for juid, dep in rows:
                out.setdefault(juid, []).append(dep)
        return out

    def dependents(self, juids: Iterable[str]) -> list[tuple[str, str]]:
        """(job, the one of JUIDS it waits for) of each queued or paused job that waits for
        one of JUIDS and is not among them."""
        juids = list(juids)
        out: list[tuple[str, str]] = []
        for start in range(0, len(juids), 500):
            chunk = juids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            out += self.db.execute(
                "SELECT d.juid, d.dep FROM job_deps d JOIN jobs j ON j.juid = d.juid "
                f"WHERE d.dep IN ({marks}) AND j.state IN ('queued', 'paused') "
                f"AND d.juid NOT IN ({marks}) ORDER BY j.seq",
                chunk + chunk,
            ).fetchall()
        return out

    def doomed(self, since: float = 0.0) -> list[tuple[str, str, str | None, str]]:
        """Queued or paused jobs that can no longer run: (juid, the dependency that had to
        succeed, its state (None: removed), the job's state); only those where the job or
        that dependency changed at SINCE or later (0: all)."""
        if self.db.execute("SELECT 1 FROM job_deps LIMIT 1").fetchone() is None:
            return []
        bad = "('failed', 'cancelled', 'preempted', 'lost')"
        if not since:
            return self.db.execute(
                "SELECT d.juid, d.dep, p.state, j.state FROM jobs j INDEXED BY jobs_state "
                "JOIN job_deps d ON d.juid = j.juid LEFT JOIN jobs p ON p.juid = d.dep "
                "WHERE j.state IN ('queued', 'paused') AND d.any = 0 "
                f"AND (p.state IS NULL OR p.state IN {bad}) ORDER BY j.seq"
            ).fetchall()
        return self.db.execute(  # dependencies that ended lately, then jobs re-queued lately
            "SELECT d.juid, d.dep, p.state, j.state FROM jobs p INDEXED BY jobs_updated "
            "JOIN job_deps d ON d.dep = p.juid JOIN jobs j ON j.juid = d.juid "
            f"WHERE p.updated_at >= ? AND p.state IN {bad} AND d.any = 0 "
            "AND j.state IN ('queued', 'paused') "
            "UNION "
            "SELECT d.juid, d.dep, p.state, j.state FROM jobs j INDEXED BY jobs_updated "
            "JOIN job_deps d ON d.juid = j.juid LEFT JOIN jobs p ON p.juid = d.dep "
            "WHERE j.updated_at >= ? AND j.state IN ('queued', 'paused') AND d.any = 0 "
            f"AND (p.state IS NULL OR p.state IN {bad})",
            (since, since),
        ).fetchall()
