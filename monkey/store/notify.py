"""Store queries of notifications (`monkey notify`): each user's targets and rules, the
targets a job was submitted with (`run --notify`), the outbox and the deliveries.

The outbox is a table of event ids, written by ``Store._event`` in the transaction of the
state change itself (a job ending succeeded, failed, cancelled, preempted or lost), and only
while some target exists: a core killed at any moment loses no event, and a machine with no
target pays one indexed look-up per ending. The core's notifier turns outbox rows into
deliveries (one per matching target, each with an idempotency id made from the event and the
target, so turning the same row twice makes the same deliveries) and deletes them in one
transaction; a delivery is marked sent only after its receiver answered, so one interrupted
mid-send goes again with the same id (at least once)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

from monkey.store.deps import ENDED as NOTIFY_STATES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_ENDED = ", ".join(repr(s) for s in NOTIFY_STATES)  # models.TERMINAL
_TARGET_COLUMNS = "owner, name, kind, shown, options, events, sweep, glob, secret, created_at"
_TARGET_KEYS = tuple(c.strip() for c in _TARGET_COLUMNS.split(","))


def outbox_add(db: sqlite3.Connection, event: int | None) -> None:
    """Put EVENT (a job's ending) in the outbox when some target exists (inside the
    transaction that records it)."""
    db.execute(
        "INSERT OR IGNORE INTO notify_outbox(event) SELECT ? "
        "WHERE EXISTS (SELECT 1 FROM notify_targets)",
        (event,),
    )


class NotifyStore:
    """Mixin of Store: tables ``notify_targets``, ``job_notify``, ``notify_outbox`` and
    ``notify_deliveries``."""

    db: sqlite3.Connection

    # -- targets ------------------------------------------------------------------------

    def notify_targets(self, owner: str | None = None) -> list[dict[str, Any]]:
        """OWNER's targets by name (everyone's with None), each a dict of its columns."""
        sql = f"SELECT {_TARGET_COLUMNS} FROM notify_targets"
        args: tuple[str, ...] = ()
        if owner is not None:
            sql, args = sql + " WHERE owner = ?", (owner,)
        rows = self.db.execute(sql + " ORDER BY owner, name", args)
        return [dict(zip(_TARGET_KEYS, r)) for r in rows]

    def owner_spend(self, owner: str, since: float, now: float, local: bool = False) -> float:
        """Estimated $ OWNER's attempts (with LOCAL, those of jobs with no owner too) spent
        from SINCE to NOW: each priced attempt's $/hour times its time in that span."""
        row = self.db.execute(
            "SELECT SUM(a.price * (MIN(COALESCE(a.ended_at, ?), ?) - MAX(a.started_at, ?)) "
            "/ 3600.0) FROM attempts a JOIN jobs j ON j.juid = a.juid "
            "WHERE a.price IS NOT NULL AND a.started_at IS NOT NULL "
            "AND COALESCE(a.ended_at, ?) > ? AND a.started_at < ? "
            "AND (j.owner = ? OR (? AND j.owner IS NULL))",
            (now, now, since, now, since, now, owner, local),
        ).fetchone()
        return max(0.0, row[0] or 0.0)

    def instance_owners(self, instance: str) -> list[str | None]:
        """The owners of the jobs that ran on INSTANCE (None: jobs with no owner)."""
        rows = self.db.execute(
            "SELECT DISTINCT j.owner FROM attempts a JOIN jobs j ON j.juid = a.juid "
            "WHERE a.instance = ?",
            (instance,),
        )
        return [r[0] for r in rows]

    def notify_target(self, owner: str, name: str) -> dict[str, Any] | None:
        row = self.db.execute(
            f"SELECT {_TARGET_COLUMNS} FROM notify_targets WHERE owner = ? AND name = ?",
            (owner, name),
        ).fetchone()
        return dict(zip(_TARGET_KEYS, row)) if row else None

    def add_notify_target(self, target: dict[str, Any]) -> bool:
        """Record TARGET (keys as ``notify_targets`` gives); False when its owner has one
        of that name already."""
        row = {**target, "created_at": time.time()}
        cur = self.db.execute(
            f"INSERT OR IGNORE INTO notify_targets({_TARGET_COLUMNS}) "
            f"VALUES ({', '.join('?' * len(_TARGET_KEYS))})",
            [row[k] for k in _TARGET_KEYS],
        )
        return cur.rowcount == 1

    def remove_notify_target(self, owner: str, name: str) -> str | None:
        """Remove OWNER's target NAME and its undelivered messages; the name of its secret
        file (None: there was no such target)."""
        with self.tx() as db:  # type: ignore[attr-defined]
            row = db.execute(
                "SELECT secret FROM notify_targets WHERE owner = ? AND name = ?", (owner, name)
            ).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM notify_targets WHERE owner = ? AND name = ?", (owner, name))
            db.execute(
                "DELETE FROM notify_deliveries WHERE owner = ? AND target = ? "
                "AND state = 'pending'",
                (owner, name),
            )
            return str(row[0])

    def notify_secrets(self) -> set[str]:
        """The secret files the targets name."""
        return {r[0] for r in self.db.execute("SELECT secret FROM notify_targets")}

    # -- per job ------------------------------------------------------------------------

    @staticmethod
    def _add_job_notify(
        db: sqlite3.Connection, juids: Iterable[str], targets: dict[str, str]
    ) -> None:
        """Send each of JUIDS' endings to TARGETS (name -> the events, comma-separated)."""
        db.executemany(
            "INSERT OR REPLACE INTO job_notify(juid, target, events) VALUES (?, ?, ?)",
            [(juid, name, events) for juid in juids for name, events in targets.items()],
        )

    def job_notify(self, juid: str) -> dict[str, str]:
        """The targets JUID was submitted with: name -> events."""
        return dict(
            self.db.execute("SELECT target, events FROM job_notify WHERE juid = ?", (juid,))
        )

    # -- the outbox -----------------------------------------------------------------------

    def outbox(self, limit: int = 200) -> list[dict[str, Any]]:
        """The oldest LIMIT outbox rows with their event and job (event and job fields None:
        removed by `rm` since;
        ``requeued``: the job was queued again at once, for a retry or after a preemption)."""
        rows = self.db.execute(
            "SELECT o.event, e.juid, e.attempt, e.ts, e.new, e.detail, j.owner, j.name, "
            "j.sweep, j.state, j.exit_code, j.provider, j.created_at, EXISTS (SELECT 1 FROM "
            "events r WHERE r.juid = e.juid AND r.attempt IS e.attempt AND r.id > e.id AND "
            "r.kind IN ('retry', 'preempt')) "
            "FROM notify_outbox o LEFT JOIN events e ON e.id = o.event "
            "LEFT JOIN jobs j ON j.juid = e.juid ORDER BY o.event LIMIT ?",
            (limit,),
        ).fetchall()
        keys = (
            "event", "juid", "attempt", "ts", "new", "detail", "owner", "name", "sweep",
            "state", "exit_code", "provider", "created_at", "requeued",
        )  # fmt: skip
        return [dict(zip(keys, r)) for r in rows]

    def sweep_finished(self, sweep: str, event: int) -> dict[str, int] | None:
        """When EVENT is the last ending of SWEEP's jobs and none of them is still to run
        (queued, running, paused...): how many ended in each state; else None."""
        if self.db.execute(
            f"SELECT 1 FROM jobs WHERE sweep = ? AND state NOT IN ({_ENDED}) LIMIT 1",
            (sweep,),
        ).fetchone():
            return None  # still under way: the common case, answered first
        last = self.db.execute(
            "SELECT MAX(e.id) FROM events e JOIN jobs j ON j.juid = e.juid "
            f"WHERE j.sweep = ? AND e.new IN ({_ENDED})",
            (sweep,),
        ).fetchone()[0]
        if last != event:
            return None
        return dict(
            self.db.execute(
                "SELECT state, COUNT(*) FROM jobs WHERE sweep = ? GROUP BY state", (sweep,)
            ).fetchall()
        )

    def take_outbox(self, events: Iterable[int], deliveries: list[dict[str, Any]]) -> None:
        """Record DELIVERIES (dicts of id, owner, target, juid, what, body) and drop EVENTS
        from the outbox, in one transaction (the same ids again are ignored)."""
        now = time.time()
        with self.tx() as db:  # type: ignore[attr-defined]
            db.executemany(
                "INSERT OR IGNORE INTO notify_deliveries(id, owner, target, job, what, body, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (d["id"], d["owner"], d["target"], d["juid"], d["what"], d["body"], now)
                    for d in deliveries
                ],
            )
            db.executemany("DELETE FROM notify_outbox WHERE event = ?", [(e,) for e in events])

    # -- deliveries -----------------------------------------------------------------------

    def delivery_heads(self) -> list[dict[str, Any]]:
        """Per target with deliveries pending, the oldest (sent first: in order per target)."""
        rows = self.db.execute(
            "SELECT d.seq, d.id, d.owner, d.target, d.what, d.body, d.tries, d.next_try "
            "FROM notify_deliveries d JOIN (SELECT MIN(seq) AS seq FROM notify_deliveries "
            "WHERE state = 'pending' GROUP BY owner, target) h ON h.seq = d.seq ORDER BY d.seq"
        ).fetchall()
        keys = ("seq", "id", "owner", "target", "what", "body", "tries", "next_try")
        return [dict(zip(keys, r)) for r in rows]

    def delivery_sent(self, seq: int) -> None:
        with self.tx() as db:  # type: ignore[attr-defined]
            db.execute(
                "UPDATE notify_deliveries SET state = 'sent', sent_at = ?, tries = tries + 1, "
                "last_error = NULL WHERE seq = ?",
                (time.time(), seq),
            )

    def delivery_failed(self, seq: int, error: str, next_try: float | None) -> None:
        """A try of delivery SEQ failed with ERROR: tried again at NEXT_TRY, or given up
        (state ``failed``) with None."""
        with self.tx() as db:  # type: ignore[attr-defined]
            db.execute(
                "UPDATE notify_deliveries SET tries = tries + 1, last_error = ?, "
                "next_try = COALESCE(?, next_try), state = CASE WHEN ? IS NULL THEN 'failed' "
                "ELSE state END WHERE seq = ?",
                (error, next_try, next_try, seq),
            )

    def delivery_counts(self, owner: str) -> dict[str, dict[str, Any]]:
        """OWNER's targets: name -> {"pending", "sent", "failed", "last_error"}."""
        out: dict[str, dict[str, Any]] = {}
        for target, state, n in self.db.execute(
            "SELECT target, state, COUNT(*) FROM notify_deliveries WHERE owner = ? "
            "GROUP BY target, state",
            (owner,),
        ):
            out.setdefault(target, {"pending": 0, "sent": 0, "failed": 0, "last_error": None})
            out[target][state] = n
        for target, error in self.db.execute(
            "SELECT target, last_error FROM notify_deliveries WHERE seq IN (SELECT MAX(seq) "
            "FROM notify_deliveries WHERE owner = ? AND last_error IS NOT NULL "
            "AND state != 'sent' GROUP BY target)",
            (owner,),
        ):
            if target in out:
                out[target]["last_error"] = error
        return out

    def job_deliveries(self, juid: str) -> list[dict[str, Any]]:
        """JUID's deliveries: id, target, what, state, tries, last_error, sent_at."""
        keys = ("id", "target", "what", "state", "tries", "last_error", "sent_at")
        rows = self.db.execute(
            f"SELECT {', '.join(keys)} FROM notify_deliveries WHERE job = ? ORDER BY seq",
            (juid,),
        )
        return [dict(zip(keys, r)) for r in rows]

    def prune_deliveries(self, before: float) -> None:
        """Forget deliveries sent (or given up) before BEFORE."""
        with self.tx() as db:  # type: ignore[attr-defined]
            db.execute(
                "DELETE FROM notify_deliveries WHERE state != 'pending' AND created_at < ?",
                (before,),
            )

    def notify_allowed(self) -> list[str]:
        """The address ranges (CIDR) plain users' targets may reach (`server notify-allow`)."""
        return [r[0] for r in self.db.execute("SELECT cidr FROM notify_allow ORDER BY cidr")]

    def set_notify_allowed(self, cidr: str, allowed: bool) -> bool:
        """Add (ALLOWED) or remove the range CIDR; whether anything changed."""
        with self.tx() as db:  # type: ignore[attr-defined]
            if allowed:
                done = db.execute(
                    "INSERT OR IGNORE INTO notify_allow VALUES (?, ?)", (cidr, time.time())
                )
            else:
                done = db.execute("DELETE FROM notify_allow WHERE cidr = ?", (cidr,))
            return done.rowcount > 0
