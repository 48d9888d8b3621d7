"""Store queries of `run --outputs` and `run --image`."""

from __future__ import annotations

import json
import sqlite3


class OutputQueries:
    """Mixin of Store: output globs (``job_outputs``) and images (``job_images``) of jobs."""

    db: sqlite3.Connection

    def outputs(self, juid: str) -> list[str]:
        """The globs of files to fetch back when the job ends (relative to its folder)."""
        row = self.db.execute("SELECT globs FROM job_outputs WHERE juid = ?", (juid,)).fetchone()
        return json.loads(row[0]) if row else []

    def job_image(self, juid: str) -> dict[str, str] | None:
        """The image the job runs in, {"ref", "digest"}; None when it has none."""
        row = self.db.execute("SELECT image FROM job_images WHERE juid = ?", (juid,)).fetchone()
        if row is None:
            return None
        try:
            image = json.loads(row[0])
        except ValueError:
            return None
        return image if isinstance(image, dict) else None
