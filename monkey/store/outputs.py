"""Store queries of `run --outputs`."""

from __future__ import annotations

import json
import sqlite3


class OutputQueries:
    """Mixin of Store: output globs of jobs (``job_outputs``)."""

    db: sqlite3.Connection

    def outputs(self, juid: str) -> list[str]:
        """The globs of files to fetch back when the job ends (relative to its folder)."""
        row = self.db.execute("SELECT globs FROM job_outputs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else []
