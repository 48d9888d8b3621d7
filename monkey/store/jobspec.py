"""Store queries for job.yml specs: the resolved spec recorded with each job."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from monkey.models import dumps


class JobSpecStore:
    """Mixin of Store: one resolved job.yml per job (table ``job_specs``)."""

    db: sqlite3.Connection

    def set_job_spec(self, juid: str, spec: dict[str, Any]) -> None:
        """Record the job's resolved spec (call inside the transaction creating the job)."""
        self.db.execute(
            "INSERT OR REPLACE INTO job_specs(juid, spec) VALUES (?, ?)", (juid, dumps(spec))
        )

    def job_spec(self, juid: str) -> dict[str, Any] | None:
        """The resolved spec a job was submitted with, or None (no job.yml)."""
        row = self.db.execute("SELECT spec FROM job_specs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else None
