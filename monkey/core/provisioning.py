"""Elastic providers (clouds): machines made for the jobs that wait, and unmade after.

Each pass, for every provider whose driver is ``elastic``:

- **inventory**: the cloud is listed (by this home's tag) every ``LIST_EVERY`` seconds, off
  the loop; each machine's state is recorded with a compare-and-set move. A tagged machine
  the store has no record of (its creation was never recorded: the core died meanwhile) is
  terminated; a recorded one the cloud no longer lists is terminated in the store, and the
  attempts live on it end ``lost`` (``preempted`` when the cloud says it reclaimed a spot
  machine: ``extra["preempted"]``).
- **notices**: an agent's spot/preemption notice for a machine with no live attempt has it
  destroyed at once (one with jobs ends them itself, each ``preempted``).
- **growth**: queued jobs that fit on no machine cause machines to be created (on-demand
  ones for jobs past ``fallback: on_demand_after``), as many as
  their CPUs need beyond the slots of machines still booting, never more than
  ``max_instances``; a failed creation is recorded as the provider's error (shown on the
  jobs that wait) and retried with back-off. A batching kind (``drv.batches``: Slurm)
  makes them with one ``create_nodes`` call, one machine more per sweep cell still held
  (a job array for the sweep), and cancels its machines not started yet once nothing
  waits for them.
- **shrinking**: a machine with no live attempt for ``idle_timeout`` seconds, one that
  was never reached within ``boot_timeout`` seconds of its creation, or one whose host key
  was refused (``distrusted``: the jobs keep waiting, and say why), is destroyed.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from monkey.drivers.agent_link import AgentGone
from monkey.drivers.base import NoCapacity
from monkey.models import Ending, Instance, InstanceState, MonkeyError, Resources, State
from monkey.store.deps import HOLD

if TYPE_CHECKING:
    from monkey.config import ProviderConfig
    from monkey.core.elapsed import Elapsed
    from monkey.core.workers import Workers
    from monkey.drivers.agent_link import AgentLink
    from monkey.drivers.base import Driver
    from monkey.store import Store

log = logging.getLogger("monkey.core")

LIST_EVERY = 5.0
_BACKOFF_MAX = 60.0


def machines_needed(
    waiting: list[Resources], per_machine: int, booting: int, live: int, limit: int | None
) -> int:
    """How many machines to create for the WAITING jobs' CPUs, given machines of
    PER_MACHINE slots, BOOTING ones that will take some, LIVE ones in all, and LIMIT."""
    demand = sum(max(1, r.cpus) for r in waiting)
    need = -(-demand // max(1, per_machine)) - booting
    if limit is not None:
        need = min(need, limit - live)
    return max(0, need)


class CoreView(Protocol):
    """What provisioning uses of the core (``monkey.core.scheduler.Core`` is one): the store
    it alone writes, its workers, its drivers and links, and three calls back."""

    store: Store
    workers: Workers
    providers: dict[str, ProviderConfig]
    links: dict[tuple[str, str], AgentLink]
    linked_at: dict[tuple[str, str], float]  # monotonic
    elapsed: Elapsed

    def driver(self, provider: str) -> Driver: ...

    def connect(self, key: tuple[str, str]) -> None: ...

    def release(self, key: tuple[str, str]) -> None: ...

    def on_exit(
        self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any], offset: int
    ) -> None: ...

    def replay(
        self, key: tuple[str, str], juid: str, n: int, events: list[tuple[int, dict[str, Any]]]
    ) -> None: ...


class Elastic:
    """The provisioning side of the core, for elastic providers."""

    def __init__(self, core: CoreView) -> None:
        self.core = core
        self.listed_at: dict[str, float] = {}
        self.inventoried: set[str] = set()  # providers listed once since the core started
        self.creating: dict[str, int] = {}  # creations in flight per provider
        self.retry_at: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.list_failed: set[str] = set()  # providers whose last listing failed
        self.noticed: set[str] = set()  # machines whose agent saw a spot/preemption notice
        self.sweep_providers: dict[str, str | None] = {}  # per sweep: its cells' provider
        self.requests_seen = False  # requests left under way by an earlier core were looked at
        self.recovering: set[str] = set()  # ended machines whose attempts' leftovers are read

    def tick(
        self,
        now: float,
        waiting: dict[str, list[Resources]],
        on_demand: dict[str, list[Resources]] | None = None,
    ) -> None:
        """One pass over the elastic providers; WAITING: resources of the jobs placed nowhere,
        ON_DEMAND: of those that need on-demand capacity. NOW: the wall clock."""
        mono = time.monotonic()
        for name in list(self.core.providers):
            try:
                drv = self.core.driver(name)
            except MonkeyError:
                continue
            if not drv.elastic:
                continue
            if mono - self.listed_at.get(name, -LIST_EVERY) >= LIST_EVERY:
                self._list(name, drv, mono)
            if name in self.inventoried:
                self._grow(name, drv, waiting.get(name, []), now)
                self._grow_on_demand(name, drv, (on_demand or {}).get(name, []), now)
                self._shrink(name, drv, now)

    # -- inventory -------------------------------------------------------------------------

    def _list(self, name: str, drv: Driver, mono: float) -> None:
        key = ("list", name)
        if self.core.workers.busy(key):
            return
        self.listed_at[name] = mono
        self.core.workers.submit(
            key,
            drv.list_nodes,
            lambda nodes: self._listed(name, drv, nodes),
            lambda exc: self._list_failed(name, exc),
        )

    def _list_failed(self, name: str, exc: BaseException) -> None:
        """The jobs that wait for the provider say why (and the log, once per change)."""
        why = str(exc) if isinstance(exc, MonkeyError) else f"{type(exc).__name__}: {exc}"
        self.list_failed.add(name)
        if self.core.store.provider_error(name) != why:
            log.error("listing %s failed: %s", name, why)
            self.core.store.set_provider_error(name, why)

    def _listed(self, name: str, drv: Driver, nodes: list[Instance]) -> None:
        store = self.core.store
        known = {row["id"]: row for row in store.instances(name)}
        seen = set()
        for node in nodes:
            seen.add(node.id)
            if node.id not in known:
                if self.creating.get(name):
                    # A creation under way: the cloud (or squeue) can list the machine
                    # before the call that makes it returns and records it. The next
                    # listing, with none under way, finds a true orphan.
                    continue
                if node.state != InstanceState.TERMINATED:
                    log.warning(
                        "%s: %s carries this home's tag but was never recorded; terminating it",
                        name,
                        node.id,
                    )
                    self._destroy(name, drv, node.id, "unrecorded")
                continue
            if node.id in self.recovering:
                continue  # ended: what its agent left is being read
            ended = node.state in (InstanceState.TERMINATED, InstanceState.STOPPED)
            why = self._orphaned(name, drv, known[node.id]) if ended else ""
            if ended:
                # reclaimed, stopped from outside, or powered off by its agent
                self._ended(name, drv, node, why)
                continue
            if not store.record_instance(node):
                log.warning(
                    "%s: %s reported %s after %s; ignored",
                    name,
                    node.id,
                    node.state,
                    known[node.id]["state"],
                )
        for row in known.values():
            # Gone from the cloud's list (terminated long ago, or from outside monkey).
            if (
                row["state"] != "terminated"
                and row["id"] not in seen
                and row["id"] not in self.recovering
                and self._since(row, "launched_at", 2 * LIST_EVERY + 1) > 2 * LIST_EVERY
            ):
                self._gone(name, drv, row, self._orphaned(name, drv, row))
        if name in self.list_failed:  # the listing error is over
            self.list_failed.discard(name)
            store.set_provider_error(name, None)
        self.inventoried.add(name)

    def _orphaned(self, name: str, drv: Driver, row: dict[str, Any]) -> str:
        """Why the machine of ROW, found ended, most likely ended: its agent powered it off
        (see client_agent.orphan.OrphanWatch) when it ran no job and the core sent it nothing
        for the provider's ``orphan_timeout``; "" when that cannot be why."""
        timeout = float(getattr(drv, "orphan_timeout", 0) or 0)
        key = (name, str(row["id"]))
        # Idle since the elastic pass saw it so, or since its last attempt ended (a core
        # killed right after that never recorded the idle spell).
        idle = (
            row["idle_since"]
            if row["idle_since"] is not None
            else self.core.store.last_attempt_end(key[1])
        )
        if (
            row["state"] == "terminated"
            or not timeout
            or idle is None
            or key in self.core.links
            or self.core.store.live_attempts(key[1])
        ):
            return ""
        quiet = self.core.elapsed.since(("idle_since", key[1]), float(idle))
        if key in self.core.linked_at:
            quiet = min(quiet, time.monotonic() - self.core.linked_at[key])
        if quiet < timeout:
            return ""
        minutes = f"{timeout / 60:.0f} min" if timeout >= 120 else f"{timeout:.0f}s"
        why = (
            f"its agent powered it off: no job and no word from the core for {minutes} "
            "(orphan_timeout)"
        )
        log.warning("%s: %s is gone: %s", name, key[1], why)
        return why

    def _gone(self, name: str, drv: Driver, row: dict[str, Any], why: str = "") -> None:
        """The machine is no longer listed: terminated."""
        inst = Instance(
            str(row["id"]),
            name,
            str(row["name"]),
            InstanceState.TERMINATED,
            extra=dict(row["extra"]),
        )
        self._ended(name, drv, inst, why or "no longer listed by the cloud")

    def _ended(self, name: str, drv: Driver, node: Instance, why: str) -> None:
        """NODE is terminated or stopped (WHY, as far as the core can tell). Attempts live on
        it whose end the core has not fetched may have been left in the bucket by its agent
        before it powered the machine off (``Transport.left_behind``): read off the loop,
        they end as they ended, and the machine's end says why its agent powered it off."""
        store = self.core.store
        # (and those lost while it was out of reach, whose end is still to be told)
        awaited = store.live_attempts(node.id) + store.adrift_attempts(node.id)
        if not awaited or not drv.transport.leaves_behind:
            self._record_end(name, drv, node, why, {})
            return
        self.recovering.add(node.id)

        def call() -> dict[tuple[str, int], Any]:
            return {
                (a.juid, a.n): drv.transport.left_behind(node.id, a.juid, a.n, a.events_offset)
                for a in awaited
            }

        def then(left: dict[tuple[str, int], Any]) -> None:
            self.recovering.discard(node.id)
            self._record_end(name, drv, node, why, left)

        def failed(exc: BaseException) -> None:
            log.error("%s: reading what %s left in the bucket failed: %s", name, node.id, exc)
            self.recovering.discard(node.id)
            self._record_end(name, drv, node, why, {})

        self.core.workers.submit(("left", node.id), call, then, failed)

    def _record_end(
        self,
        name: str,
        drv: Driver,
        node: Instance,
        why: str,
        left: dict[tuple[str, int], tuple[str, list[tuple[int, dict[str, Any]]]] | None],
    ) -> None:
        """Record the machine ended, replay the events its agent LEFT of each attempt (an exit
        among them ends it as it ended), and end the attempts still live on it."""
        said = next((f"its agent powered it off: {got[0]}" for got in left.values() if got), "")
        if said:
            log.warning("%s: %s is gone: %s", name, node.id, said)
        why = said or why
        if not self.core.store.record_instance(
            node, detail=why if node.state == InstanceState.TERMINATED else ""
        ):
            log.warning("%s: %s reported %s; ignored", name, node.id, node.state)
            return
        for (juid, n), got in left.items():
            if got:
                self.core.replay((name, node.id), juid, n, got[1])
        self._end_attempts(
            name,
            node.id,
            bool(node.extra.get("preempted")),
            str(node.extra.get("preempted_why") or ""),
        )
        if node.state == InstanceState.STOPPED:  # takes no job and still costs its disk
            self._destroy(name, drv, node.id, why or "stopped from outside monkey")

    def _end_attempts(
        self, name: str, instance: str, preempted: bool = False, detail: str = ""
    ) -> None:
        """End the attempts live on a machine that is gone or stopped (`lost`, retried), or
        that the cloud reclaimed (PREEMPTED: they resume from their last upload; DETAIL is
        the driver's word on why, if it has one)."""
        why = Ending.PREEMPTED if preempted else Ending.TERMINATED
        said = (detail or "its spot instance was reclaimed without a notice") if preempted else None
        for att in self.core.store.live_attempts(instance):
            self.core.on_exit(
                (name, instance),
                att.juid,
                att.n,
                {"reason": why.value, "ts": time.time(), "detail": said},
                att.events_offset,
            )

    def on_notice(self, key: tuple[str, str], notice: dict[str, object]) -> None:
        """An agent saw a notice: recorded on the machine; one with no live attempt is
        destroyed now (its jobs, if any, end themselves)."""
        name, instance = key
        log.warning("%s: %s: %s", name, instance, notice.get("detail"))
        if notice.get("kind") == "rebalance":
            return
        self.noticed.add(instance)
        try:
            drv = self.core.driver(name)
        except MonkeyError:
            return
        drv.preempted(instance)  # its zone is avoided for a while
        if self.core.store.live_attempts(instance):
            return  # destroyed once idle (_shrink)
        self._destroy(name, drv, instance, f"notice: {notice.get('detail')}")

    # -- growth ----------------------------------------------------------------------------

    def _grow(self, name: str, drv: Driver, waiting: list[Resources], now: float) -> None:
        store = self.core.store
        if not waiting:
            if store.provider_error(name) is not None and not self.creating.get(name):
                store.set_provider_error(name, None)
            if drv.batches:
                self._cancel_surplus(name, drv, now)
            return
        if time.monotonic() < self.retry_at.get(name, 0.0):
            return
        rows = store.instances(name, live=True)
        if drv.batches:
            self._grow_batches(name, drv, waiting, rows)
            return
        reached = {c.instance for c in drv.instances()}
        booting = sum(1 for r in rows if r["id"] not in reached) + self.creating.get(name, 0)
        size = drv.size_for(waiting[0])
        live = len(rows) + self.creating.get(name, 0)
        need = machines_needed(waiting, drv.size_slots(size), booting, live, drv.max_instances)
        for _ in range(need):
            self._create(name, drv, size)

    def _grow_batches(
        self, name: str, drv: Driver, waiting: list[Resources], rows: list[dict[str, Any]]
    ) -> None:
        """A batching kind's machines (one job each): one batch per distinct size among the
        WAITING jobs (each sized for its own jobs), counting the machines of that size that
        serve no job yet, booting or up (one that came up since this pass placed jobs takes
        one at the next); the first batch covers the sweep cells still held too, THROTTLE of
        them at once (the sweeps' max_parallel). Nothing while a batch is on its way."""
        if self.creating.get(name):
            return
        groups: dict[str | None, list[Resources]] = {}
        for resources in waiting:
            groups.setdefault(drv.size_for(resources), []).append(resources)
        held, throttle = self._held_cells(name)
        busy = {instance for instance, *_ in self.core.store.live_usage()}
        live = len(rows)
        for size, jobs in groups.items():
            spare = sum(1 for r in rows if r["size"] == size and r["id"] not in busy)
            need = machines_needed(
                jobs + [jobs[0]] * held, drv.size_slots(size), spare, live, drv.max_instances
            )
            if need > 0:
                self._create(name, drv, size, count=need, throttle=throttle)
                live += need
            held, throttle = 0, None

    def _held_cells(self, name: str) -> tuple[int, int | None]:
        """Cells of running sweeps on provider NAME that their sweep still holds, and how
        many of the sweeps' cells may run at once (None: no limit)."""
        held = 0
        throttle: int | None = 0  # None once a sweep has no limit
        for sweep in self.core.store.list_sweeps(states=["running"]):
            cells = self.core.store.sweep_jobs_brief(sweep["id"])
            if not cells or self.sweep_provider(sweep["id"], cells[0][0]) != name:
                continue
            held += sum(
                1
                for _juid, state, not_before, _req in cells
                if state == State.QUEUED.value and not_before >= HOLD
            )
            limit = sweep["spec"].get("max_parallel")
            throttle = None if throttle is None or not limit else throttle + int(limit)
        return held, throttle or None

    def sweep_provider(self, sid: str, juid: str) -> str | None:
        """The provider of sweep SID's cells (JUID is one of them); remembered."""
        if sid not in self.sweep_providers:
            job = self.core.store.get_job(juid)
            self.sweep_providers[sid] = job.provider if job else None
        return self.sweep_providers[sid]

    def _cancel_surplus(self, name: str, drv: Driver, now: float) -> None:
        """A batching kind's machines not started yet, or idle for a second, are cancelled
        once no job waits for them and no sweep cell is held (a sweep cancelled or paused:
        its array's tasks)."""
        if self.creating.get(name) or self._held_cells(name)[0]:
            return
        reached = {c.instance for c in drv.instances()}
        busy = {instance for instance, *_ in self.core.store.live_usage()}
        for row in self.core.store.instances(name, live=True):
            if row["id"] in busy or self.core.workers.busy(
                (name, row["id"])
            ):  # a job, or one coming
                continue
            if row["id"] not in reached or (
                row["idle_since"] is not None and self._since(row, "idle_since") >= 1
            ):
                self._destroy(name, drv, row["id"], "no job waits for it")

    def _grow_on_demand(self, name: str, drv: Driver, waiting: list[Resources], now: float) -> None:
        """Create on-demand machines for the jobs that need one, beyond those booting."""
        if not waiting or time.monotonic() < self.retry_at.get(name, 0.0):
            return
        rows = [r for r in self.core.store.instances(name, live=True) if not r["spot"]]
        reached = {c.instance for c in drv.instances()}
        booting = sum(1 for r in rows if r["id"] not in reached) + self.creating.get(name, 0)
        size = drv.size_for(waiting[0])
        live = len(self.core.store.instances(name, live=True)) + self.creating.get(name, 0)
        for _ in range(
            machines_needed(waiting, drv.size_slots(size), booting, live, drv.max_instances)
        ):
            self._create(name, drv, size, {"spot": False})

    def _create(
        self,
        name: str,
        drv: Driver,
        size: str | None,
        options: dict[str, object] | None = None,
        count: int = 1,
        throttle: int | None = None,
        request: int | None = None,
    ) -> None:
        """Create one machine, or COUNT with one ``create_nodes`` call (batching kinds).
        REQUEST: the user's `create instance` this is for (its outcome is recorded there;
        a failure is the user's to see, not the provider's to back off from)."""
        self.creating[name] = self.creating.get(name, 0) + count
        key = ("create", name, sum(self.creating.values()))

        def created(made: Instance | list[Instance]) -> None:
            self.creating[name] -= count
            self.failures.pop(name, None)
            for inst in made if isinstance(made, list) else [made]:
                self.core.store.record_instance(
                    inst,
                    detail=f"created ({size or 'default size'})"
                    + (" on request" if request else ""),
                )
                log.info("%s: created %s (%s)", name, inst.id, inst.size)
                if request is not None:
                    self.core.store.set_instance_request(request, "done", instance=inst.id)
            self.core.store.set_provider_error(name, None)

        def failed(exc: BaseException) -> None:
            self.creating[name] -= count
            if request is not None:
                why = str(exc) if isinstance(exc, MonkeyError) else f"{type(exc).__name__}: {exc}"
                self.core.store.set_instance_request(request, "failed", detail=why)
                return
            failures = self.failures[name] = self.failures.get(name, 0) + 1
            delay = min(_BACKOFF_MAX, 2.0**failures)
            self.retry_at[name] = time.monotonic() + delay
            why = str(exc) if isinstance(exc, MonkeyError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, NoCapacity):
                log.error("%s: creating a machine failed: %s (next try in %.0fs)", name, why, delay)
            self.core.store.set_provider_error(name, why)

        def create() -> Instance | list[Instance]:
            if count > 1:
                return drv.create_nodes(size, count, throttle)
            return drv.create_node(size, options)

        self.core.workers.submit(key, create, created, failed)

    # -- the user's requests: `monkey create|delete instance` ---------------------------------

    def requests(self, now: float) -> None:
        """Carry out the pending create/delete requests; follow those under way."""
        if not self.requests_seen:  # an earlier core died with these under way
            self.requests_seen = True
            for req in self.core.store.open_instance_requests():
                if req["state"] == "working" and req["action"] == "create":
                    self._request_failed(
                        req,
                        "the core stopped while it was under way (an "
                        "instance it made unrecorded is terminated); try again",
                    )
                elif req["state"] == "working":
                    self.core.store.set_instance_request(req["id"], "pending")
        for req in self.core.store.open_instance_requests():
            name = req["provider"]
            try:
                drv = self.core.driver(name)
            except MonkeyError as exc:
                self._request_failed(req, str(exc))
                continue
            if req["action"] == "create":
                self._create_request(req, name, drv, now)
            else:
                self._delete_request(req, name, drv, now)

    def _request_failed(self, req: dict[str, Any], why: str) -> None:
        log.error("%s instance on %s refused: %s", req["action"], req["provider"], why)
        self.core.store.set_instance_request(req["id"], "failed", detail=why)

    def _create_request(self, req: dict[str, Any], name: str, drv: Driver, now: float) -> None:
        """A cloud machine is created like one for a waiting job (then idles out as usual);
        an SSH host is claimed: the core contacts it and starts its agent."""
        if drv.elastic:
            if req["state"] == "pending" and name in self.inventoried:
                self.core.store.set_instance_request(req["id"], "working")
                # EC2 says spot, GCE preemptible
                options = (
                    None
                    if req["spot"] is None
                    else {"spot": req["spot"], "preemptible": req["spot"]}
                )
                self._create(name, drv, req["size"], options, request=req["id"])
            return
        hosts = getattr(drv.transport, "hosts", None)  # an SSH pool's hosts
        if not hosts:
            self._request_failed(
                req,
                f"provider {name!r} ({drv.kind}) has no instances to "
                "create or claim: it runs jobs on this machine",
            )
            return
        instance = req["instance"] or next((i for i in hosts if not hosts[i].up), next(iter(hosts)))
        if f"{name}/{instance}" in hosts:  # --host gpu1, as `run --host` takes it
            instance = f"{name}/{instance}"
        if instance not in hosts:
            self._request_failed(
                req, f"provider {name!r} has no host {instance!r}; its hosts: " + ", ".join(hosts)
            )
            return
        if req["state"] == "pending":
            self.core.store.set_instance_request(req["id"], "working", instance=instance)
            self.core.connect((name, instance))
            return
        host = hosts[instance]
        if host.up and (name, instance) in self.core.links:
            self.core.store.set_instance_request(req["id"], "done")
        elif host.error and not host.transient:
            self._request_failed(req, host.error)
        elif self.core.elapsed.since(("request", req["id"]), req["updated_at"]) > drv.boot_timeout:
            self._request_failed(
                req,
                f"{instance} not reached within {drv.boot_timeout:.0f}s"
                + (f" ({host.error})" if host.error else ""),
            )
        elif (name, instance) not in self.core.links:
            self.core.connect((name, instance))  # after a failed try, at its retry time

    def _delete_request(self, req: dict[str, Any], name: str, drv: Driver, now: float) -> None:
        """A cloud machine is terminated, an SSH host released (its agent stops once idle);
        one that runs jobs only with --force (they end `lost`, retried with --retries)."""
        instance = req["instance"]
        row = next((r for r in self.core.store.instances(name) if r["id"] == instance), None)
        if req["state"] == "working":
            if row is None or row["state"] == "terminated" or not drv.elastic:
                self.core.store.set_instance_request(req["id"], "done")
            return
        if row is None or row["state"] == "terminated":
            self._request_failed(req, f"instance {instance} of {name} is gone already")
            return
        jobs = [a.juid for a in self.core.store.live_attempts(instance)]
        if jobs and not (req["force"] and drv.elastic):  # an SSH host's jobs would run on
            self._request_failed(
                req,
                f"instance {instance} runs job(s) {', '.join(jobs)}; "
                f"cancel them first (`monkey job cancel {' '.join(jobs)}`)"
                + (
                    ", or add --force (they end lost and are retried while retries remain)"
                    if drv.elastic
                    else ""
                ),
            )
            return
        self.core.store.set_instance_request(req["id"], "working")
        if drv.elastic:
            self._destroy(name, drv, instance, "deleted on request")
        else:
            self._release_host(name, drv, instance)
        if jobs:
            self._end_attempts(name, instance)

    def _release_host(self, name: str, drv: Driver, instance: str) -> None:
        """Ask a fixed host's agent to stop once it runs no job, and drop the link to it."""
        key = (name, instance)
        link = self.core.links.get(key)
        if link is None or link.closed:
            return  # no agent of ours is linked there
        self.core.release(key)
        try:
            link.send("shutdown", if_idle=True)  # the agent's reply ends the link
        except (AgentGone, OSError) as exc:
            log.warning("releasing %s: %s", instance, exc)

    # -- shrinking -------------------------------------------------------------------------

    def _shrink(self, name: str, drv: Driver, now: float) -> None:
        store = self.core.store
        busy = {instance for instance, *_ in store.live_usage()}
        reached = {c.instance for c in drv.instances()}
        refused = drv.distrusted()
        for row in store.instances(name, live=True):
            if row["id"] in refused:
                if not self.core.workers.busy(("destroy", row["id"])):  # once per machine
                    store.set_provider_error(name, f"{refused[row['id']]}; monkey terminated it")
                    failures = self.failures[name] = self.failures.get(name, 0) + 1
                    self.retry_at[name] = time.monotonic() + min(_BACKOFF_MAX, 2.0**failures)
                    log.error("%s: %s", name, refused[row["id"]])
                self._destroy(name, drv, row["id"], "host key refused")
                continue
            if row["id"] in busy:
                if row["idle_since"] is not None:
                    store.set_instance_idle(row["id"], None)
                continue
            if row["id"] in self.noticed:
                self._destroy(name, drv, row["id"], "spot/preemption notice")
                continue
            if row["id"] not in reached:
                if self._since(row, "launched_at", 0.0) > drv.boot_timeout:
                    self._destroy(
                        name, drv, row["id"], f"not reached within {drv.boot_timeout:.0f}s"
                    )
                continue
            if row["idle_since"] is None:
                store.set_instance_idle(row["id"], now)
                self.core.elapsed.since(("idle_since", row["id"]), now)  # counted from now
            elif self._since(row, "idle_since") >= drv.idle_timeout:
                self._destroy(name, drv, row["id"], f"idle for {drv.idle_timeout:.0f}s")

    def _since(self, row: dict[str, Any], field: str, unknown: float = 0.0) -> float:
        """Seconds since the instance ROW's stored wall time FIELD (UNKNOWN when it has none),
        on the monotonic clock (``Elapsed``)."""
        stamp = row[field]
        return unknown if stamp is None else self.core.elapsed.since((field, row["id"]), stamp)

    def terminated(self, name: str, instance: str, why: str) -> None:
        """Record that monkey ended the machine (destroyed, or released after its attempt):
        it counts no more as booting or live."""
        row = next((r for r in self.core.store.instances(name) if r["id"] == instance), None)
        if row is not None:
            self.core.store.record_instance(
                Instance(instance, name, row["name"], InstanceState.TERMINATED, extra=row["extra"]),
                detail=why,
            )
        log.info("%s: %s: %s", name, instance, why)

    def _destroy(self, name: str, drv: Driver, instance: str, why: str) -> None:
        key = ("destroy", instance)
        if self.core.workers.busy(key):
            return

        self.core.release((name, instance))
        self.core.workers.submit(
            key,
            lambda: drv.destroy_node(instance),
            lambda _: self.terminated(name, instance, f"destroyed: {why}"),
            lambda exc: log.error("destroying %s failed: %s", instance, exc),
        )
