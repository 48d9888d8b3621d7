"""Store queries of the SSH provider's features: memory placement and `run --outputs`."""

from __future__ import annotations

import json
import sqlite3


class SSHQueries:
    """Mixin of Store: memory held by live attempts; output globs of jobs (``job_outputs``)."""

    db: sqlite3.Connection

    def live_memory(self) -> list[tuple[str, str]]:
        """(instance, memory asked) of every live attempt whose job asked for memory."""
        return self.db.execute(
            "SELECT a.instance, json_extract(j.resources, '$.memory') FROM attempts a "
            "JOIN jobs j ON j.juid = a.juid "
            "WHERE a.state = 'live' AND json_extract(j.resources, '$.memory') IS NOT NULL"
        ).fetchall()

    def outputs(self, juid: str) -> list[str]:
        """The globs of files to fetch back when the job ends (relative to its folder)."""
        row = self.db.execute("SELECT globs FROM job_outputs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else []
