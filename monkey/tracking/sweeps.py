"""Driving sweeps from the core: release held cells up to max_parallel, stop hopeless runs
early, and mark a sweep finished when every cell has ended. ``tick`` runs once a second.

A sweep's cells are ordinary jobs (``jobs.sweep`` = the sweep id) created queued and held
(``not_before`` = HOLD); failed or lost cells retry by themselves through the job's
``retries``. Sweep states: submitting, interrupted, running, paused, finished, cancelled.

A large sweep is written in batches, so that other writers get in between. Until its last
batch is written it is ``submitting`` and none of its cells runs; the process writing it
holds a lock file meanwhile. A submitting sweep whose lock is free lost its writer half-way
(killed, disk full): it becomes ``interrupted``, its cells never run, and `sweep status`
says how many of its cells were written.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from monkey.config import Home
from monkey.models import LIVE, TERMINAL, State
from monkey.store import Store
from monkey.store.deps import HOLD
from monkey.store.errors import StoreUnavailable
from monkey.tracking import early_stop

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("monkey.tracking")
ACTIVE_SWEEP = "running"
SUBMITTING, INTERRUPTED = "submitting", "interrupted"


def tick(store: Store, home: Home) -> None:
    """One pass over the running sweeps (and those whose submission stopped half-way)."""
    settle(store, home)
    for sweep in store.list_sweeps(states=[ACTIVE_SWEEP]):
        try:
            advance(store, sweep)
        except StoreUnavailable:
            raise  # the core waits for the store; no sweep is at fault
        except Exception:  # one bad sweep must not stop the core
            log.exception("sweep %s", sweep["id"])


def advance(store: Store, sweep: dict[str, Any]) -> None:
    """Release, stop early, or finish one running sweep."""
    spec = sweep["spec"]
    jobs = store.sweep_jobs_brief(sweep["id"])
    states = {juid: State(state) for juid, state, _, _ in jobs}
    held = [
        juid
        for juid, state, not_before, _ in jobs
        if state == State.QUEUED.value and not_before >= HOLD
    ]
    active = sum(
        1
        for juid, state, not_before, _ in jobs
        if State(state) in LIVE or (state == State.QUEUED.value and not_before < HOLD)
    )
    limit = spec.get("max_parallel") or len(jobs)
    if held and active < limit:
        store.release_jobs(held[: limit - active])
    if spec.get("early_terminate") and spec.get("metric"):
        running = {
            juid
            for juid, state, _, request in jobs
            if state == State.RUNNING.value and request is None
        }
        for juid in sorted(stop_early(store, spec, list(states), running)):
            if store.set_request(juid, "cancel", LIVE):
                store.add_event(
                    juid,
                    "early-stop",
                    f"{spec['early_terminate']['type']} rule on {spec['metric']['name']}",
                )
                log.info("sweep %s: stopping %s early", sweep["id"], juid)
    if jobs and all(s in TERMINAL for s in states.values()):
        store.set_sweep_state(sweep["id"], "finished", only_from=[ACTIVE_SWEEP])


def stop_early(store: Store, spec: dict[str, Any], juids: list[str], running: set[str]) -> set[str]:
    """Running cells the sweep's early-termination rule would stop now."""
    if not running:
        return set()
    metric, rule = spec["metric"], spec["early_terminate"]
    curves = {
        juid: early_stop.oriented([v for _, v, _ in pts], metric["goal"])
        for juid, pts in store.metric_points_many(juids, metric["name"]).items()
    }
    if rule["type"] == "median":
        return early_stop.median_stop(curves, running, rule["min_steps"], rule["min_runs"])
    return early_stop.asha_stop(curves, running, rule["min_steps"], rule["eta"])


class SubmissionLock:
    """Held by the process writing a sweep's cells, from before the sweep row is visible
    until its last batch is written; the kernel drops it when that process dies."""

    def __init__(self, home: Home, sid: str) -> None:
        self.path = _lock_path(home, sid)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        os.unlink(self.path)
        os.close(self.fd)


def settle(store: Store, home: Home) -> None:
    """Mark interrupted the submitting sweeps whose writer is gone."""
    for sweep in store.list_sweeps(states=[SUBMITTING]):
        path = _lock_path(home, sweep["id"])
        if _locked(path):
            continue  # still being written
        if store.set_sweep_state(sweep["id"], INTERRUPTED, only_from=[SUBMITTING]):
            log.warning(
                "sweep %s: its submission stopped half-way; its cells will not run", sweep["id"]
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _locked(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _lock_path(home: Home, sid: str) -> str:
    return os.path.join(home.private, f"{sid}.submitting")
