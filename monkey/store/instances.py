"""Store queries of instances: what providers report of their machines, and why a provider
cannot give one."""

from __future__ import annotations

import json
import sqlite3
import time

from monkey.models import INSTANCE_TRANSITIONS, Instance, InstanceState, dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class InstanceStore:
    """Mixin of Store: the rows of ``instances``, ``instance_events`` and ``provider_status``."""

    db: sqlite3.Connection

    tx: Any  # Store.tx

    def record_instance(
        self,
        inst: Instance,
        reach: str | None = None,
        extra: dict[str, Any] | None = None,
        detail: str = "",
    ) -> bool:
        """Record what a provider reports of INST: inserted when new, its state changed only
        by a legal move (compare-and-set), with a row in ``instance_events`` per change of
        state or reach. REACH is monkey's own view of its agent ("up", "unreachable",
        "error"; None keeps the last); EXTRA replaces the stored extra when given (else the
        instance's own). False when the move is illegal (nothing is written then)."""
        now = time.time()
        with self.tx() as db:
            row = db.execute(
                "SELECT state, reach FROM instances WHERE id = ?", (inst.id,)
            ).fetchone()
            extra_json = dumps(extra if extra is not None else inst.extra)
            if row is None:
                db.execute(
                    "INSERT INTO instances(id, provider, kind, host, state, extra, created_at, "
                    "updated_at, name, address, size, spot, launched_at, reach, terminated_at, "
                    "price) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        inst.id,
                        inst.provider,
                        str(inst.extra.get("kind", "")),
                        inst.address or "",
                        inst.state.value,
                        extra_json,
                        now,
                        now,
                        inst.name,
                        inst.address,
                        inst.size,
                        int(inst.spot),
                        inst.launched_at,
                        reach or "",
                        now if inst.state == InstanceState.TERMINATED else None,
                        inst.price,
                    ),
                )
                self._instance_event(
                    db, inst.id, None, inst.state.value, detail or reach or "", now
                )
                return True
            old, old_reach = InstanceState(row[0]), row[1]
            if old != inst.state and inst.state not in INSTANCE_TRANSITIONS[old]:
                return False
            db.execute(
                "UPDATE instances SET state = ?, extra = ?, updated_at = ?, address = ?, "
                "size = coalesce(?, size), spot = max(spot, ?), launched_at = coalesce(?, launched_at), "
                "reach = ?, terminated_at = CASE WHEN ? = 'terminated' "
                "THEN coalesce(terminated_at, ?) END, host = coalesce(nullif(?, ''), host), "
                "price = coalesce(?, price) WHERE id = ?",
                (
                    inst.state.value,
                    extra_json,
                    now,
                    inst.address,
                    inst.size,
                    int(inst.spot),
                    inst.launched_at,
                    reach if reach is not None else old_reach,
                    inst.state.value,
                    now,
                    inst.address or "",
                    inst.price,
                    inst.id,
                ),
            )
            if old != inst.state or (reach is not None and reach != old_reach):
                what = detail or (reach if reach is not None and reach != old_reach else "")
                self._instance_event(db, inst.id, old.value, inst.state.value, what, now)
            return True

    @staticmethod
    def _instance_event(
        db: sqlite3.Connection, instance: str, old: str | None, new: str, detail: str, now: float
    ) -> None:
        db.execute(
            "INSERT INTO instance_events(instance, ts, old, new, detail) VALUES (?,?,?,?,?)",
            (instance, now, old, new, detail),
        )

    def set_instance_idle(self, id: str, since: float | None) -> None:
        """When the instance last became idle (no live attempt), or None while busy."""
        with self.tx() as db:
            db.execute("UPDATE instances SET idle_since = ? WHERE id = ?", (since, id))

    def instance_events(self, id: str) -> list[dict[str, Any]]:
        """The state changes of one instance, oldest first."""
        rows = self.db.execute(
            "SELECT ts, old, new, detail FROM instance_events WHERE instance = ? ORDER BY id", (id,)
        )
        return [dict(zip(("ts", "old", "new", "detail"), r)) for r in rows]

    def set_provider_error(self, provider: str, error: str | None) -> None:
        """Why the provider cannot give the jobs waiting for it a machine (None: it can)."""
        with self.tx() as db:
            if error is None:
                db.execute("DELETE FROM provider_status WHERE provider = ?", (provider,))
            else:
                db.execute(
                    "INSERT INTO provider_status(provider, error, since) VALUES (?,?,?) "
                    "ON CONFLICT(provider) DO UPDATE SET error = excluded.error",
                    (provider, error, time.time()),
                )

    def provider_error(self, provider: str) -> str | None:
        row = self.db.execute(
            "SELECT error FROM provider_status WHERE provider = ?", (provider,)
        ).fetchone()
        return row[0] if row else None

    def instances(self, provider: str | None = None, live: bool = False) -> list[dict[str, Any]]:
        """Recorded instances (of PROVIDER; only those not terminated with LIVE), by id."""
        keys = (
            "id",
            "provider",
            "kind",
            "host",
            "state",
            "reach",
            "extra",
            "updated_at",
            "name",
            "address",
            "size",
            "spot",
            "launched_at",
            "terminated_at",
            "idle_since",
            "price",
        )
        sql = f"SELECT {', '.join(keys)} FROM instances WHERE 1"
        args: list[Any] = []
        if provider is not None:
            sql += " AND provider = ?"
            args.append(provider)
        if live:
            sql += " AND state != 'terminated'"
        out = [dict(zip(keys, r)) for r in self.db.execute(sql + " ORDER BY id", args)]
        for item in out:
            item["extra"] = json.loads(item["extra"])
            item["spot"] = bool(item["spot"])
        return out
