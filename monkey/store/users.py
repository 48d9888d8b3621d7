"""Store queries of `monkey server`: its users (tokens kept as SHA-256 digests only) and
the owners of jobs."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class UserStore:
    """Mixin of Store: table ``users`` and the ``owner`` column of ``jobs``."""

    db: sqlite3.Connection
    tx: Any  # Store.tx

    def add_user(self, name: str, digest: str, admin: bool = False) -> None:
        """Record user NAME with its token's DIGEST; MonkeyError when NAME exists."""
        try:
            self.db.execute(
                "INSERT INTO users(name, digest, admin, created_at) VALUES (?, ?, ?, ?)",
                (name, digest, int(admin), time.time()),
            )
        except sqlite3.IntegrityError:
            raise MonkeyError(
                f"user {name!r} exists; give a new token with `monkey server user token {name}`"
            ) from None

    def set_user_digest(self, name: str, digest: str) -> bool:
        """Replace NAME's token digest (the old token is refused from now on)."""
        return (
            self.db.execute("UPDATE users SET digest = ? WHERE name = ?", (digest, name)).rowcount
            > 0
        )

    def remove_user(self, name: str) -> bool:
        """Remove NAME and its quotas (`monkey server quota`)."""
        with self.tx() as db:
            gone = db.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount > 0
            db.execute("DELETE FROM quotas WHERE user = ?", (name,))
        return gone

    def users(self) -> list[dict[str, Any]]:
        """Every user: name, digest, admin, created_at, last_used; by name."""
        rows = self.db.execute(
            "SELECT name, digest, admin, created_at, last_used FROM users ORDER BY name"
        ).fetchall()
        return [
            {"name": n, "digest": d, "admin": bool(a), "created_at": c, "last_used": u}
            for n, d, a, c, u in rows
        ]

    def is_admin(self, name: str) -> bool:
        """Whether user NAME is an admin of this main node."""
        row = self.db.execute("SELECT admin FROM users WHERE name = ?", (name,)).fetchone()
        return bool(row and row[0])

    def sweep_owners(self, sweep: str) -> set[str | None]:
        """Who submitted the jobs of SWEEP (None: not recorded)."""
        rows = self.db.execute("SELECT DISTINCT owner FROM jobs WHERE sweep = ?", (sweep,))
        return {owner for (owner,) in rows}

    def count_users(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM users").fetchone()[0]

    def touch_user(self, name: str, now: float) -> None:
        """Record that NAME's token was just used."""
        self.db.execute("UPDATE users SET last_used = ? WHERE name = ?", (now, name))

    def set_owner(self, juids: Sequence[str], owner: str) -> None:
        """Record who submitted JUIDS."""
        self.db.executemany("UPDATE jobs SET owner = ? WHERE juid = ?", [(owner, j) for j in juids])

    def job_owners(self, juids: Sequence[str]) -> dict[str, str | None]:
        """juid -> who submitted it (None: not recorded)."""
        out: dict[str, str | None] = {}
        for i in range(0, len(juids), 500):
            part = list(juids[i : i + 500])
            out.update(
                self.db.execute(
                    f"SELECT juid, owner FROM jobs WHERE juid IN ({','.join('?' * len(part))})",
                    part,
                )
            )
        return out
