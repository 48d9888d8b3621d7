"""Store queries of `monkey rm` and `monkey gc`: deleting jobs, and what jobs reference."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from monkey.models import later_pattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_DIGEST = later_pattern(r"\b[0-9a-f]{64}\b")


class HousekeepingStore:
    """Mixin of Store: delete jobs with every row that names them; digests jobs reference."""

    db: sqlite3.Connection

    tx: Any  # Store.tx
    forget_sweep_notes: Any  # Store.forget_sweep_notes

    def juid_tables(self) -> list[str]:
        """Every table with a ``juid`` column."""
        names = [
            r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return [
            n
            for n in names
            if any(c[1] == "juid" for c in self.db.execute(f"PRAGMA table_info({n})"))
        ]

    def delete_jobs(self, juids: Iterable[str]) -> int:
        """Delete the jobs and every row naming them, and the sweeps left with no job, in one
        transaction; the count deleted. Jobs that are not ended are refused by the caller (see
        monkey.housekeeping)."""
        juids = list(juids)
        tables = self.juid_tables()
        done = 0
        sweeps: set[str] = set()
        with self.tx() as db:
            for start in range(0, len(juids), 500):
                chunk = juids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                sweeps.update(
                    r[0]
                    for r in db.execute(
                        f"SELECT DISTINCT sweep FROM jobs WHERE juid IN ({marks}) "
                        "AND sweep IS NOT NULL",
                        chunk,
                    )
                )
                db.execute(
                    f"DELETE FROM metrics WHERE series IN "
                    f"(SELECT id FROM metric_series WHERE juid IN ({marks}))",
                    chunk,
                )
                for table in tables:
                    if table != "jobs":
                        db.execute(f"DELETE FROM {table} WHERE juid IN ({marks})", chunk)
                done += db.execute(f"DELETE FROM jobs WHERE juid IN ({marks})", chunk).rowcount
            db.executemany(
                "DELETE FROM sweeps WHERE id = ? AND NOT EXISTS "
                "(SELECT 1 FROM jobs WHERE sweep = sweeps.id)",
                [(s,) for s in sorted(sweeps)],
            )
            if sweeps:
                self.forget_sweep_notes(db)
        return done

    def referenced_digests(self) -> set[str]:
        """Every blob digest written anywhere in a job's records (snapshot, datasets, git
        diff, packages, job.yml digests...): blobs gc must keep, before expanding manifests."""
        found: set[str] = set()
        for table in self.juid_tables():
            if table in ("events", "metric_series", "run_summary"):
                continue  # no blob is named there, and they are the largest tables
            for row in self.db.execute(f"SELECT * FROM {table}"):
                found.update(_DIGEST.findall(" ".join(v for v in row if isinstance(v, str))))
        return found

    def owner_digests(self, owner: str | None = None) -> dict[str | None, set[str]]:
        """The blob digests written in each owner's jobs' records (as ``referenced_digests``,
        by the jobs' owner; OWNER's only when given)."""
        where, args = ("WHERE j.owner = ?", (owner,)) if owner is not None else ("", ())
        found: dict[str | None, set[str]] = {}
        for table in self.juid_tables():
            if table in ("events", "metric_series", "run_summary"):
                continue
            source = "jobs j" if table == "jobs" else f"{table} t JOIN jobs j ON j.juid = t.juid"
            columns = "j.*" if table == "jobs" else "t.*"
            for row in self.db.execute(f"SELECT j.owner, {columns} FROM {source} {where}", args):
                text = " ".join(v for v in row[1:] if isinstance(v, str))
                found.setdefault(row[0], set()).update(_DIGEST.findall(text))
        return found

    def job_specs(self) -> dict[str, dict[str, Any]]:
        """{juid: recorded job.yml spec} of every job that has one."""
        from monkey.store.jobspec import read_spec

        specs = {j: read_spec(s) for j, s in self.db.execute("SELECT juid, spec FROM job_specs")}
        return {juid: spec for juid, spec in specs.items() if spec is not None}

    def forget_blobs(self, digests: Iterable[str]) -> None:
        """Remove the blobs table's rows of DIGESTS (before their files are deleted)."""
        rows: list[Any] = [(d,) for d in digests]
        with self.tx() as db:
            db.executemany("DELETE FROM blobs WHERE digest = ?", rows)
            db.executemany("DELETE FROM blob_uploads WHERE digest = ?", rows)

    def job_ids(self) -> set[str]:
        """Every job's juid."""
        return {r[0] for r in self.db.execute("SELECT juid FROM jobs")}
