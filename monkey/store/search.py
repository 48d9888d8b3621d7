"""Full-text search over jobs' commands and output: an SQLite FTS5 index filled incrementally.

The tables are made on first use (not by a migration), so a database stays usable with an
SQLite built without FTS5; only `monkey search` then says so. Every table has a ``juid``
column, so `monkey rm` (HousekeepingStore.delete_jobs) removes a job's rows with it.
"""

from __future__ import annotations

import sqlite3

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store.db import Store

_SCHEMA = (
    # One row per line of output (source: stdout/stderr and the attempt) or the command.
    "CREATE VIRTUAL TABLE IF NOT EXISTS search_lines USING "
    "fts5(juid UNINDEXED, source UNINDEXED, line, tokenize = 'unicode61')",
    # How far each log file is indexed, in bytes.
    "CREATE TABLE IF NOT EXISTS search_files(juid TEXT NOT NULL, file TEXT NOT NULL, "
    "offset INTEGER NOT NULL, PRIMARY KEY (juid, file)) WITHOUT ROWID",
    # Jobs whose output is indexed in full, with their attempt count then (a retry adds one).
    "CREATE TABLE IF NOT EXISTS search_done(juid TEXT PRIMARY KEY, attempts INTEGER NOT NULL) "
    "WITHOUT ROWID",
)
_ENDED = ("succeeded", "failed", "cancelled")


class SearchIndex:
    """The search tables of one Store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.db = store.db
        try:
            with store.tx() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
        except sqlite3.OperationalError as exc:
            if "fts5" not in str(exc):
                raise
            raise MonkeyError(
                f"this Python's SQLite {sqlite3.sqlite_version} has no FTS5 full-text "
                "search; use a Python whose sqlite3 has it (python.org and most "
                "distributions' builds do)"
            ) from None

    def pending(self) -> list[tuple[str, str, str, int, bool]]:
        """(juid, name, argv JSON, attempts, ended) of the jobs whose output is not all indexed."""
        rows = self.db.execute(
            "SELECT j.juid, j.name, j.argv, j.attempts, j.state IN (?, ?, ?) FROM jobs j "
            "LEFT JOIN search_done d ON d.juid = j.juid "
            "WHERE d.juid IS NULL OR d.attempts != j.attempts",
            _ENDED,
        )
        return [(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows]

    def offsets(self, juid: str) -> dict[str, int]:
        """File -> bytes indexed of JUID's logs."""
        return dict(
            self.db.execute("SELECT file, offset FROM search_files WHERE juid = ?", (juid,))
        )

    def add(
        self,
        juid: str,
        lines: list[tuple[str, str]],
        offsets: dict[str, int],
        done_attempts: int | None,
    ) -> None:
        """Index LINES (source, text) of JUID, record the new file OFFSETS, and the job as
        done (at DONE_ATTEMPTS attempts) unless None; one transaction."""
        with self.store.tx() as db:
            db.executemany(
                "INSERT INTO search_lines(juid, source, line) VALUES (?, ?, ?)",
                [(juid, source, text) for source, text in lines],
            )
            db.executemany(
                "INSERT OR REPLACE INTO search_files(juid, file, offset) VALUES (?, ?, ?)",
                [(juid, file, offset) for file, offset in offsets.items()],
            )
            if done_attempts is not None:
                db.execute(
                    "INSERT OR REPLACE INTO search_done(juid, attempts) VALUES (?, ?)",
                    (juid, done_attempts),
                )

    def query(self, text: str, limit: int) -> list[dict[str, Any]]:
        """Jobs with a line holding the words of TEXT in order, newest first: {"job", "name",
        "state", "source", "line"} with the job's last matching line."""
        phrase = '"' + text.replace('"', '""') + '"'
        rows = self.db.execute(
            "SELECT j.juid, j.name, j.state, m.source, m.line FROM "
            "(SELECT juid, source, line, max(rowid) FROM search_lines WHERE search_lines MATCH ? "
            "GROUP BY juid) m JOIN jobs j ON j.juid = m.juid ORDER BY j.seq DESC LIMIT ?",
            (phrase, limit),
        )
        return [
            {"job": r[0], "name": r[1], "state": r[2], "source": r[3], "line": r[4]} for r in rows
        ]
