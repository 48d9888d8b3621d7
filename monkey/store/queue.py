"""Store queries of the queue: which queued jobs are ready, in which order, for whom, and
what runs (the core's dispatch pass reads these)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

from monkey.models import RETRY_DELAY_MAX, Job
from monkey.store.deps import HOLD, WAITING
from monkey.store.rows import _JOB_COLUMNS, _job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Literal


class QueueQueries:
    """Mixin of Store: the queue of jobs."""

    db: sqlite3.Connection
    tx: Any  # Store.tx
    _event: Any  # Store._event

    def ready_jobs(
        self,
        now: float,
        limit: int = 1000,
        provider: str | None = None,
        owner: str | None | Literal[False] = False,
    ) -> Iterator[Job]:
        """Queued jobs whose back-off has passed and that wait for no other job: preempted
        ones first, then by priority, then oldest first (each decoded when the caller gets to
        it); only OWNER's when given (None: jobs with no owner recorded)."""
        sql = (
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state = 'queued' AND not_before <= ? "
            f"AND NOT {WAITING}"
        )
        args: list[Any] = [now]
        if provider is not None:
            sql += " AND provider = ?"
            args.append(provider)
        if owner is not False:
            sql += " AND owner IS ?"
            args.append(owner)
        rows = self.db.execute(
            sql + " ORDER BY front DESC, priority DESC, seq LIMIT ?", (*args, limit)
        ).fetchall()
        return (_job(r) for r in rows)

    def queued_owners(self) -> list[str | None]:
        """The owners of queued jobs, each found by one index seek (a handful, however many
        jobs each has queued)."""
        owners: list[str | None] = []
        row = self.db.execute(
            "SELECT 1 FROM jobs INDEXED BY jobs_owner_ready WHERE state = 'queued' "
            "AND owner IS NULL LIMIT 1"
        ).fetchone()
        if row:
            owners.append(None)
        last = ""
        while True:
            row = self.db.execute(
                "SELECT owner FROM jobs INDEXED BY jobs_owner_ready WHERE state = 'queued' "
                "AND owner > ? ORDER BY owner LIMIT 1",
                (last,),
            ).fetchone()
            if row is None:
                return owners
            last = row[0]
            owners.append(last)

    def set_priority(self, juid: str, priority: int, actor: str | None = None) -> bool:
        """Change a queued or paused job's priority (ACTOR's request); False when it is in
        another state."""
        with self.tx() as db:
            done = db.execute(
                "UPDATE jobs SET priority = ?, updated_at = ? WHERE juid = ? "
                "AND state IN ('queued', 'paused')",
                (priority, time.time(), juid),
            ).rowcount
            if done:
                detail = f"priority {priority}"
                self._event(db, juid, None, "user", None, None, detail, time.time(), actor)
        return bool(done)

    def has_ready(self, provider: str, now: float) -> bool:
        """Whether the provider has a queued job ready to run."""
        return (
            self.db.execute(
                "SELECT 1 FROM jobs WHERE state = 'queued' AND not_before <= ? AND provider = ? "
                f"AND NOT {WAITING} LIMIT 1",
                (now, provider),
            ).fetchone()
            is not None
        )

    def queued_providers(self) -> list[str]:
        """Providers named by queued jobs."""
        rows = self.db.execute("SELECT DISTINCT provider FROM jobs WHERE state = 'queued'")
        return sorted(r[0] for r in rows)

    def live_usage(self) -> list[tuple[str, int, str, str | None, str, int]]:
        """(instance, cpus, gpus, memory asked or None, juid, attempt) of every live attempt."""
        return self.db.execute(
            "SELECT a.instance, json_extract(j.resources, '$.cpus'), a.gpus, "
            "json_extract(j.resources, '$.memory'), a.juid, a.n FROM attempts a "
            "JOIN jobs j ON j.juid = a.juid WHERE a.state = 'live'"
        ).fetchall()

    def next_not_before(self, after: float) -> float | None:
        """When the first queued job whose back-off ends after AFTER becomes ready."""
        row = self.db.execute(
            # Named: without statistics the planner would walk jobs_state instead.
            "SELECT MIN(not_before) FROM jobs INDEXED BY jobs_queued "
            "WHERE state = 'queued' AND not_before > ?",
            (after,),
        ).fetchone()
        return row[0]

    def end_absurd_backoffs(self, now: float) -> int:
        """Make ready now the queued jobs whose back-off ends further ahead of NOW than any
        back-off lasts: the wall clock stepped back since it began (not the sweep cells held
        at HOLD). How many there were."""
        with self.tx() as db:
            return db.execute(
                "UPDATE jobs SET not_before = ? WHERE state = 'queued' AND not_before > ? "
                "AND not_before < ?",
                (now, now + RETRY_DELAY_MAX, HOLD),
            ).rowcount

    def requested_jobs(self) -> list[Job]:
        rows = self.db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE request IS NOT NULL")
        return [_job(r) for r in rows]
