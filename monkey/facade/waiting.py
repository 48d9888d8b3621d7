"""Why a queued job has not started, said once for `monkey info job` and Monkey Web's job
page: the jobs it waits for, a quota that holds it, its provider's problem (a disk without
room, a provider not reached), the capacity it waits on (``1 of 1 slots busy: job X``) and
a retry's back-off; and a job's tries told apart from the attempts that never started."""

from __future__ import annotations

import time

from monkey.models import DISK_WAIT, RETRY_DELAY_MAX, Attempt, State

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import ProviderConfig
    from monkey.models import Job
    from monkey.store import Store

SHOWN = 3  # jobs a reason names; the rest are counted


def why_waiting(
    store: Store,
    job: Job,
    config: ProviderConfig | None,
    after: list[dict[str, Any]],
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Why JOB (queued, of provider CONFIG; AFTER: ``Store.dependencies``) has not started:
    [{"kind": "after" | "quota" | "disk" | "provider" | "capacity" | "backoff", "text": the
    line `info job` prints, "parts": the same text as strings and {"job", "state"} (a page
    links those)}]; [] for a job that is not queued."""
    if job.state != State.QUEUED:
        return []
    now = time.time() if now is None else now
    reasons = []
    unmet = [d for d in after if not d["met"]]
    if unmet:
        parts: list[Any] = ["waiting for "]
        needs = (
            ("succeed", [d for d in unmet if not d["any"]]),
            ("end", [d for d in unmet if d["any"]]),
        )
        for need, deps in needs:
            if deps:
                if len(parts) > 1:
                    parts.append(" and ")
                parts += [*_named(deps), f" to {need}"]
        reasons.append(_reason("after", parts))
    if job.held:
        reasons.append(_reason("quota", [f"waiting: {job.held}"]))
    problem = store.provider_error(job.provider)
    if problem:
        disk = problem.startswith(DISK_WAIT)
        text = problem if disk else f"waiting: {problem}"
        reasons.append(_reason("disk" if disk else "provider", [text]))
    if not unmet and not problem and config is not None:
        full = _capacity(store, job, config)
        if full is not None:
            reasons.append(full)
    if job.attempts and now < job.not_before <= now + RETRY_DELAY_MAX:
        from monkey.models import run_time

        wait = run_time(job.not_before - now)
        reasons.append(_reason("backoff", [f"retry back-off: next try in {wait}"]))
    return reasons


def tries(attempts: list[Attempt]) -> dict[str, int]:
    """{"tries": attempts whose command started, "never_started": attempts that ended
    before it did (no machine placed it, its start came to nothing)} of ATTEMPTS."""
    started = sum(1 for a in attempts if a.started_at is not None)
    never = sum(1 for a in attempts if a.started_at is None and a.state != "live")
    return {"tries": started, "never_started": never}


def tries_text(info: dict[str, Any]) -> str:
    """A job's tries (of ``Monkey.info``), and apart the attempts that never started: "2,
    and 1 attempt that never started"."""
    never = info.get("never_started") or 0
    if not never:
        return str(info.get("tries", info["attempts"]))
    return f"{info['tries']}, and {never} attempt{'s' if never > 1 else ''} that never started"


def _reason(kind: str, parts: list[Any]) -> dict[str, Any]:
    text = "".join(p if isinstance(p, str) else p["job"] for p in parts)
    return {"kind": kind, "text": text, "parts": parts}


def _named(jobs: list[dict[str, Any]]) -> list[Any]:
    """JOBS ({"job", "state"}) as parts to read: the first SHOWN, and how many more."""
    parts: list[Any] = []
    for i, j in enumerate(jobs[:SHOWN]):
        if i:
            parts.append(", ")
        parts.append({"job": j["job"], "state": j["state"] or "removed"})
    if len(jobs) > SHOWN:
        parts.append(f" and {len(jobs) - SHOWN} more")
    return parts


def _capacity(store: Store, job: Job, config: ProviderConfig) -> dict[str, Any] | None:
    """The capacity JOB waits on, when every machine of its provider it could go to is too
    busy for it now (``1 of 1 slots busy: job X``); None when one has room, or when the
    provider may make or claim another machine (it then says what it waits for)."""
    from monkey.core.placement import Usage, memory_needed, place, slots_needed
    from monkey.drivers import driver_class
    from monkey.drivers.base import Capacity
    from monkey.models import parse_size

    kind = driver_class(config.type)
    res = job.resources
    if config.type == "local":
        from monkey.drivers.local import local_capacity

        caps = [local_capacity(config, detect=res.gpus > 0)]
    else:
        rows = store.instances(job.provider, live=True)
        limit = config.options.get("max_instances")
        hosts = config.options.get("hosts")
        if kind.batches or (kind.elastic and (limit is None or len(rows) < int(limit))):
            return None  # a machine is made for it
        if isinstance(hosts, list) and len(rows) < len(hosts):
            return None  # a host not claimed yet
        caps = []
        for r in rows:
            extra = r.get("extra") or {}
            if r["state"] != "running" or not isinstance(extra.get("slots"), int):
                return None  # a machine not known yet: it may take the job
            caps.append(
                Capacity(
                    r["id"], extra["slots"], list(extra.get("gpus") or []), extra.get("memory")
                )
            )
    if res.host:
        caps = [c for c in caps if res.host in (c.instance, c.instance.rsplit("/", 1)[-1])]
    if not caps or not any(c.could_hold(res) for c in caps):
        return None  # never fits: the submission said so
    usage: dict[str, Usage] = {}
    holders: list[str] = []
    names = {c.instance for c in caps}
    for instance, cpus, gpus, memory, juid, _ in store.live_usage():
        if instance not in names:
            continue
        u = usage.setdefault(instance, Usage())
        u.slots += max(1, cpus or 1)
        u.gpus.update(g for g in gpus.split(",") if g)
        u.memory += parse_size(memory) if memory else 0
        holders.append(juid)
    if place(res, caps, usage, res.host) is not None:
        return None  # it fits now: the core's next pass starts it
    used = {c.instance: usage.get(c.instance, Usage()) for c in caps}
    if all(used[c.instance].slots + slots_needed(res, c) > c.slots for c in caps):
        busy, total, what = sum(u.slots for u in used.values()), sum(c.slots for c in caps), "slots"
    elif res.gpus:
        busy, total, what = (
            sum(len(u.gpus) for u in used.values()),
            sum(len(c.gpus) for c in caps),
            "GPUs",
        )
    else:
        from monkey.models import human_size

        busy_memory = sum(u.memory for u in used.values())
        text = (
            f"waiting: {human_size(busy_memory)} of {human_size(sum(c.memory or 0 for c in caps))}"
            f" memory taken (it asks {human_size(memory_needed(res))}) by "
        )
        return _reason("capacity", [text, *_jobs_of(store, holders)])
    where = "" if config.type == "local" or len(caps) > 1 else f" on {caps[0].instance}"
    text = f"waiting: {busy} of {total} {what} busy{where}: job{'s' if len(holders) > 1 else ''} "
    return _reason("capacity", [text, *_jobs_of(store, holders)])


def _jobs_of(store: Store, juids: list[str]) -> list[Any]:
    """JUIDS with their states, as parts."""
    shown = []
    for juid in sorted(set(juids))[:SHOWN]:
        record = store.get_job(juid)
        shown.append({"job": juid, "state": record.shown_state if record else None})
    rest = len(set(juids)) - len(shown)
    return _named(shown) + ([f" and {rest} more"] if rest > 0 else [])
