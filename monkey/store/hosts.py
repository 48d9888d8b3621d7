"""Store queries of the clean-up SSH hosts owe (`rm`, `gc`, `du --hosts`; carried out by the
core, see monkey/core/cleanup.py) and of what each host held when last measured."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

BUCKET = " bucket"  # a cloud provider's bucket in host_chores: instance "<provider> bucket"
CACHE = " cache"  # a cluster's cache claim in host_chores: instance "<provider> cache"


class HostChoresStore:
    """Mixin of Store: chores owed to SSH hosts, and their measured usage."""

    db: sqlite3.Connection

    tx: Any  # Store.tx

    def owe_job_folders(
        self, juids: Iterable[str], hosts: Sequence[str], buckets: Sequence[str]
    ) -> int:
        """Owe the deletion of the JUIDS' folders on every host of the HOSTS kinds (SSH) one
        of their attempts ran on, and in the bucket of every provider of the BUCKETS kinds
        (clouds) (called before the jobs' rows go: a kill between leaves a chore for a job
        that still exists, which the core skips); how many chores. The kinds: see
        monkey.drivers.HOST_FOLDERS and BUCKET_FILES."""
        juids = list(juids)
        host_marks, bucket_marks = ", ".join("?" * len(hosts)), ", ".join("?" * len(buckets))
        now, done = time.time(), 0
        with self.tx() as db:
            for start in range(0, len(juids), 500):
                chunk = juids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                done += db.execute(
                    "INSERT INTO host_chores(provider, instance, what, job, created_at) "
                    "SELECT DISTINCT i.provider, a.instance, 'run', a.juid, ? FROM attempts a "
                    f"JOIN instances i ON i.id = a.instance WHERE i.kind IN ({host_marks}) "
                    f"AND a.juid IN ({marks})",
                    (now, *hosts, *chunk),
                ).rowcount
                done += db.execute(
                    "INSERT INTO host_chores(provider, instance, what, job, created_at) "
                    "SELECT DISTINCT i.provider, i.provider || ?, 'run', a.juid, ? FROM attempts a "
                    f"JOIN instances i ON i.id = a.instance WHERE i.kind IN ({bucket_marks}) "
                    f"AND a.juid IN ({marks})",
                    (BUCKET, now, *buckets, *chunk),
                ).rowcount
        return done

    def owe_hosts(
        self,
        what: str,
        grace: float | None,
        kinds: Sequence[str],
        buckets: Sequence[str],
        caches: Sequence[str] = (),
    ) -> list[str]:
        """Owe WHAT ("gc" with GRACE seconds, or "du") to every host of the KINDS (SSH) this
        home has reached (a gc: and to the bucket of every provider of the BUCKETS kinds it
        used), and to the cache claim of each cluster of CACHES (providers); the hosts."""
        hosts = self.db.execute(
            f"SELECT id, provider FROM instances WHERE kind IN ({', '.join('?' * len(kinds))}) "
            "AND state != 'terminated' ORDER BY id",
            tuple(kinds),
        ).fetchall()
        if what == "gc":
            hosts += [
                (p + BUCKET, p)
                for (p,) in self.db.execute(
                    f"SELECT DISTINCT provider FROM instances WHERE kind IN ({', '.join('?' * len(buckets))}) "
                    "ORDER BY provider",
                    tuple(buckets),
                )
            ]
        hosts += [(p + CACHE, p) for p in caches]
        now = time.time()
        with self.tx() as db:
            db.executemany(
                "INSERT INTO host_chores(provider, instance, what, grace, created_at) "
                "VALUES (?,?,?,?,?)",
                [(p, i, what, grace, now) for i, p in hosts],
            )
        return [i for i, _ in hosts]

    def host_chores(self) -> list[dict[str, Any]]:
        """Every chore owed, oldest first."""
        keys = ("id", "provider", "instance", "what", "job", "grace", "created_at")
        rows = self.db.execute(f"SELECT {', '.join(keys)} FROM host_chores ORDER BY id")
        return [dict(zip(keys, r)) for r in rows]

    def chores_done(self, ids: Iterable[int]) -> None:
        with self.tx() as db:
            db.executemany("DELETE FROM host_chores WHERE id = ?", [(i,) for i in ids])

    def record_host_usage(self, provider: str, instance: str, usage: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO host_usage(instance, provider, usage, measured_at) VALUES (?,?,?,?) "
                "ON CONFLICT(instance) DO UPDATE SET usage = excluded.usage, "
                "measured_at = excluded.measured_at",
                (instance, provider, json.dumps(usage), time.time()),
            )

    def host_usage(self) -> dict[str, dict[str, Any]]:
        """{instance: {provider, usage, measured_at}} as last measured."""
        rows = self.db.execute("SELECT instance, provider, usage, measured_at FROM host_usage")
        return {i: {"provider": p, "usage": json.loads(u), "measured_at": t} for i, p, u, t in rows}
