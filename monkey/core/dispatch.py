"""The core's start path: place queued jobs, open their attempts, make their inputs ready
on the instance (off the loop), build the agent's ``start`` and send it once committed.

A mixin of ``monkey.core.scheduler.Core``, which holds the state named below."""

from __future__ import annotations

import itertools
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator

from monkey.core.placement import Placement, Usage, fair_order, memory_needed, place, slots_needed
from monkey.core.quota import QuotaPass
from monkey.core.start_streaks import StartStreaks
from monkey.drivers.agent_link import AgentGone
from monkey.drivers.base import Capacity, Driver, NotReady, start_isolation
from monkey.environments import start_fields
from monkey.models import (
    REDACTED,
    Attempt,
    Job,
    MonkeyError,
    Resources,
    State,
    env_seconds,
    parse_size,
)
from monkey.snapshot.blobs import BlobDamaged
from monkey.store.db import local_user
from monkey.store.errors import DiskFull, is_no_space

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home, ProviderConfig
    from monkey.core.provisioning import Elastic
    from monkey.core.room import Room
    from monkey.core.workers import Workers
    from monkey.drivers.agent_link import AgentLink
    from monkey.snapshot.blobs import BlobStore
    from monkey.store import Store
    from monkey.store.outputs import StartFacts

log = logging.getLogger("monkey.core")

KILL_GRACE = env_seconds("MONKEY_KILL_GRACE", 10.0)
_PREPARE_TRIES = 3  # starts whose inputs cannot be made ready before the job fails
_WAITING_MAX = 1000  # queued jobs of an elastic provider looked at per pass
# An instance where an attempt that ran less than AHEAD_RUN seconds ended within the last
# _AHEAD_WINDOW seconds (short jobs, one after the other) is handed starts ahead of its free
# slots (drivers with ``hands_ahead``), up to _AHEAD_FACTOR times its slots in all but at
# most _AHEAD_MAX more: its agent holds them and spawns the next one the moment a job ends,
# instead of the slot waiting for a round trip through the core. A start held longer than
# the agent's HOLD_LIMIT (the slots stayed taken) comes back as never started and is
# queued again.
_AHEAD_WINDOW = float(os.environ.get("MONKEY_AHEAD_WINDOW", "0.5"))
AHEAD_RUN = 1.0
_AHEAD_FACTOR = 8
_AHEAD_MAX = 32
# cancel_doomed looks again at jobs changed this long before its last look: a change is
# stamped before its transaction commits, possibly after that look began.
_DOOM_MARGIN = 10.0


