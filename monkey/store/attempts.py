"""Store queries of attempts: opening, starting, ending and listing each try of a job."""

from __future__ import annotations

import sqlite3
import time

from monkey.models import Attempt, Job, State, can_transition
from monkey.store.deps import ENDED, touch_dependents
from monkey.store.errors import IllegalTransition
from monkey.store.rows import _ATTEMPT_COLUMNS, _attempt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class AttemptStore:
    """Mixin of Store: the rows of ``attempts`` and the job moves that go with them."""

    db: sqlite3.Connection

    tx: Any  # Store.tx
    _event: Any  # Store._event

    def begin_attempt(
        self, job: Job, instance: str, run_dir: str, gpus: str = "", now: float | None = None
    ) -> Attempt | None:
        """Move a queued job to dispatching and open its next attempt, atomically."""
        now = time.time() if now is None else now
        n = job.attempts + 1
        with self.tx() as db:
            cur = db.execute(
                "UPDATE jobs SET state = 'dispatching', attempts = ?, updated_at = ?, instance = ?, "
                "reason = NULL, exit_code = NULL, finished_at = NULL, front = 0, held = NULL "
                "WHERE juid = ? AND state = 'queued' AND attempts = ?",
                (n, now, instance, job.juid, job.attempts),
            )
            if cur.rowcount != 1:
                return None
            # The instance's size, spot and price, its price shared by the job's part of its
            # CPUs (all of it when its CPUs are unknown).
            cpus = max(1, job.resources.cpus)
            size, spot, price = db.execute(
                "SELECT size, spot, price * min(1.0, ? * 1.0 / coalesce("
                "json_extract(extra, '$.slots'), ?)) FROM instances WHERE id = ?",
                (cpus, cpus, instance),
            ).fetchone() or (None, 0, None)
            db.execute(
                "INSERT INTO attempts(juid, n, instance, state, run_dir, gpus, size, spot, price) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (job.juid, n, instance, "live", run_dir, gpus, size, spot, price),
            )
            self._event(db, job.juid, n, "state", "queued", "dispatching", instance, now)
        job.attempts, job.state, job.instance = n, State.DISPATCHING, instance
        return Attempt(
            job.juid,
            n,
            instance,
            "live",
            run_dir=run_dir,
            gpus=gpus,
            size=size,
            spot=bool(spot),
            price=price,
        )

    def attempt_started(self, juid: str, n: int, pid: int, started_at: float) -> bool:
        """Record the process start and move the job from dispatching to running."""
        with self.tx() as db:
            db.execute(
                "UPDATE attempts SET pid = ?, started_at = ?, heartbeat_at = ? "
                "WHERE juid = ? AND n = ? AND state = 'live'",
                (pid, started_at, started_at, juid, n),
            )
            cur = db.execute(
                "UPDATE jobs SET state = 'running', updated_at = ?, "
                "started_at = COALESCE(started_at, ?) "
                "WHERE juid = ? AND state = 'dispatching' AND attempts = ?",
                (time.time(), started_at, juid, n),
            )
            if cur.rowcount == 1:
                self._event(
                    db, juid, n, "state", "dispatching", "running", f"pid {pid}", started_at
                )
            return cur.rowcount == 1

    def set_unreachable(self, juid: str, n: int, since: float | None, detail: str) -> bool:
        """Record that attempt N's instance is out of reach since SINCE (None: reached again),
        with an event saying DETAIL; False when nothing changed (already so, or not live)."""
        now = time.time()
        have = "IS NULL" if since is not None else "IS NOT NULL"
        with self.tx() as db:
            cur = db.execute(
                f"UPDATE jobs SET unreachable_since = ?, updated_at = ? WHERE juid = ? AND "
                f"attempts = ? AND state IN ('dispatching', 'running') AND unreachable_since {have}",
                (since, now, juid, n),
            )
            if cur.rowcount != 1:
                return False
            self._event(
                db,
                juid,
                n,
                "unreachable" if since is not None else "reachable",
                None,
                None,
                detail,
                now,
            )
        return True

    def adrift_attempts(self, instance: str) -> list[Attempt]:
        """Attempts on INSTANCE lost while it was out of reach, whose end it has not told."""
        rows = self.db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE adrift = 1 "
            "AND instance = ? ORDER BY juid, n",
            (instance,),
        )
        return [_attempt(r) for r in rows]

    def adrift_instances(self) -> list[tuple[str, str]]:
        """(provider, instance) of every instance with adrift attempts."""
        return self.db.execute(
            "SELECT DISTINCT j.provider, a.instance FROM attempts a JOIN jobs j ON j.juid = a.juid "
            "WHERE a.adrift = 1"
        ).fetchall()

    def settle_adrift(
        self, juid: str, n: int, exit_code: int | None, signal: int | None, detail: str | None
    ) -> bool:
        """An adrift attempt's instance told how it ended (DETAIL, recorded as a `late exit`
        event with its exit code or signal), or knows nothing of it (DETAIL None)."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE attempts SET adrift = 0, exit_code = COALESCE(?, exit_code), "
                "signal = COALESCE(?, signal) WHERE juid = ? AND n = ? AND adrift = 1",
                (exit_code, signal, juid, n),
            )
            if cur.rowcount == 1 and detail:
                self._event(db, juid, n, "late exit", None, None, detail, time.time())
            return cur.rowcount == 1

    def shift_unreachable(self, seconds: float) -> None:
        """Move every `unreachable since` SECONDS later: the time no core ran is not counted."""
        if seconds > 0:
            with self.tx() as db:
                db.execute(
                    "UPDATE jobs SET unreachable_since = unreachable_since + ?, "
                    "updated_at = ? WHERE unreachable_since IS NOT NULL",
                    (seconds, time.time()),
                )

    def end_attempt(
        self,
        juid: str,
        n: int,
        *,
        final: State,
        exit_code: int | None,
        signal: int | None,
        reason: str,
        requeue_after: float | None = None,
        offset: int | None = None,
        now: float | None = None,
        requeue_kind: str = "retry",
        adrift: bool = False,
        ran: float | None = None,
        move_to: str | None = None,
    ) -> State | None:
        """Close a live attempt and move its job to ``final`` (then to queued when
        ``requeue_after`` is given), all in one transaction. Returns the job's new state,
        or None when the attempt was not live (already handled). REQUEUE_KIND names the
        re-queue's event: ``retry`` (counted against --retries) or ``preempt`` (not; the
        job goes to the head of the queue). ADRIFT: its instance is out of reach, and may
        still run it (see ``adrift_attempts``). NOW: when it ended (the wall clock where it ran);
        RAN: how long it ran, as measured there on a monotonic clock. The attempt's end is its
        start plus RAN when both are known, and never before its start: a step of a wall
        clock between the two makes no negative run time. MOVE_TO: the provider the job,
        queued again (FINAL), now belongs to (a `moved` event), at the head of its queue: its
        own gave it up before it ran (REASON says why)."""
        clock = time.time()
        now = clock if now is None else now
        with self.tx() as db:
            cur = db.execute(
                "UPDATE attempts SET state = 'ended', ended_at = CASE WHEN started_at IS NULL "
                "THEN ? WHEN ? IS NOT NULL THEN started_at + ? ELSE MAX(?, started_at) END, "
                "exit_code = ?, signal = ?, reason = ?, events_offset = COALESCE(?, events_offset), "
                "adrift = ? WHERE juid = ? AND n = ? AND state = 'live'",
                (now, ran, ran, now, exit_code, signal, reason, offset, int(adrift), juid, n),
            )
            if cur.rowcount != 1:
                return None
            now, state = db.execute(
                "SELECT a.ended_at, j.state FROM attempts a JOIN jobs j ON j.juid = a.juid "
                "WHERE a.juid = ? AND a.n = ?",
                (juid, n),
            ).fetchone()
            old = State(state)
            if not can_transition(old, final):
                raise IllegalTransition(f"job {juid}: {old.value} -> {final.value} is not allowed")
            db.execute(
                "UPDATE jobs SET state = ?, exit_code = ?, reason = ?, request = NULL, "
                "finished_at = MAX(?, COALESCE(started_at, ?)), updated_at = ?, "
                "unreachable_since = NULL, phase = NULL WHERE juid = ?",
                (final.value, exit_code, reason, now, now, now, juid),
            )
            self._event(db, juid, n, "state", old.value, final.value, reason, now)
            if move_to is not None:
                (was,) = db.execute("SELECT provider FROM jobs WHERE juid = ?", (juid,)).fetchone()
                db.execute(
                    "UPDATE jobs SET provider = ?, front = 1, not_before = 0, finished_at = NULL "
                    "WHERE juid = ?",
                    (move_to, juid),
                )
                self._event(db, juid, n, "moved", was, move_to, f"{was} gave it up", now)
            if final.value in ENDED:
                touch_dependents(db, juid, now)
            if requeue_after is None:
                return final
            db.execute(
                "UPDATE jobs SET state = 'queued', not_before = ?, finished_at = NULL, "
                "updated_at = ?, front = ? WHERE juid = ?",
                # The back-off counts on this process's clock, which dispatch reads.
                (clock + requeue_after, now, int(requeue_kind == "preempt"), juid),
            )
            self._event(
                db,
                juid,
                n,
                requeue_kind,
                final.value,
                "queued",
                f"{requeue_kind} in {requeue_after:.0f}s",
                now,
            )
            return State.QUEUED

    def auto_retries(self, juid: str, kind: str = "retry") -> int:
        """Automatic re-queues of KIND (``retry``, ``preempt``) since the user last re-queued
        the job by hand."""
        return self.db.execute(
            "SELECT COUNT(*) FROM events WHERE juid = ? AND kind = ? AND id > "
            "COALESCE((SELECT MAX(id) FROM events WHERE juid = ? AND kind = 'user'), 0)",
            (juid, kind, juid),
        ).fetchone()[0]

    def gave_up(self, juid: str, since: float) -> set[str]:
        """The providers that gave JUID up (it moved away from them) since SINCE."""
        rows = self.db.execute(
            "SELECT old FROM events WHERE juid = ? AND kind = 'moved' AND ts >= ?", (juid, since)
        )
        return {r[0] for r in rows}

    def get_attempt(self, juid: str, n: int) -> Attempt | None:
        row = self.db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE juid = ? AND n = ?", (juid, n)
        ).fetchone()
        return _attempt(row) if row else None

    def attempts(self, juid: str) -> list[Attempt]:
        rows = self.db.execute(
            f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE juid = ? ORDER BY n", (juid,)
        )
        return [_attempt(r) for r in rows]

    def last_attempt_end(self, instance: str) -> float | None:
        """When the last attempt that ran on INSTANCE ended (None: none has)."""
        row = self.db.execute(
            "SELECT MAX(ended_at) FROM attempts WHERE instance = ?", (instance,)
        ).fetchone()
        return row[0] if row else None

    def live_attempts(self, instance: str | None = None) -> list[Attempt]:
        sql = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state = 'live'"
        args: tuple[Any, ...] = ()
        if instance:
            sql += " AND instance = ?"
            args = (instance,)
        return [_attempt(r) for r in self.db.execute(sql + " ORDER BY juid, n", args)]
