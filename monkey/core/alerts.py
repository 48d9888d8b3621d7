"""Notifications that no job's ending makes, looked for by the notifier every WATCH_EVERY
seconds: a cloud machine idle but still billing (`notify add --on idle`), and an owner's
estimated spend of the month passing a target's threshold (`--spend-over USD`).

Each is made once: its delivery's idempotency id names the machine and the moment it went
idle, or the owner, the month and the threshold, so looking again (or a core restarted)
finds it made already (the store ignores an id it holds)."""

from __future__ import annotations

import hashlib
import json
import time

from monkey.config import Home
from monkey.models import format_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.core.elapsed import Elapsed
    from monkey.store import Store

WATCH_EVERY = 60.0  # seconds between looks for idle machines and spend
IDLE_AFTER = 1800.0  # a machine idle this long (default of --idle-after) is told of


def _id(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:32]


def month_start(now: float) -> float:
    """The start of NOW's calendar month, UTC."""
    import calendar

    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)))


def alert_deliveries(
    store: Store, home: Home, now: float, url: str | None, elapsed: Elapsed
) -> list[dict[str, Any]]:
    """The deliveries due now to the targets that watch idle machines or spend (ELAPSED:
    how long machines have been idle, whatever steps the wall clock took)."""
    from monkey.store.db import local_user

    targets = [t for t in store.notify_targets() if {"idle", "spend"} & set(t["events"].split(","))]
    if not targets:
        return []
    me = local_user()
    out = []
    watching = [t for t in targets if "idle" in t["events"].split(",")]
    if watching:
        out += _idle(store, home, now, url, watching, me, elapsed)
    for t in targets:
        if "spend" in t["events"].split(","):
            out += _spend(store, now, t, me)
    return out


def _billing(home: Home) -> set[str]:
    """The providers whose machines bill while they run (elastic kinds: clouds)."""
    from monkey.drivers import driver_class, load_providers

    return {name for name, cfg in load_providers(home).items() if driver_class(cfg.type).elastic}


def _idle(
    store: Store,
    home: Home,
    now: float,
    url: str | None,
    targets: list[dict[str, Any]],
    me: str,
    elapsed: Elapsed,
) -> list[dict[str, Any]]:
    """Messages of the machines idle past each target's --idle-after, to the targets of
    the owners whose jobs ran on them (this machine's user's when none did)."""
    from monkey.store.cost import dollars

    billing = _billing(home)
    out = []
    for row in store.instances(live=True):
        since = row["idle_since"]
        if row["provider"] not in billing or since is None or row["state"] != "running":
            continue
        owners = {o or me for o in store.instance_owners(row["id"])} or {me}
        idle = elapsed.since(("idle_since", row["id"]), since)
        for t in targets:
            after = json.loads(t["options"]).get("idle_after", IDLE_AFTER)
            if t["owner"] not in owners or idle < after:
                continue
            price = row["price"]
            title = f"Instance {row['id']} idle for {format_duration(idle)}, still billing" + (
                f" ({dollars(price)}/h)" if price is not None else ""
            )
            fields = [("Instance", row["id"]), ("Provider", row["provider"])]
            fields += (
                [("Size", row["size"] + (" spot" if row["spot"] else ""))] if row["size"] else []
            )
            fields += [("Idle", format_duration(idle))]
            fields += [("Price", f"{dollars(price)}/h")] if price is not None else []
            fields += [("Ends it", f"monkey delete instance {row['id']}")]
            body = {
                "event": "idle",
                "text": title,
                "title": title,
                "fields": fields,
                "output": [],
                "url": f"{url}/web/" if url else None,
                "ts": now,
                "instance": {
                    "id": row["id"],
                    "provider": row["provider"],
                    "size": row["size"],
                    "spot": bool(row["spot"]),
                    "idle_since": since,
                    "price": price,
                },
                "footer": f"monkey · {row['provider']}",
            }
            out.append(
                {
                    "id": _id("idle", row["id"], since, t["owner"], t["name"]),
                    "owner": t["owner"],
                    "target": t["name"],
                    "juid": None,
                    "what": "idle",
                    "body": json.dumps(body),
                }
            )
    return out


def _spend(store: Store, now: float, target: dict[str, Any], me: str) -> list[dict[str, Any]]:
    """The message of TARGET's owner's spend of this month passing its --spend-over."""
    from monkey.store.cost import dollars

    over = json.loads(target["options"]).get("spend_over")
    if over is None:
        return []
    owner = target["owner"]
    start = month_start(now)
    spent = store.owner_spend(owner, start, now, local=owner == me)
    if spent < over:
        return []
    month = time.strftime("%Y-%m", time.gmtime(now))
    title = f"{owner}'s estimated spend in {month} passed {dollars(over)}: {dollars(spent)}"
    body = {
        "event": "spend",
        "text": title,
        "title": title,
        "fields": [
            ("Owner", owner),
            ("Month", month),
            ("Spent", dollars(spent)),
            ("Threshold", dollars(over)),
        ],
        "output": [],
        "url": None,
        "ts": now,
        "spend": {"owner": owner, "month": month, "spent": spent, "threshold": over},
        "footer": "monkey · estimated from list prices",
    }
    return [
        {
            "id": _id("spend", owner, target["name"], month, over),
            "owner": owner,
            "target": target["name"],
            "juid": None,
            "what": "spend",
            "body": json.dumps(body),
        }
    ]
