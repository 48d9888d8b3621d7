"""SQL of experiment tracking: metric series and points, run summaries, sweeps."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import repeat

from monkey.models import dumps
from monkey.store.deps import HOLD

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Rows written per transaction by large writes (sweeps): other writers get in between.
WRITE_BATCH = 1000

# A batch of points as columns: distinct names, then per point the index of its name, its
# step (or None), value (NaN is stored as NULL) and wall time in seconds.
Columns = tuple[
    list[str], Iterable[int], Iterable[int | None], Iterable[float | None], Iterable[float]
]


class TrackingStore:
    """Mixin of ``Store``: metrics, summaries and sweeps."""

    db: sqlite3.Connection
    tx: Any
    _series_ids: dict[tuple[str, str], int]
    _next_of_day: Callable[[sqlite3.Connection, str], int]  # Store's static method

    # -- ingestion ----------------------------------------------------------------------

    def _claim_offset(self, db: sqlite3.Connection, juid: str, n: int, offset: int) -> bool:
        """Advance the attempt's events offset; False when OFFSET was already applied."""
        cur = db.execute(
            "UPDATE attempts SET events_offset = ? WHERE juid = ? AND n = ? AND events_offset < ?",
            (offset, juid, n, offset),
        )
        return cur.rowcount == 1

    def _series(self, db: sqlite3.Connection, juid: str, names: Iterable[str]) -> dict[str, int]:
        cache = self.__dict__.setdefault("_series_ids", {})
        out = {}
        for name in names:
            sid = cache.get((juid, name))
            if sid is None:
                db.execute(
                    "INSERT OR IGNORE INTO metric_series(juid, name) VALUES (?, ?)", (juid, name)
                )
                sid = db.execute(
                    "SELECT id FROM metric_series WHERE juid = ? AND name = ?", (juid, name)
                ).fetchone()[0]
                cache[(juid, name)] = sid
            out[name] = sid
        return out

    def ingest_metrics(
        self,
        juid: str,
        n: int,
        offset: int,
        batches: list[Columns],
        params: dict[str, Any] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> bool:
        """Store one batch and advance the attempt's offset in one transaction.

        Returns False (and stores nothing) when the batch at OFFSET was stored before.
        """
        with self.tx() as db:
            if not self._claim_offset(db, juid, n, offset):
                return False
            for batch in batches:
                self._insert_columns(db, juid, n, batch)
            if params:
                row = db.execute("SELECT params FROM jobs WHERE juid = ?", (juid,)).fetchone()
                merged = {**json.loads(row[0]), **params} if row else params
                db.execute("UPDATE jobs SET params = ? WHERE juid = ?", (dumps(merged), juid))
            if summary:
                db.executemany(
                    "INSERT OR REPLACE INTO run_summary(juid, name, value) VALUES (?, ?, ?)",
                    [(juid, k, json.dumps(v)) for k, v in summary.items()],
                )
        return True

    def _insert_columns(self, db: sqlite3.Connection, juid: str, n: int, batch: Columns) -> None:
        names, index, steps, values, walls = batch
        ids = self._series(db, juid, names)
        series = [ids[name] for name in names]
        db.executemany(  # rows zipped from columns in C: no Python loop per point
            "INSERT INTO metrics(series, attempt, step, value, wall) VALUES (?, ?, ?, ?, ?)",
            zip(map(series.__getitem__, index), repeat(n), steps, values, walls),
        )

    def heartbeat_metrics(
        self,
        juid: str,
        n: int,
        ts: float,
        offset: int,
        cpu: float | None,
        rss: int | None,
        batch: Columns | None,
        phase: str | None = None,
    ) -> None:
        """A heartbeat (liveness, usage, what the attempt does before its command: PHASE)
        and its system metrics, stored once."""
        with self.tx() as db:
            db.execute(
                "UPDATE attempts SET heartbeat_at = ?, cpu = COALESCE(?, cpu), "
                "rss = COALESCE(?, rss) WHERE juid = ? AND n = ?",
                (ts, cpu, rss, juid, n),
            )
            db.execute(
                "UPDATE jobs SET phase = ? WHERE juid = ? AND attempts = ? AND phase IS NOT ?",
                (phase, juid, n, phase),
            )
            if self._claim_offset(db, juid, n, offset) and batch is not None:
                self._insert_columns(db, juid, n, batch)

    # -- queries ------------------------------------------------------------------------

    def metric_names(self, juid: str) -> list[str]:
        rows = self.db.execute(
            "SELECT name FROM metric_series WHERE juid = ? ORDER BY name", (juid,)
        )
        return [r[0] for r in rows]

    def metric_points(
        self, juid: str, name: str | None = None
    ) -> dict[str, list[tuple[int | None, float | None, float]]]:
        """Series name -> [(step, value, wall)] in logging order."""
        sql = "SELECT id, name FROM metric_series WHERE juid = ?"
        args: tuple[Any, ...] = (juid,)
        if name is not None:
            sql += " AND name = ?"
            args += (name,)
        out: dict[str, list[tuple[int | None, float | None, float]]] = {}
        for sid, sname in self.db.execute(sql + " ORDER BY name", args).fetchall():
            out[sname] = self.db.execute(
                "SELECT step, value, wall FROM metrics WHERE series = ? ORDER BY rowid", (sid,)
            ).fetchall()
        return out

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Reads that all see one state of the store (a read transaction: writers go on
        meanwhile); inside another transaction, that one's."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN")  # deferred: the state is the one of its first read
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    def metric_series_ids(self, juid: str) -> dict[str, int]:
        """Series name -> its id, of job JUID's metrics."""
        rows = self.db.execute(
            "SELECT name, id FROM metric_series WHERE juid = ? ORDER BY name", (juid,)
        )
        return dict(rows.fetchall())

    def metric_ends(self, series: int) -> tuple[int, int] | None:
        """(first, last) rowid of SERIES' points, or None: two seeks of its index."""
        row = self.db.execute(
            "SELECT (SELECT rowid FROM metrics WHERE series = ?1 ORDER BY rowid LIMIT 1), "
            "(SELECT rowid FROM metrics WHERE series = ?1 ORDER BY rowid DESC LIMIT 1)",
            (series,),
        ).fetchone()
        return None if row[0] is None else (int(row[0]), int(row[1]))

    def metric_blocks(self, series: int, after: int, block: int) -> list[tuple[Any, ...]]:
        """SERIES' points from rowid AFTER on, summed up per BLOCK rowids: (block number,
        first rowid, last rowid, points, points with a step, lowest and highest step, wall
        and value), in order; one pass over its index."""
        return self.db.execute(
            "SELECT rowid / ?3, MIN(rowid), MAX(rowid), COUNT(*), COUNT(step), MIN(step), "
            "MAX(step), MIN(wall), MAX(wall), MIN(value), MAX(value) FROM metrics "
            "WHERE series = ?1 AND rowid >= ?2 GROUP BY rowid / ?3 ORDER BY 1",
            (series, after, block),
        ).fetchall()

    def metric_window(
        self, series: int, after: int, until: int | None = None
    ) -> Iterator[tuple[int, int | None, float | None, float]]:
        """(rowid, step, value, wall) of SERIES' points with a rowid above AFTER and at most
        UNTIL, in logging order, read as they are consumed (a range of its index)."""
        if until is None:
            until = 2**63 - 1
        yield from self.db.execute(
            "SELECT rowid, step, value, wall FROM metrics "
            "WHERE series = ? AND rowid > ? AND rowid <= ? ORDER BY rowid",
            (series, after, until),
        )

    def metric_points_many(
        self, juids: list[str], name: str
    ) -> dict[str, list[tuple[int | None, float | None, float]]]:
        """juid -> [(step, value, wall)] of one metric, for the jobs that logged it."""
        out: dict[str, list[tuple[int | None, float | None, float]]] = {}
        for chunk in _chunks(juids, 500):
            rows = self.db.execute(
                "SELECT s.juid, m.step, m.value, m.wall FROM metric_series s "
                "JOIN metrics m ON m.series = s.id "
                f"WHERE s.name = ? AND s.juid IN ({', '.join('?' * len(chunk))}) "
                "ORDER BY m.series, m.rowid",
                [name, *chunk],
            )
            for juid, step, value, wall in rows:
                out.setdefault(juid, []).append((step, value, wall))
        return out

    def metric_stats(self, juids: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """juid -> name -> {last, step, min, max, count} (NaN points count, never compare)."""
        out: dict[str, dict[str, dict[str, Any]]] = {j: {} for j in juids}
        for chunk in _chunks(juids, 500):
            rows = self.db.execute(
                "SELECT s.juid, s.name, MIN(m.value), MAX(m.value), COUNT(*), MAX(m.rowid) "
                "FROM metric_series s JOIN metrics m ON m.series = s.id "
                f"WHERE s.juid IN ({', '.join('?' * len(chunk))}) GROUP BY s.id",
                chunk,
            ).fetchall()
            marks = ", ".join("?" * len(rows))
            last = (
                {
                    rowid: (step, value)
                    for rowid, step, value in self.db.execute(
                        f"SELECT rowid, step, value FROM metrics WHERE rowid IN ({marks})",
                        [r[5] for r in rows],
                    )
                }
                if rows
                else {}
            )
            for juid, name, lo, hi, count, rowid in rows:
                step, value = last.get(rowid, (None, None))
                out[juid][name] = {
                    "last": value,
                    "step": step,
                    "min": lo,
                    "max": hi,
                    "count": count,
                }
        return out

    def summaries(self, juids: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {j: {} for j in juids}
        for chunk in _chunks(juids, 500):
            rows = self.db.execute(
                "SELECT juid, name, value FROM run_summary "
                f"WHERE juid IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            for juid, name, value in rows:
                out[juid][name] = json.loads(value)
        return out

    def set_job_packages(self, juid: str, digest: str, size: int) -> None:
        """Record the blob listing the packages a job was submitted with."""
        with self.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO blobs(digest, size, created_at) VALUES (?, ?, ?)",
                (digest, size, time.time()),
            )
            db.execute(
                "INSERT OR REPLACE INTO job_packages(juid, digest) VALUES (?, ?)", (juid, digest)
            )

    def job_packages(self, juid: str) -> str | None:
        row = self.db.execute("SELECT digest FROM job_packages WHERE juid = ?", (juid,)).fetchone()
        return row[0] if row else None

    # -- sweeps -------------------------------------------------------------------------

    def create_sweep(
        self, name: str, spec: dict[str, Any], state: str = "running", now: float | None = None
    ) -> str:
        """A new sweep id (sw-YY-MM-DD-NNN) for SPEC, in STATE."""
        now = time.time() if now is None else now
        day = time.strftime("%y-%m-%d", time.localtime(now))
        with self.tx() as db:
            sid = f"sw-{day}-{self._next_of_day(db, f'sweep:{day}'):03d}"
            db.execute(
                "INSERT INTO sweeps(id, name, state, spec, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (sid, name or sid, state, dumps(spec), now, now),
            )
        return sid

    def get_sweep(self, sid: str) -> dict[str, Any] | None:
        row = self.db.execute(
            "SELECT id, name, state, spec, created_at, updated_at FROM sweeps WHERE id = ?", (sid,)
        ).fetchone()
        return _sweep(row) if row else None

    def list_sweeps(self, states: Iterable[str] | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, name, state, spec, created_at, updated_at FROM sweeps"
        args: list[str] = []
        if states is not None:
            args = list(states)
            sql += f" WHERE state IN ({', '.join('?' * len(args))})"
        return [_sweep(r) for r in self.db.execute(sql + " ORDER BY created_at DESC", args)]

    def resolve_sweep(self, ref: str) -> str:
        """A sweep id from a full id, its name (`sweep --name`), a unique prefix (the `sw-` may
        be left out), or `last`."""
        from monkey.models import MonkeyError

        ref = ref.strip()
        if ref == "last":
            row = self.db.execute(
                "SELECT id FROM sweeps ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
            if not row:
                raise MonkeyError(
                    "no sweeps yet, so `last` names nothing; start one with `monkey sweep`"
                )
            return row[0]
        if not ref.startswith("sw-"):
            job = self.db.execute("SELECT sweep FROM jobs WHERE juid = ?", (ref,)).fetchone()
            if job is not None:  # job and sweep ids look alike: say which one this is
                raise MonkeyError(
                    f"{ref!r} is a job"
                    + (
                        f" of sweep {job[0]}; use {job[0]}"
                        if job[0]
                        else ", not a sweep; sweep ids start with sw-"
                    )
                )
        named = [
            r[0]
            for r in self.db.execute(
                "SELECT id FROM sweeps WHERE name = ? AND id != ? ORDER BY created_at DESC LIMIT 4",
                (ref, ref),
            )
        ]
        if len(named) == 1:
            return named[0]
        if named:
            raise MonkeyError(
                f"several sweeps are named {ref!r} ({', '.join(named[:3])}"
                f"{', ...' if len(named) > 3 else ''}); give the id"
            )
        full = ref if ref.startswith("sw-") else f"sw-{ref}"
        rows = self.db.execute(
            "SELECT id FROM sweeps WHERE id >= ? AND id < ? ORDER BY id LIMIT 3",
            (full, full + "\x7f"),
        ).fetchall()
        if any(r[0] == full for r in rows):
            return full
        if not rows:
            raise MonkeyError(f"no sweep matches {ref!r}; see `monkey list sweeps`")
        if len(rows) > 1:
            raise MonkeyError(f"{ref!r} matches several sweeps; give more of the id")
        return rows[0][0]

    def set_sweep_state(self, sid: str, state: str, only_from: Iterable[str] | None = None) -> bool:
        sql = "UPDATE sweeps SET state = ?, updated_at = ? WHERE id = ?"
        args: list[Any] = [state, time.time(), sid]
        if only_from is not None:
            old = list(only_from)
            sql += f" AND state IN ({', '.join('?' * len(old))})"
            args += old
        with self.tx() as db:
            return db.execute(sql, args).rowcount == 1

    def sweep_jobs_brief(self, sid: str) -> list[tuple[str, str, float, str | None]]:
        """(juid, state, not_before, request) of a sweep's jobs, oldest first."""
        return self.db.execute(
            "SELECT juid, state, not_before, request FROM jobs WHERE sweep = ? ORDER BY seq", (sid,)
        ).fetchall()

    def release_jobs(self, juids: list[str]) -> None:
        """Let held jobs run; in batches, so that a large sweep does not hold the lock long."""
        for chunk in _chunks(juids, WRITE_BATCH):
            with self.tx() as db:
                db.executemany(
                    "UPDATE jobs SET not_before = 0 WHERE juid = ? AND state = 'queued' "
                    "AND not_before >= ?",
                    [(j, HOLD) for j in chunk],
                )


def _sweep(row: tuple[Any, ...]) -> dict[str, Any]:
    sid, name, state, spec, created, updated = row
    return {
        "id": sid,
        "name": name,
        "state": state,
        "spec": json.loads(spec),
        "created_at": created,
        "updated_at": updated,
    }


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
