"""Store queries for job.yml specs: the resolved spec recorded with each job."""

from __future__ import annotations

import json
import sqlite3

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JobSpecStore:
    """Mixin of Store: one resolved job.yml per job (table ``job_specs``)."""

    db: sqlite3.Connection

    def job_spec(self, juid: str) -> dict[str, Any] | None:
        """The resolved spec a job was submitted with, or None (no job.yml)."""
        row = self.db.execute("SELECT spec FROM job_specs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else None
