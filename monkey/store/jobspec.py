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
        """The resolved spec a job was submitted with, or None (no job.yml), read through
        ``stored_spec``: its shape holds whatever the row says."""
        row = self.db.execute("SELECT spec FROM job_specs WHERE juid = ?", (juid,)).fetchone()
        return read_spec(row[0]) if row else None


def read_spec(text: Any) -> dict[str, Any] | None:
    """A job_specs row's text as ``stored_spec`` reads it (None when it is no JSON)."""
    from monkey.specrecord import stored_spec

    try:
        return stored_spec(json.loads(text))
    except (TypeError, ValueError, RecursionError):
        return None
