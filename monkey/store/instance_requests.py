"""Requests to create or delete an instance (`monkey create|delete instance`): the CLI writes
one and wakes the core, the core carries it out and records how it ended."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_KEYS = (
    "id",
    "action",
    "provider",
    "instance",
    "size",
    "spot",
    "force",
    "state",
    "detail",
    "created_at",
    "updated_at",
)


class InstanceRequestStore:
    """The ``instance_requests`` table; mixed into Store (``self.db``, ``self.tx``)."""

    def add_instance_request(
        self,
        action: str,
        provider: str,
        instance: str | None = None,
        size: str | None = None,
        spot: bool | None = None,
        force: bool = False,
    ) -> int:
        """Record a pending request; its id."""
        now = time.time()
        with self.tx() as db:  # type: ignore[attr-defined]
            cur = db.execute(
                "INSERT INTO instance_requests(action, provider, instance, size, spot, force, "
                "state, created_at, updated_at) VALUES (?,?,?,?,?,?,'pending',?,?)",
                (
                    action,
                    provider,
                    instance,
                    size,
                    None if spot is None else int(spot),
                    int(force),
                    now,
                    now,
                ),
            )
            return int(cur.lastrowid)

    def instance_request(self, rid: int) -> dict[str, Any] | None:
        row = self.db.execute(  # type: ignore[attr-defined]
            f"SELECT {', '.join(_KEYS)} FROM instance_requests WHERE id = ?",
            (rid,),
        ).fetchone()
        return _request(row) if row else None

    def open_instance_requests(self) -> list[dict[str, Any]]:
        """Requests not carried out yet (pending, or working), oldest first."""
        rows = self.db.execute(  # type: ignore[attr-defined]
            f"SELECT {', '.join(_KEYS)} FROM instance_requests "
            "WHERE state IN ('pending', 'working') ORDER BY id"
        )
        return [_request(r) for r in rows]

    def set_instance_request(
        self, rid: int, state: str, instance: str | None = None, detail: str | None = None
    ) -> None:
        """Move a request on: working, done (INSTANCE: the one made) or failed (DETAIL: why)."""
        with self.tx() as db:  # type: ignore[attr-defined]
            db.execute(
                "UPDATE instance_requests SET state = ?, instance = coalesce(?, instance), "
                "detail = coalesce(?, detail), updated_at = ? WHERE id = ?",
                (state, instance, detail, time.time(), rid),
            )


def _request(row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(_KEYS, row))
    out["spot"] = None if out["spot"] is None else bool(out["spot"])
    out["force"] = bool(out["force"])
    return out