class Dispatch:
    """Starting jobs, for the core (see Core.__init__ for each field)."""

    home: Home
    store: Store
    workers: Workers
    blobs: BlobStore
    elastic: Elastic
    providers: dict[str, ProviderConfig]
    drivers: dict[str, Driver]
    links: dict[tuple[str, str], AgentLink]
    retry_at: dict[tuple[str, str], float]
    finishing: set[tuple[str, int]]
    followed: dict[tuple[str, str], list[tuple[str, int]]]
    starting: dict[tuple[tuple[str, str], int], tuple[str, int, str | None]]
    manifests: dict[str, list[Any]]
    given: dict[tuple[str, str], set[str]]
    last_given: dict[tuple[tuple[str, str], str], str]
    prepare_failures: dict[str, int]
    not_ready: dict[str, str | None]
    waiting: dict[str, list[Resources]]
    on_demand: dict[str, list[Resources]]
    full: set[str]
    ended_at: dict[tuple[str, str], tuple[float, float]]
    to_send: list[Callable[[], None]]
    passes: int
    doom_checked: float
    room: Room
    start_streaks: StartStreaks  # per provider: starts in a row that came to nothing
    start_links: set[tuple[str, str]]  # instances a start waits to be linked to
    quota_held = True  # jobs may carry a quota's reason (a new core clears stale ones)

    if TYPE_CHECKING:  # the core's own, called from here

        def driver(self, provider: str) -> Driver: ...
        def connect(self, key: tuple[str, str]) -> None: ...
        def drop_link(self, key: tuple[str, str]) -> None: ...
        def needs_on_demand(self, job: Job) -> bool: ...
        def _never_started(self, att: Attempt, why: str | None = ...) -> None: ...
        def changed(self) -> None: ...

    def usage(self) -> dict[str, Usage]:
        """What the live attempts take of each instance. An attempt that exited takes
        nothing while its results come back: its processes are gone."""
        used: dict[str, Usage] = {}
        for instance, cpus, gpus, memory, juid, n in self.store.live_usage():
            if (juid, n) in self.finishing:
                continue
            u = used.setdefault(instance, Usage())
            u.slots += max(1, cpus or 1)
            u.gpus.update(g for g in gpus.split(",") if g)
            if memory is not None:
                u.memory += parse_size(memory)
        return used

    def cancel_doomed(self) -> None:
        """Cancel the queued and paused jobs waiting for a job that had to succeed and ended
        otherwise (or was removed); their own dependents follow in the same pass. Only jobs
        changed lately are looked at (all of them in a core's first pass)."""
        since = self.doom_checked and self.doom_checked - _DOOM_MARGIN
        self.doom_checked = time.time()
        cancelled = True
        while cancelled:
            cancelled = False
            for juid, dep, dep_state, state in self.store.doomed(since):
                how = (
                    "was removed"
                    if dep_state is None
                    else ("failed" if dep_state == "failed" else f"ended {dep_state}")
                )
                reason = f"dependency {dep} {how}"
                if self.store.transition(
                    juid,
                    State(state),
                    State.CANCELLED,
                    kind="dependency",
                    detail=reason,
                    reason=reason,
                    request=None,
                ):
                    log.info("%s cancelled: %s", juid, reason)
                    cancelled = True
                    self.changed()

    def dispatch_ready(self, now: float) -> None:
        """Place and start every queued job that fits somewhere now (and that takes its
        owner over no quota: those wait, saying why)."""
        usage: dict[str, Usage] | None = None
        self.waiting = {}
        quotas = self.store.quotas()  # the one look when no quota is set
        if not quotas and self.quota_held:
            self.store.release(None)
        self.quota_held = bool(quotas)
        for provider in self.providers:
            if (
                provider in self.full
                or not self.store.has_ready(provider, now)
                or self.start_streaks.resting(provider)  # flagged: its jobs wait, saying why
            ):
                continue
            try:
                drv = self.driver(provider)
                capacities = drv.instances()
            except NotReady as exc:  # the jobs wait, saying why, and start once it is
                self._not_ready(provider, str(exc))
                continue
            except MonkeyError as exc:
                self._fail_queued(provider, str(exc), now)
                continue
            if not drv.elastic:  # this machine's jobs also wait while its disk is full
                room = self.room.wait() if drv.kind == "local" else None
                if room is not None:
                    self._not_ready(provider, room)
                    continue
                if not self.start_streaks.flagged(provider):  # a flag keeps its reason
                    self._not_ready(provider, None)
            if usage is None:
                usage = self.usage()
            if self.elastic.noticed:  # machines about to go take no new job
                capacities = [c for c in capacities if c.instance not in self.elastic.noticed]
            slots: dict[str, int] = {}  # the real slots, told to agents handed starts ahead
            if drv.hands_ahead:
                slots = {c.instance: c.slots for c in capacities}
                capacities = self._ahead(provider, capacities)
            free = sum(max(0, c.slots - usage.get(c.instance, Usage()).slots) for c in capacities)
            if free <= 0 and not drv.elastic:
                self.full.add(provider)
                continue
            # An elastic provider also learns which jobs fit nowhere: machines are made for them.
            limit = _WAITING_MAX if drv.elastic else free + 2
            waiting = self.waiting[provider] = []
            on_demand = self.on_demand[provider] = []
            spot: set[str] | None = None
            quota = QuotaPass(quotas, self.store.quota_use(provider), provider) if quotas else None
            owners: dict[str, str | None] = {}  # juid -> owner, with quotas
            held: dict[str, list[str]] = {}  # reason -> the jobs it holds back this pass
            prices: dict[str, float | None] | None = None
            looked = 0  # with quotas, the jobs held back do not count toward LIMIT
            for job in self._in_turn(provider, now, limit, quota, owners):
                owner = owners.get(job.juid)
                if quota and (why := quota.over(owner, job)):
                    held.setdefault(why, []).append(job.juid)
                    continue
                looked += 1
                if looked > limit:
                    break
                where, unplaced = capacities, waiting
                if drv.elastic and self.needs_on_demand(job):
                    if spot is None:
                        spot = {
                            r["id"] for r in self.store.instances(provider, live=True) if r["spot"]
                        }
                    where, unplaced = [c for c in capacities if c.instance not in spot], on_demand
                if drv.batches:  # a machine made for one job's size takes only such a job
                    size = drv.size_for(job.resources)
                    where = [c for c in where if c.extra.get("size", size) == size]
                placement = place(job.resources, where, usage, pinned=job.resources.host)
                rate = 0.0
                if quota and quota.spend_limited(owner):
                    if prices is None:
                        prices = {r["id"]: r["price"] for r in self.store.instances(provider)}
                    rate = self._rate(provider, drv, job, placement, where, prices)
                    if why := quota.over(owner, job, rate):
                        if placement is not None:
                            _unplace(usage, placement, job, where)
                        held.setdefault(why, []).append(job.juid)
                        continue
                if placement is None:
                    unplaced.append(job.resources)
                    continue
                if quota:
                    quota.took(owner, job, rate)
                self.start(
                    job,
                    drv,
                    placement.instance,
                    placement.gpus,
                    any(c.gpus for c in capacities if c.instance == placement.instance),
                    slots.get(placement.instance),
                )
                if not drv.elastic and all(
                    usage.get(c.instance, Usage()).slots >= c.slots for c in capacities
                ):
                    break  # full: the jobs after this one wait for an exit
            if quota:
                self._held(provider, quota, held)

    def _in_turn(
        self,
        provider: str,
        now: float,
        limit: int,
        quota: QuotaPass | None = None,
        owner_of: dict[str, str | None] | None = None,
    ) -> Iterator[Job]:
        """PROVIDER's ready jobs in the order they get free slots: the store's (priority,
        then oldest); with several owners' jobs queued, by fair share (``fair_order``, with
        the owners' weights when quota entries set them).
        With QUOTA, owners at their jobs quota are left out (their jobs held, saying why),
        OWNER_OF learns each job's owner, and the caller stops at LIMIT jobs not held back
        (each owner's first LIMIT are looked at)."""
        owners = self.store.queued_owners()
        if quota is None and len(owners) < 2:
            return self.store.ready_jobs(now, limit=limit, provider=provider)
        heads: dict[str | None, Iterator[Job]] = {}
        for o in owners:
            if quota and (why := quota.full(o)):
                self.store.hold_owner(o, provider, why)
                quota.held_owners.add(o)
                continue
            jobs = self.store.ready_jobs(now, limit=limit, provider=provider, owner=o)
            heads[o] = jobs if owner_of is None else _owned(jobs, o, owner_of)
        use = quota.use if quota else {o: u for (o, _), u in self.store.quota_use(provider).items()}
        shares = {o: quota.share(o) for o in heads} if quota else None
        ordered = fair_order(heads, {o: int(u[3]) for o, u in use.items()}, shares)
        return ordered if quota else itertools.islice(ordered, limit)

    def _held(self, provider: str, quota: QuotaPass, held: dict[str, list[str]]) -> None:
        """Record why HELD's jobs wait this pass; the quota reasons of PROVIDER's other
        jobs are cleared (their owners are within their quotas, or it is their turn)."""
        for why, juids in held.items():
            self.store.hold(juids, why)
        kept = [j for juids in held.values() for j in juids]
        self.store.release(provider, keep_owners=quota.held_owners, keep=kept)

    def _rate(
        self,
        provider: str,
        drv: Driver,
        job: Job,
        placement: Placement | None,
        where: list[Capacity],
        prices: dict[str, float | None],
    ) -> float:
        """The $/hour JOB would add (as ``Store.begin_attempt`` will charge it): its share
        of the CPUs of the instance it is placed on, times that instance's price; placed
        nowhere on an elastic provider, its share of a new machine of its size (priced by
        the driver: the entry's ``prices:`` or the cloud's list price, else as the dearest
        of the provider's machines of that size known); 0 when unknown."""
        if placement is not None:
            price = prices.get(placement.instance)
            cap = next((c for c in where if c.instance == placement.instance), None)
            if price is None or cap is None:
                return 0.0
            return price * min(1.0, max(1, job.resources.cpus) / max(1, cap.slots))
        if not drv.elastic:
            return 0.0
        size = drv.size_for(job.resources)
        price = drv.price(size)
        if price is None:
            known = [
                r["price"]
                for r in self.store.instances(provider)
                if r["size"] == size and r["price"] is not None
            ]
            price = max(known, default=None)
        share = min(1.0, max(1, job.resources.cpus) / max(1, drv.size_slots(size)))
        return float(price or 0.0) * share

    def _ahead(self, provider: str, capacities: list[Capacity]) -> list[Capacity]:
        """CAPACITIES with more slots on instances where short attempts just ended (see
        AHEAD_RUN): the starts beyond the real slots are held by the agent until one frees."""
        now = time.monotonic()
        ended = self.ended_at.get
        return [
            c.replace(slots=min(_AHEAD_FACTOR * c.slots, c.slots + _AHEAD_MAX))
            if (e := ended((provider, c.instance)))
            and now - e[0] < _AHEAD_WINDOW
            and e[1] < AHEAD_RUN
            else c
            for c in capacities
        ]

    def _not_ready(self, provider: str, why: str | None) -> None:
        """Record why PROVIDER cannot be reached or trusted yet (None: it can again), shown
        by `info job` and `list providers` for the jobs waiting for it."""
        if provider in self.not_ready and self.not_ready[provider] == why:
            return
        self.not_ready[provider] = why
        if why is not None:
            log.warning("%s: jobs wait: %s", provider, why)
        self.store.set_provider_error(provider, why)

    def came_to_nothing(self, provider: str, why: str) -> None:
        """A start of PROVIDER's job came to nothing (see ``StartStreaks``): past a few in a
        row, the provider is flagged, saying why, and rests before the next try."""
        flag = self.start_streaks.failed(provider, why)
        if flag is not None:
            self._not_ready(provider, flag)

    def started_on(self, provider: str) -> None:
        """A job started on PROVIDER: its streak of starts that came to nothing ends."""
        if self.start_streaks.started(provider):
            self._not_ready(provider, None)

    def _fail_queued(self, provider: str, why: str, now: float) -> None:
        for job in self.store.ready_jobs(now, limit=100, provider=provider):
            att = self.store.begin_attempt(job, provider, "")
            if att is not None:
                self.store.end_attempt(
                    job.juid, att.n, final=State.FAILED, exit_code=None, signal=None, reason=why
                )

    def start(
        self,
        job: Job,
        drv: Driver,
        instance: str,
        gpus: list[str],
        has_gpus: bool,
        slots: int | None = None,
    ) -> None:
        """Open an attempt; off the loop, make its checkpoint and blobs ready on the instance;
        then ask the instance's agent to start it (with SLOTS, the instance's: when it
        does not fit there yet, the agent holds it until it does)."""
        key = (job.provider, instance)
        # Linked first: a connect syncs the attempts live there, and this one must not be
        # among them before the agent has been asked to start it.
        if key not in self.links:
            self.start_links.add(key)  # a connect that fails counts as a start that failed
            self.connect(key)
            return
        if time.monotonic() < self.retry_at.get(key, 0):
            return  # a start there just failed: not again at once
        n = job.attempts + 1
        run_dir = drv.transport.run_dir(instance, job.juid, n)
        att = self.store.begin_attempt(job, instance, run_dir, ",".join(gpus))
        if att is None:
            return
        facts = self.store.start_facts(job.juid)
        assert facts is not None  # its attempt was just opened in this transaction
        try:
            spec = self.start_spec(job, facts, drv, instance, run_dir, gpus, has_gpus)
            if slots is not None:
                spec.update(slots=slots, cpus=max(1, job.resources.cpus))
        except (MonkeyError, OSError) as exc:
            self._start_failed(key, att, exc)
            return
        blobs = spec.pop("_blobs")
        outputs = facts.outputs
        checked = list(dict.fromkeys([*blobs, *(d["digest"] for d in job.datasets)]))
        hashed = self.blobs.unchecked(checked, self.store.blob_stamps)

        def call() -> tuple[str, dict[str, Any]]:
            for digest in checked:  # the source of every copy: never a damaged one
                try:
                    self.blobs.check(digest)
                except BlobDamaged as exc:
                    raise exc.about(self._blob_role(job, digest), job.juid) from None
            checkpoint = drv.transport.checkpoint_dir(instance, job.juid)
            return checkpoint, {
                **drv.transport.prepare(instance, blobs),
                **drv.transport.start_fields(instance, job.juid, n, outputs),
            }

        opened = self.passes

        def then(ready: tuple[str, dict[str, Any]]) -> None:
            if hashed:  # a later core need not hash them again (only a saving: never fatal)
                try:
                    self.store.add_blobs(self.blobs.stamped(hashed))
                except (MonkeyError, OSError, sqlite3.Error) as exc:
                    log.warning("could not record the check of %d blobs: %s", len(hashed), exc)
            self._send_start(key, att, spec, *ready, job=job if self.passes == opened else None)

        self._transport(
            key, drv, call, then, lambda exc: self._start_failed(key, att, exc), slow=bool(hashed)
        )

    def _blob_role(self, job: Job, digest: str) -> str | None:
        """What blob DIGEST is to JOB: the path of a code or dataset file, or a file list."""
        lists = [("code", job.snapshot)] if job.snapshot else []
        lists += [(f"dataset {ds['name']}", ds["digest"]) for ds in job.datasets]
        for label, listed in lists:
            if listed == digest:
                return f"{label} (its file list)"
            try:
                for f in self._manifest(listed):
                    if f[1] == digest:
                        return f[0] if label == "code" else f"{label} file {f[0]}"
            except (MonkeyError, OSError, ValueError):
                continue
        return None

    def _transport(
        self,
        key: tuple[str, str],
        drv: Driver,
        call: Callable[[], Any],
        then: Callable[[Any], None],
        failed: Callable[[BaseException], None],
        lane: tuple[str, ...] | None = None,
        slow: bool = False,
    ) -> None:
        """Run a transport CALL for the instance KEY in a worker, after the calls made
        earlier on the same LANE (default: KEY itself), or here when the driver's transport
        is quick, the call not SLOW (blobs to hash) and nothing else is under way on it
        (the order stays)."""
        lane = lane or key
        if slow or not drv.transport.quick or self.workers.busy(lane):
            self.workers.submit(lane, call, then, failed)
            return
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - handed to `failed`, as a worker would
            failed(exc)
            return
        then(result)

    def _send_start(
        self,
        key: tuple[str, str],
        att: Attempt,
        spec: dict[str, Any],
        checkpoint: str,
        blob_fields: dict[str, Any],
        job: Job | None = None,
    ) -> None:
        """Ask the agent to start the attempt, now that its inputs are on the instance or
        BLOB_FIELDS (the driver's: presigned URLs, never logged nor stored) fetch them.
        JOB: the job as the same pass opened the attempt (read again when None)."""
        job = job or self.store.get_job(att.juid)
        link = self.links.get(key)
        if job is None or job.state != State.DISPATCHING or job.attempts != att.n:
            return
        if link is None or job.request:
            # Not asked: nothing ran. A cancel or pause takes effect; else it is queued again.
            self._never_started(att, f"the link to {key[1]} dropped before its start was sent")
            return
        spec["env"]["MONKEY_CHECKPOINT_DIR"] = checkpoint

        def send() -> None:
            if self.links.get(key) is not link:
                return  # dropped in the same pass: the next sync finds it never started
            try:
                # Not waiting for the reply lets the core go on while the agent spawns; a
                # refusal comes back through poll, the start itself as a `started` event.
                rid = link.send("start", **spec, **blob_fields)
            except AgentGone as exc:
                # The agent may or may not have started it: the next sync decides.
                log.error("dispatch of %s to %s interrupted: %s", att.juid, key[1], exc)
                self.drop_link(key)
                return
            self.starting[(key, rid)] = (att.juid, att.n, spec.get("manifest"))
            following = self.followed.get(key, [])
            if (att.juid, att.n) not in following:  # a health pass may have added it already
                self._follow(key, [*following, (att.juid, att.n)])

        self.prepare_failures.pop(att.juid, None)
        self.to_send.append(send)  # sent once the pass that opened the attempt is committed

    def _follow(self, key: tuple[str, str], attempts: list[tuple[str, int]]) -> None:
        """Tell the instance's driver which attempts live there, when that changed."""
        if self.followed.get(key, []) == attempts:
            return
        drv = self.drivers.get(key[0])
        if drv is not None:
            drv.transport.follow(key[1], attempts)
        if attempts:
            self.followed[key] = attempts
        else:
            self.followed.pop(key, None)

    def _start_failed(self, key: tuple[str, str], att: Attempt, exc: BaseException) -> None:
        """The attempt's inputs could not be made ready: it never reached the agent. The
        job waits a second and tries again; the third failure in a row fails it (a cause
        that lasts must not spin through attempts). An instance that cannot be reached
        (NotReady) is the provider's problem, never the job's: it just waits."""
        log.error("cannot prepare %s attempt %d on %s: %s", att.juid, att.n, key[1], exc)
        if isinstance(exc, BlobDamaged):  # it will not heal by itself: never run it
            self.prepare_failures.pop(att.juid, None)
            self.store.end_attempt(
                att.juid, att.n, final=State.FAILED, exit_code=None, signal=None, reason=str(exc)
            )
            return
        self.retry_at[key] = time.monotonic() + 1.0
        if isinstance(exc, NotReady):
            self._never_started(att, f"{key[1]} is not ready: {exc}")
            return
        if self._out_of_room(key, att, exc):
            return
        failures = self.prepare_failures[att.juid] = self.prepare_failures.get(att.juid, 0) + 1
        if failures < _PREPARE_TRIES:
            self._never_started(att, f"cannot prepare its inputs: {exc}")
            return
        self.prepare_failures.pop(att.juid, None)
        self.store.end_attempt(
            att.juid,
            att.n,
            final=State.FAILED,
            exit_code=None,
            signal=None,
            reason=f"cannot prepare its inputs on {key[1]}: {exc}",
        )

    def _out_of_room(self, key: tuple[str, str], att: Attempt, exc: BaseException) -> bool:
        """Whether ATT's start on KEY failed for want of space on this machine's disk (a
        `local` provider's): then it never started, and the provider's jobs wait for room."""
        drv = self.drivers.get(key[0])
        if drv is None or drv.kind != "local":
            return False
        if not isinstance(exc, DiskFull) and not (isinstance(exc, OSError) and is_no_space(exc)):
            return False
        self._not_ready(key[0], self.room.ran_out())
        self._never_started(att)
        return True

    def _manifest(self, digest: str) -> list[Any]:
        files = self.manifests.get(digest)
        if files is None:
            files = json.loads(self.blobs.read_bytes(digest))["files"]  # checked against its digest
            if len(self.manifests) > 256:
                self.manifests.clear()
            self.manifests[digest] = files
        return files

    def start_spec(
        self,
        job: Job,
        facts: StartFacts,
        drv: Driver,
        instance: str,
        run_dir: str,
        gpus: list[str],
        has_gpus: bool,
    ) -> dict[str, Any]:
        """The agent's `start` request for the job's next attempt (FACTS: the store's)."""
        env = drv.transport.job_env({k: v for k, v in job.env.items() if v != REDACTED})
        env.update(self._secrets(job.juid, facts.secrets))
        env.update(
            MONKEY_JUID=job.juid,
            MONKEY_ATTEMPT=str(job.attempts),
            MONKEY_RUN_DIR=run_dir,
            MONKEY_PROVIDER=job.provider,
        )  # MONKEY_CHECKPOINT_DIR: once the checkpoint is on the instance
        if gpus or has_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        code, blobs = self._code_fields((job.provider, instance), job)
        spec_fields: dict[str, Any] = {}
        spec = facts.spec
        if spec is not None:
            spec_fields, spec_blobs = start_fields(
                spec, self._manifest, drv.transport.persist_dir(instance, job.juid)
            )
            blobs += spec_blobs
        datasets = []
        for ds in job.datasets:
            ds_files = [f[:3] for f in self._manifest(ds["digest"])]
            blobs += [f[1] for f in ds_files]
            datasets.append(
                {
                    "digest": ds["digest"],
                    "env": f"MONKEY_DATASET_{ds['name']}",
                    "files": ds_files,
                    "single": ds.get("single", False),
                }
            )
        me = local_user()
        owner = facts.owner or me
        image = facts.image
        if image is not None:
            spec_fields.update(self._image_fields(image, drv.config.options))
        elif default := drv.default_image():  # the entry's image: pulled with the same login
            spec_fields.update(self._image_auth(default))
        return {
            "juid": job.juid,
            "attempt": job.attempts,
            "provider": job.provider,
            "isolation": start_isolation(drv.config.options, facts.users, owner, me),
            "owner": owner,  # a sandboxed job's environments are its owner's own
            "run_dir": run_dir,
            "argv": job.argv,
            "env": env,
            "resources": job.resources.to_json(),  # a kind that sizes a pod per job reads it
            **code,
            "blobs_dir": drv.transport.blobs_dir(instance),
            "datasets": datasets,
            "_blobs": blobs,
            **spec_fields,
            **(
                {"time_limit": job.resources.time, "grace": KILL_GRACE}
                if job.resources.time
                else {}
            ),
            **({"cwd": job.git["subdir"]} if job.git.get("subdir") else {}),
        }

    def _code_fields(self, key: tuple[str, str], job: Job) -> tuple[dict[str, Any], list[str]]:
        """The `start` fields naming the job's code for the instance KEY, and its blobs: the
        manifest's digest alone when the agent holds that list, else a delta against the
        last list of the same workdir it was given, else the full list."""
        if not job.snapshot:
            return {"files": []}, []
        files = [f[:3] for f in self._manifest(job.snapshot)]
        blobs = [f[1] for f in files]
        given = self.given.setdefault(key, set())
        base = self.last_given.get((key, job.workdir))
        fields: dict[str, Any] = {"manifest": job.snapshot}
        if job.snapshot not in given:
            fields["files"] = files
            if base is not None and base in given:
                old = {f[0]: f[:3] for f in self._manifest(base)}
                changes = [f for f in files if old.pop(f[0], None) != f]
                if len(changes) + len(old) < len(files):
                    del fields["files"]
                    fields.update(base=base, changes=changes, removed=list(old))
        given.add(job.snapshot)
        self.last_given[(key, job.workdir)] = job.snapshot
        return fields, blobs

    def _image_fields(self, image: dict[str, str], options: dict[str, Any]) -> dict[str, Any]:
        """The `start` fields of a job in IMAGE on a provider with OPTIONS: what the worker
        pulls, with which engine, and the login and CA of its registry (sent for the pull
        only; never in the job's record or env)."""
        from monkey.images import parse

        ref = parse(image["ref"])
        fields: dict[str, Any] = {
            "image": {
                "ref": image["ref"],
                "name": ref.name,
                "digest": image["digest"],
                "engine": options.get("engine", "auto"),
            }
        }
        return {**fields, **self._image_auth(image["ref"])}

    def _image_auth(self, text: str) -> dict[str, Any]:
        """{"image_auth": the login and CA of the registry of the image TEXT}, or {} when
        this home has none (or TEXT is no image reference: its provider says so)."""
        from monkey.images import Registries, parse

        try:
            auth = Registries(self.home).pull_auth(parse(text).host)
        except MonkeyError:
            return {}
        return {} if auth is None else {"image_auth": auth}

    def _secrets(self, juid: str, ref: str | None) -> dict[str, str]:
        """The secret values of job JUID, from its file REF (None: it has none)."""
        if not ref:
            return {}
        try:
            return json.loads((self.home.secrets / ref).read_text())
        except (OSError, ValueError) as exc:
            log.error("secrets of %s unreadable: %s", juid, exc)
            return {}


def _owned(
    jobs: Iterator[Job], owner: str | None, owner_of: dict[str, str | None]
) -> Iterator[Job]:
    """JOBS, each noted in OWNER_OF as OWNER's as it is handed out."""
    for job in jobs:
        owner_of[job.juid] = owner
        yield job


def _unplace(
    usage: dict[str, Usage], placement: Placement, job: Job, where: list[Capacity]
) -> None:
    """Give back what ``place`` counted in USAGE for JOB."""
    used = usage[placement.instance]
    cap = next(c for c in where if c.instance == placement.instance)
    used.slots -= slots_needed(job.resources, cap)
    used.gpus.difference_update(placement.gpus)
    used.memory -= memory_needed(job.resources)
