"""Estimated cost of jobs: each attempt's recorded $/hour times how long it ran.

An attempt records, when it begins, its instance's size, whether it is spot capacity, and
the $/hour charged to it: the instance's estimated price times the job's share of its CPUs
(see ``Store.begin_attempt``). Attempts whose job then went ``preempted`` or ``lost`` (their
instance was reclaimed or vanished) are the part wasted on preemption.
"""

from __future__ import annotations

import sqlite3
from typing import TypedDict

WASTED = ("preempted", "lost")  # how a job leaves an attempt whose work is thrown away


class Cost(TypedDict):
    total: float  # $ spent on all attempts with a known price (so far, for a live one)
    preempted: float  # the part of it spent on attempts that were preempted or lost


def job_costs(db: sqlite3.Connection, juids: list[str], now: float) -> dict[str, Cost]:
    """juid -> its estimated cost, for the jobs of JUIDS with at least one priced attempt."""
    out: dict[str, Cost] = {}
    for start in range(0, len(juids), 500):
        chunk = juids[start : start + 500]
        rows = db.execute(
            "SELECT a.juid, a.price * MAX(0, coalesce(a.ended_at, ?) - a.started_at) / 3600.0, "
            "EXISTS (SELECT 1 FROM events e WHERE e.juid = a.juid AND e.attempt = a.n "
            f"AND e.kind = 'state' AND e.new IN ({', '.join('?' * len(WASTED))})) "
            "FROM attempts a WHERE a.price IS NOT NULL AND a.started_at IS NOT NULL "
            f"AND a.juid IN ({', '.join('?' * len(chunk))})",
            (now, *WASTED, *chunk),
        )
        for juid, spent, wasted in rows:
            cost = out.setdefault(juid, {"total": 0.0, "preempted": 0.0})
            cost["total"] += max(0.0, spent)
            if wasted:
                cost["preempted"] += max(0.0, spent)
    return out


def dollars(value: float | None) -> str:
    """An estimate as monkey shows it everywhere: $1.23, $0.0042 under a dollar, - unknown."""
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 1 else f"${value:.4f}"
