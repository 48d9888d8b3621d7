"""Store queries of quotas (`monkey server quota`): per user (or ``*``, everyone) and per
provider (or ``*``, all), the most concurrent jobs, GPUs and estimated $/hour a user's live
attempts may take and the user's fair-share weight; and why a queued job is held back by
one (``jobs.held``)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable

from monkey.store.deps import WAITING

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ANY = "*"  # a quota entry's user or provider that stands for all
LIMITS = ("jobs", "gpus", "spend")
# A quota entry's settings: its limits of running jobs, a fair-share weight, and (on the
# entry for all providers) the bytes of blobs the user's uploads and jobs may hold.
FIELDS = (*LIMITS, "share", "storage")
UNLIMITED = -1  # a limit set to "unlimited": a more specific entry lifting a wider one


class QuotaStore:
    """Mixin of Store: table ``quotas`` and the ``held`` column of ``jobs``."""

    db: sqlite3.Connection

    def quotas(self) -> list[dict[str, Any]]:
        """Every quota entry: {"user", "provider", "jobs", "gpus", "spend", "share",
        "storage"} (None: not set here; UNLIMITED: a limit lifted), by user then provider,
        ``*`` first."""
        rows = self.db.execute(
            "SELECT user, provider, jobs, gpus, spend, share, storage FROM quotas "
            "ORDER BY user != '*', user, provider != '*', provider"
        ).fetchall()
        return [dict(zip(("user", "provider", *FIELDS), r)) for r in rows]

    def set_quota(self, user: str, provider: str, limits: dict[str, float | None]) -> None:
        """Set LIMITS (only those given, a share among them) of the entry for USER on
        PROVIDER, making it."""
        now = time.time()
        self.db.execute(
            "INSERT INTO quotas(user, provider, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(user, provider) DO UPDATE SET updated_at = excluded.updated_at",
            (user, provider, now),
        )
        for name, value in limits.items():
            assert name in FIELDS
            self.db.execute(
                f"UPDATE quotas SET {name} = ? WHERE user = ? AND provider = ?",
                (value, user, provider),
            )

    def remove_quota(self, user: str, provider: str) -> bool:
        return (
            self.db.execute(
                "DELETE FROM quotas WHERE user = ? AND provider = ?", (user, provider)
            ).rowcount
            > 0
        )

    def quota_use(self, provider: str | None = None) -> dict[tuple[str | None, str], list[float]]:
        """(owner, provider) -> [jobs, GPUs, $/hour, slots] their live attempts take
        (PROVIDER's only when given): what quotas count, and the fair share's slots."""
        sql = (
            "SELECT j.owner, j.provider, COUNT(*), "
            "SUM(COALESCE(json_extract(j.resources, '$.gpus'), 0)), SUM(COALESCE(a.price, 0)), "
            "SUM(MAX(1, COALESCE(json_extract(j.resources, '$.cpus'), 1))) "
            "FROM attempts a JOIN jobs j ON j.juid = a.juid WHERE a.state = 'live'"
        )
        args: tuple[str, ...] = ()
        if provider is not None:
            sql, args = sql + " AND j.provider = ?", (provider,)
        rows = self.db.execute(sql + " GROUP BY j.owner, j.provider", args)
        return {(o, p): [n, g or 0, s or 0.0, c] for o, p, n, g, s, c in rows}

    def hold(self, juids: Iterable[str], reason: str) -> None:
        """Record that queued JUIDS wait for REASON (a quota); no write when it is known.
        Holding or releasing a job is a change of it (``updated_at``): the dashboard and
        Monkey Web show it."""
        now = time.time()
        self.db.executemany(
            "UPDATE jobs SET held = ?, updated_at = ? "
            "WHERE juid = ? AND state = 'queued' AND held IS NOT ?",
            [(reason, now, j, reason) for j in juids],
        )

    def hold_owner(self, owner: str | None, provider: str, reason: str) -> None:
        """Record REASON for every ready queued job of OWNER on PROVIDER."""
        if self.db.execute(
            "SELECT 1 FROM jobs INDEXED BY jobs_owner_ready WHERE state = 'queued' "
            f"AND owner IS ? AND provider = ? AND held IS NOT ? AND NOT {WAITING} LIMIT 1",
            (owner, provider, reason),
        ).fetchone():
            self.db.execute(
                "UPDATE jobs INDEXED BY jobs_owner_ready SET held = ?, updated_at = ? "
                f"WHERE state = 'queued' AND owner IS ? AND provider = ? AND held IS NOT ? "
                f"AND NOT {WAITING}",
                (reason, time.time(), owner, provider, reason),
            )

    def release(
        self, provider: str | None, keep_owners: Iterable[str | None] = (), keep: Iterable[str] = ()
    ) -> None:
        """Clear the held reason of PROVIDER's jobs (every provider's with None) except
        KEEP's and KEEP_OWNERS' (held again this pass)."""
        keep, owners = set(keep), set(keep_owners)
        sql = "SELECT juid, owner FROM jobs INDEXED BY jobs_held WHERE held IS NOT NULL"
        args: tuple[str, ...] = ()
        if provider is not None:
            sql, args = sql + " AND provider = ?", (provider,)
        free = [j for j, o in self.db.execute(sql, args) if j not in keep and o not in owners]
        now = time.time()
        self.db.executemany(
            "UPDATE jobs SET held = NULL, updated_at = ? WHERE juid = ?", [(now, j) for j in free]
        )

    def held_counts(self) -> dict[tuple[str | None, str], int]:
        """(owner, provider) -> how many of their queued jobs a quota holds back."""
        rows = self.db.execute(
            "SELECT owner, provider, COUNT(*) FROM jobs INDEXED BY jobs_held "
            "WHERE held IS NOT NULL AND state = 'queued' GROUP BY owner, provider"
        )
        return {(o, p): n for o, p, n in rows}


def settings_for(quotas: list[dict[str, Any]], user: str | None, provider: str) -> dict[str, float]:
    """The settings (FIELDS) that apply to USER on PROVIDER: each from the most specific
    entry that sets it (user+provider, user+*, *+provider, *+*); unset ones left out."""
    out: dict[str, float] = {}
    rank = {(user, provider): 0, (user, ANY): 1, (ANY, provider): 2, (ANY, ANY): 3}
    found: dict[str, int] = {}
    for q in quotas:
        r = rank.get((q["user"], q["provider"]))
        if r is None:
            continue
        for name in FIELDS:
            if q.get(name) is not None and r < found.get(name, 4):
                found[name] = r
                out[name] = q[name]
    return out


def limits_for(quotas: list[dict[str, Any]], user: str | None, provider: str) -> dict[str, float]:
    """The limits that bind USER on PROVIDER (see ``settings_for``); those lifted or never
    set are left out."""
    found = settings_for(quotas, user, provider)
    return {k: v for k, v in found.items() if k in LIMITS and v != UNLIMITED}


def share_for(quotas: list[dict[str, Any]], user: str | None, provider: str) -> float:
    """USER's fair-share weight on PROVIDER: 1 unless an entry sets it."""
    return settings_for(quotas, user, provider).get("share", 1.0)


def storage_limit(quotas: list[dict[str, Any]], user: str | None) -> int | None:
    """The bytes of blobs USER may hold (see ``settings_for``: the user's entry for all
    providers, else the default's); None: no limit."""
    found = settings_for(quotas, user, ANY).get("storage")
    return None if found is None or found == UNLIMITED else int(found)
