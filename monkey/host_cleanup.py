"""`rm`, `gc` and `du --hosts` on SSH hosts, the commands' side: they record what each host
is owed in the store and wake the core, which alone talks to hosts (monkey/core/cleanup.py);
then they wait a little for the hosts reached to report, and say which are not reached yet
(their chores wait in the store until they are)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from monkey.models import MonkeyError
from monkey.store.hosts import BUCKET, CACHE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from monkey.store import Store

    class Facade(Protocol):
        """What ``ask`` uses of the ``Monkey`` facade (its Disk part passes it)."""

        store: Store

        def wake(self, queued: str | None = None) -> None: ...


WAIT = 20.0  # seconds a command waits for the hosts reached to report


@dataclass
class HostsReport:
    """What the hosts asked reported: usage (and ``freed``) of those done, the others."""

    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    why: str = ""  # why nothing was carried out (the core cannot start)


def ask(m: Facade, hosts: list[str], since: float, wait: float = WAIT) -> HostsReport:
    """Wake the core for the chores recorded at SINCE for HOSTS and wait up to WAIT seconds
    for those of the hosts reached to be carried out (not for hosts known to be out of reach)."""
    report = HostsReport()
    if not hosts:
        return report
    try:
        m.wake()
    except MonkeyError as exc:
        report.pending, report.why = sorted(hosts), str(exc)
        return report
    deadline = time.monotonic() + wait
    while True:
        pending = {c["instance"] for c in m.store.host_chores() if c["created_at"] >= since}
        up = {r["id"] for r in m.store.instances() if r["reach"] == "up"}
        # a bucket, a cluster's cache claim: always in reach (or said why not)
        up.update(h for h in pending if h.endswith((BUCKET, CACHE)))
        if not pending & up or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    usage = m.store.host_usage()
    report.done = {h: usage[h] for h in hosts if h not in pending and h in usage}
    report.pending = sorted(set(hosts) - set(report.done))
    return report


def owed_note(report: HostsReport) -> str:
    """One line on the hosts not reached ("" when none)."""
    if not report.pending:
        return ""
    why = f" ({report.why})" if report.why else ""
    return (
        f"not reached yet: {', '.join(report.pending)}{why}; the core cleans them when it "
        "next reaches them"
    )
