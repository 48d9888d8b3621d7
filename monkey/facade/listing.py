"""What `monkey list jobs` shows, in one call: the jobs, their runtimes, how many match
and whether a core runs. Light on purpose: the local command calls it without loading the
facade (`monkey list jobs` is benchmarked), the facade and the server through it."""

from __future__ import annotations

import time
from collections.abc import Iterable

from monkey.core.presence import absent_since
from monkey.models import State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home
    from monkey.store import Store


def job_listing(
    home: Home,
    store: Store,
    states: Iterable[State] | None = None,
    provider: str | None = None,
    limit: int | None = None,
    owners: bool = False,
    owner: str | None = None,
    tag: str | None = None,
) -> dict[str, Any]:
    """{"jobs": records newest first, "runtimes": juid -> seconds run (all attempts),
    "total": how many match without the limit, "core_since": None while a core runs, else
    when one last ran here, "owners": juid -> who submitted it (with OWNERS, else None), "waiting_on": queued
    juid -> the jobs it still waits for, "provider_waits": provider -> why its queued jobs
    wait for it (a disk without room, a provider not reachable)}; only OWNER's jobs when
    given, only those tagged TAG (a job a quota holds back says why in its ``held``)."""
    states = None if states is None else set(states)
    if tag is not None:
        from monkey.facade.notes import check_tags

        check_tags([tag])
    jobs = store.list_jobs(states=states, provider=provider, limit=limit, owner=owner, tag=tag)
    total = (
        len(jobs)
        if limit is None or len(jobs) < limit
        else store.count_listed(states=states, provider=provider, owner=owner, tag=tag)
    )
    now = time.time()
    absent = absent_since(home)  # when no core runs, runtimes stop at its last moment
    juids = [j.juid for j in jobs]
    return {
        "jobs": jobs,
        "runtimes": store.runtimes(juids, min(now, absent or now)),
        "total": total,
        "core_since": absent or None,
        "owners": store.job_owners(juids) if owners else None,
        "tags": store.tags_of("job", juids),  # juid -> its tags, for those that have any
        # queued jobs waiting for others: juid -> the jobs not yet as needed
        "waiting_on": store.waiting_on(j.juid for j in jobs if j.state == State.QUEUED),
        "provider_waits": {
            p: why
            for p in sorted({j.provider for j in jobs if j.state == State.QUEUED})
            if (why := store.provider_error(p))
        },
    }
