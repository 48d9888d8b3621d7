"""Store queries of `monkey rerun`: which job a job runs again, and what it changed."""

from __future__ import annotations

import json
import sqlite3

from monkey.models import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class RerunStore:
    """Mixin of Store: one row per rerun job (table ``job_reruns``)."""

    db: sqlite3.Connection

    @staticmethod
    def record_rerun(
        db: sqlite3.Connection, juid: str, rerun_of: str, changes: dict[str, Any]
    ) -> None:
        """Record, inside the caller's transaction, that JUID runs RERUN_OF again with CHANGES."""
        db.execute(
            "INSERT OR REPLACE INTO job_reruns(juid, rerun_of, changes) VALUES (?, ?, ?)",
            (juid, rerun_of, dumps(changes)),
        )

    def rerun_of(self, juid: str) -> dict[str, Any] | None:
        """{"job": the job JUID runs again, "changes": what differs}, or None."""
        row = self.db.execute(
            "SELECT rerun_of, changes FROM job_reruns WHERE juid = ?", (juid,)
        ).fetchone()
        return {"job": row[0], "changes": json.loads(row[1])} if row else None
