"""What every cloud kind (``ec2``, ``gce``) shares: instances monkey creates, labelled with
this home's id and the provider's name, reached over SSH like the hosts of an ``ssh``
provider once they run, with blobs going through the provider's bucket.

A cloud kind subclasses :class:`CloudDriver` and supplies the cloud's calls:
``_list`` (this home's instances of the provider, as Instances whose ``extra["node"]`` is
the cloud's name of the machine), ``_launch`` (create one, labelled with the launch id),
``_destroy`` (terminate one; gone already is no error) and ``_launched`` (what a launch id
made, to clean up after a failed create), plus its ``SIZES`` table and its kind rules.
Everything else — tracking the running instances as the SSH transport's hosts (host keys
pinned at first contact under the instance id, forgotten at termination), listing in a
thread while one boots, ``max_instances``, sizes, blobs by presigned URL, describing the
instances in ``list providers`` — lives here once.

At first contact an instance's host key must be one of those it printed on its console
(cloud-init's ``SSH HOST KEY KEYS`` block, read by the kind's ``_console``) when it printed
some; a key that is not is refused and the instance is reported by ``distrusted()``, so the
core terminates it. A console that prints none leaves the key trusted on first use.

Every sync and start arms the instance's agent with ``orphan`` ({timeout, command}: the
entry's ``orphan_timeout``, default 30 minutes, and ``shutdown_command``); the core pings
linked agents every ``ping_every`` seconds, and an agent left with no job and no request
for that long powers its machine off (see client_agent.orphan.OrphanWatch).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from monkey.drivers.base import Capacity, Driver, NoCapacity, hosts_summary
from monkey.drivers.bucket_transport import BucketTransport
from monkey.drivers.ssh_hosts import check_printed, host_spec, printed_host_keys, ssh_config
from monkey.models import Instance, InstanceState, MonkeyError, Resources, parse_size
from monkey.storage.bucket import BucketStorage

if TYPE_CHECKING:
    import paramiko

    from monkey.config import Home, ProviderConfig

log = logging.getLogger("monkey.cloud")

GIB = 1 << 30
_REFRESH_BOOTING = (0.25, 2.0)  # seconds between listings while one boots: first, at most
_REFRESH_IDLE = 30.0  # and otherwise (an instance may vanish: a spot reclaim)
ZONE_COOLDOWN = 10.0  # minutes a zone that preempted a machine is avoided (`zone_cooldown`)
ORPHAN_TIMEOUT = 1800.0  # seconds an instance waits for its core, idle, before powering off

# The startup script (EC2 user data, GCE `startup-script` metadata): the agent needs
# python3 and nothing else.
USER_DATA = """#!/bin/sh
# monkey: make sure python3 exists (monkey's agent needs nothing else)
command -v python3 >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q python3
elif command -v dnf >/dev/null 2>&1; then
    dnf install -y python3
elif command -v yum >/dev/null 2>&1; then
    yum install -y python3
elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache python3
elif command -v zypper >/dev/null 2>&1; then
    zypper --non-interactive install python3
fi
"""


class Size(NamedTuple):
    """A machine type: vCPUs, memory in GiB, GPUs."""

    name: str
    cpus: int
    memory: float
    gpus: int = 0

    def holds(self, resources: Resources) -> bool:
        memory = parse_size(resources.memory) / GIB if resources.memory else 0
        return resources.cpus <= self.cpus and resources.gpus <= self.gpus and memory <= self.memory


class CloudDriver(Driver):
    """Instances created on demand in a cloud, reached over SSH (see the module docstring)."""

    elastic = True
    SIZES: ClassVar[list[Size]] = []  # the kind's common sizes, cheapest first
    # The agent's watcher of the metadata service for spot/preemption notices (see
    # monkey/client_agent/notice.py): "ec2" or "gce".
    notice: ClassVar[str] = ""

    # -- the kind's rules -------------------------------------------------------------------

    @classmethod
    def _by_name(cls) -> dict[str, Size]:
        return {s.name: s for s in cls.SIZES}

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        """Only when no size of the table (nor the entry's own, when the table knows it)
        holds the job; an entry size the table does not know is given the benefit of doubt."""
        why = super().never_fits(config, resources)
        if why or any(s.holds(resources) for s in cls.SIZES):
            return why
        if str(config.options.get("size")) not in cls._by_name():
            return None
        top = max(cls.SIZES, key=lambda s: (s.cpus, s.gpus, s.memory))
        memory = f" --memory {resources.memory}" if resources.memory else ""
        return (
            f"no instance size of provider {config.name!r} holds --cpus {resources.cpus} "
            f"--gpus {resources.gpus}{memory}; the largest, {top.name}, has {top.cpus} cpus, "
            f"{top.gpus} gpus, {top.memory:.0f}G"
        )

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        """Its live instances (state, size, spot, address, jobs, age) and the slots and GPUs
        of those reached."""
        now = time.time()
        hosts = []
        for rec in instances:
            if rec["state"] == InstanceState.TERMINATED.value:
                continue
            extra = rec.get("extra") or {}
            state = rec["state"]
            if state == InstanceState.RUNNING.value:
                state = rec.get("reach") or state  # up, unreachable, error
            launched = rec.get("launched_at")
            hosts.append(
                {
                    "instance": rec["id"],
                    "host": rec.get("address") or "-",
                    "state": state,
                    "slots": extra.get("slots"),
                    "gpus": extra.get("gpus") or [],
                    "memory": extra.get("memory"),
                    "running": rec.get("running", 0),
                    "error": extra.get("error"),
                    "size": rec.get("size") or "-",
                    "spot": bool(rec.get("spot")),
                    "age": now - launched if launched else None,
                }
            )
        return hosts_summary(hosts)

    # -- provisioning ---------------------------------------------------------------------

    def __init__(self, config: ProviderConfig, home: Home, entry: dict[str, Any]) -> None:
        """ENTRY: the provider's options over the kind's defaults."""
        super().__init__(config, home)
        self.entry = entry
        self._track_lock = threading.Lock()
        self._boot_wait = 0.0  # next wait between listings while one boots (0: none boots)
        self._next_refresh = 0.0  # 0: never listed
        # Bumped by every listing's start and every create: a listing applied when it has
        # moved on since the listing began is stale (see _track).
        self._epoch = 0
        self._refresher: threading.Thread | None = None  # the listing thread, while it runs
        self._refresh_lock = threading.Lock()
        self._refresh_error = ""  # the last listing error logged (logged again when it changes)
        self._refused: dict[str, str] = {}  # instance -> why its host key was refused
        # The bucket blobs go through (its client is made on first use); None: over SSH.
        self.storage = self.bucket_storage(config) if entry.get("bucket") else None
        # Its transport, and the pool of its running instances' hosts.
        self.pool = self.transport = BucketTransport(
            config, home, entry, self.storage, self.list_nodes, self.agent_fields, self.orphan_field
        )
        self.pool.wake = lambda: self.wake()  # the core sets this driver's wake later
        self.spot_nodes: dict[str, str] = {}  # spot/preemptible instance -> its address (watched)
        self.zones: list[str] = []  # the zones a kind creates in, in order (GCE's `zones`)
        self._zone_of: dict[str, str] = {}  # instance -> its zone (``extra["zone"]``)
        # zone -> when it last preempted a machine (monotonic)
        self._zone_preempted: dict[str, float] = {}
        self._preempted_seen: set[str] = set()  # instances counted in _zone_preempted

    @property
    def max_instances(self) -> int | None:
        return int(self.entry["max_instances"])

    @abstractmethod
    def _list(self) -> list[Instance]:
        """This home's instances of the provider as the cloud lists them now."""

    @abstractmethod
    def _launch(self, size: str, launch: str, opts: dict[str, Any]) -> Instance:
        """Create one instance of SIZE labelled with the LAUNCH id (OPTS: the job's options);
        MonkeyError (NoCapacity for a quota or no capacity) when the cloud refuses."""

    @abstractmethod
    def _destroy(self, node: str) -> None:
        """Terminate the cloud's machine NODE; nothing happens when it is gone already."""

    @classmethod
    @abstractmethod
    def bucket_storage(cls, config: ProviderConfig) -> BucketStorage:
        """The storage of the entry's ``bucket`` (its client is made on first use)."""

    @abstractmethod
    def _launched(self, launch: str) -> list[Instance]:
        """The instances labelled with the LAUNCH id."""

    def _console(self, node: str) -> str | None:
        """The console output of the cloud's machine NODE (None: the cloud keeps none)."""
        return None

    def list_nodes(self) -> list[Instance]:
        """This home's instances of the provider, terminated ones included while the cloud
        still lists them; running ones with an address become the transport's hosts."""
        with self._track_lock:
            self._epoch += 1
            epoch = self._epoch
        found = self._list()
        self._track(found, listed=True, epoch=epoch)
        return [self._with_reach(i) for i in found]

    def create_node(
        self, size: str | None = None, options: Mapping[str, Any] | None = None
    ) -> Instance:
        """Launch one instance of SIZE (the job's `size` option first, else the entry's);
        OPTIONS are the job's job.yml options. NoCapacity at ``max_instances`` or when the
        cloud has none (a quota, no capacity), MonkeyError naming the key to fix otherwise;
        a launch that fails leaves no instance behind."""
        opts = dict(options or {})
        size = str(opts.get("size") or size or self.entry["size"])
        live = [i for i in self.list_nodes() if i.state != InstanceState.TERMINATED]
        limit = self.max_instances
        if limit is not None and len(live) >= limit:
            raise NoCapacity(
                f"{self.name}: {len(live)} instance(s) exist, max_instances is "
                f"{limit}; jobs wait for one to be free (or raise max_instances)"
            )
        launch = uuid.uuid4().hex
        try:
            created = self._launch(size, launch, opts)
        except MonkeyError:
            self._clean_up(launch)
            raise
        self._track([created])
        self._refresh_soon()  # follow its boot from now
        log.info(
            "%s: created %s (%s%s)", self.name, created.id, size, ", spot" if created.spot else ""
        )
        return created

    def destroy_node(self, instance: str) -> None:
        """Terminate the instance (nothing happens when it is gone already) and forget its
        host key."""
        self._destroy(self._node_id(instance))
        self.pool.remove_host(instance)
        self.pool.host_keys.forget(instance)
        self._refused.pop(instance, None)

    def preempted(self, instance: str) -> None:
        """Its zone preempted a machine now: avoided for the next creations."""
        with self._track_lock:
            self._zone_was_preempted(instance)

    def zones_to_try(self) -> list[str]:
        """The zones to create in, in order: ``zones`` without those that preempted a machine
        in the last ``zone_cooldown`` minutes (default 10) while another zone is left; when
        every zone did, all of them, the longest-ago preemption first."""
        cooldown = 60.0 * float(self.entry.get("zone_cooldown", ZONE_COOLDOWN))
        now = time.monotonic()
        calm = [z for z in self.zones if now - self._zone_preempted.get(z, -math.inf) >= cooldown]
        return calm or sorted(self.zones, key=lambda z: self._zone_preempted.get(z, 0.0))

    def _zone_was_preempted(self, instance: str) -> None:
        zone = self._zone_of.get(instance)
        if zone is not None and instance not in self._preempted_seen:
            self._preempted_seen.add(instance)
            self._zone_preempted[zone] = time.monotonic()
            if len(self.zones) > 1:
                log.info(
                    "%s: %s preempted %s: no new instance there for %g minutes",
                    self.name,
                    zone,
                    instance,
                    float(self.entry.get("zone_cooldown", ZONE_COOLDOWN)),
                )

    def distrusted(self) -> dict[str, str]:
        """Instances whose host key was refused at first contact (not one of those their
        console printed), with why."""
        return dict(self._refused)

    def size_for(self, resources: Resources) -> str | None:
        """The entry's size when it holds the job (or the table does not know it and the job
        asks for nothing more than one cpu), else the cheapest size of the table that holds
        it, else the entry's size."""
        default = str(self.entry["size"])
        known = self._by_name().get(default)
        if (known and known.holds(resources)) or (known is None and resources == Resources()):
            return default
        return next((s.name for s in self.SIZES if s.holds(resources)), default)

    def size_slots(self, size: str | None) -> int:
        """vCPUs of SIZE (the entry's by default) when the table knows it, else 1."""
        known = self._by_name().get(size or str(self.entry["size"]))
        return known.cpus if known else 1

    def clean_bucket(self, runs: list[str], keep: list[str] | None, grace: float) -> dict[str, int]:
        """`rm` and `gc` in the provider's bucket (see monkey.storage.bucket_gc); nothing
        without one (its jobs' files went over SSH to machines now gone)."""
        if self.storage is None:
            return {}
        from monkey.storage import bucket_gc

        return bucket_gc.clean(self.storage, runs, keep, grace, self.pool.tag)

    def instances(self) -> list[Capacity]:
        """The instances reached (never waits): listing and contacting run in threads."""
        self._refresh_soon()
        return self.pool.reached()

    def agent_fields(self, instance: str) -> dict[str, Any]:
        """``watch`` of the instance's metadata (``metadata_url``, ``{address}`` replaced)
        when it is a spot (preemptible) instance."""
        address = self.spot_nodes.get(instance)
        if address is None or not self.entry.get("metadata_url"):
            return {"orphan": self.orphan_field()}
        url = str(self.entry["metadata_url"]).replace("{address}", address)
        return {
            "watch": {
                "kind": self.notice,
                "url": url,
                "every": float(self.entry.get("notice_every", 1.0)),
            },
            "orphan": self.orphan_field(),
        }

    @property
    def orphan_timeout(self) -> float:
        """Seconds an instance of this provider with no job waits for a request from its
        core before powering itself off (`orphan_timeout`; 0: never)."""
        return float(self.entry.get("orphan_timeout", ORPHAN_TIMEOUT))

    def orphan_field(self) -> dict[str, Any]:
        """What arms the agent's orphan watch (client_agent.orphan.OrphanWatch)."""
        field: dict[str, Any] = {"timeout": self.orphan_timeout}
        if self.entry.get("shutdown_command"):
            field["command"] = str(self.entry["shutdown_command"])
        return field

    @property
    def ping_every(self) -> float | None:
        """Seconds between the core's pings to a linked agent, well within orphan_timeout."""
        timeout = self.orphan_timeout
        return max(0.5, min(60.0, timeout / 5)) if timeout > 0 else None

    def changes(self) -> list[tuple[Instance, str | None, dict[str, Any] | None]]:
        return self.pool.changes()

    # -- helpers --------------------------------------------------------------------------

    def _node_id(self, instance: str) -> str:
        prefix = f"{self.name}/"
        if not instance.startswith(prefix):
            raise MonkeyError(f"{instance!r} is not an instance of provider {self.name!r}")
        return instance[len(prefix) :]

    def _with_reach(self, inst: Instance) -> Instance:
        """INST with what the transport learnt of it in `extra` (slots, gpus, memory, error,
        workdir), so that recording the listing keeps them."""
        host = self.pool.hosts.get(inst.id)
        if host is None or not (host.capacity or host.error):
            return inst
        extra = {**inst.extra, "error": host.error, "workdir": host.workdir}
        if host.capacity is not None:
            cap = host.capacity
            extra.update(slots=cap.slots, gpus=cap.gpus, memory=cap.memory)
        return inst.replace(extra=extra)

    def _track(self, instances: list[Instance], listed: bool = False, epoch: int = 0) -> None:
        """Make the running instances (with an address) the transport's hosts; the others
        leave it, a terminated one (or, after a full LISTED listing, a vanished one) with
        its pinned host key.

        A listing (started at EPOCH) that a create or another listing overtook while it ran
        is stale: what it lacks may be newer than it (an instance just created, a host a
        newer listing added), so it removes no host, and the next listing comes soon
        instead of when the stale one would have said (up to _REFRESH_IDLE for a listing
        that saw nothing booting)."""
        sshconf = ssh_config()
        with self._track_lock:
            stale = listed and epoch != self._epoch
            if not listed:  # a create
                self._epoch += 1
            seen = set()
            for inst in instances:
                seen.add(inst.id)
                if inst.extra.get("zone"):
                    self._zone_of[inst.id] = str(inst.extra["zone"])
                if inst.extra.get("preempted"):  # reclaimed without a notice
                    self._zone_was_preempted(inst.id)
                if (
                    inst.spot
                    and inst.address
                    and inst.state in (InstanceState.PENDING, InstanceState.RUNNING)
                ):
                    self.spot_nodes[inst.id] = inst.address
                if inst.state == InstanceState.RUNNING and inst.address:
                    spec = host_spec(
                        {
                            "host": inst.address,
                            "name": inst.extra["node"],
                            "user": self.entry["user"],
                            "key": self.entry.get("key"),
                        },
                        sshconf,
                    )
                    spec = replace(
                        spec,
                        host_key_alias=inst.id,
                        confirm_key=functools.partial(self._confirm_key, inst.id),
                    )
                    self.pool.add_host(inst.id, spec, inst)
                elif inst.state != InstanceState.PENDING:
                    self.pool.remove_host(inst.id)
                    if inst.state == InstanceState.TERMINATED:
                        self.pool.host_keys.forget(inst.id)
            booting = any(i.state == InstanceState.PENDING for i in instances)
            if stale:
                wait = _REFRESH_BOOTING[0]
            elif listed:
                for gone in set(self.pool.hosts) - seen:
                    self.pool.remove_host(gone)
                    self.pool.host_keys.forget(gone)
                wait = (
                    min(max(self._boot_wait * 2, _REFRESH_BOOTING[0]), _REFRESH_BOOTING[1])
                    if booting
                    else 0.0
                )
            else:  # a create: look again soon
                wait = _REFRESH_BOOTING[0] if booting else self._boot_wait
            self._boot_wait = wait
            self._next_refresh = time.monotonic() + (wait or _REFRESH_IDLE)

    def _confirm_key(self, instance: str, key: paramiko.PKey) -> None:
        """Refuse KEY, seen at first contact, when the instance's console printed host keys
        and KEY is not one of them (remembered for ``distrusted``); a console that printed
        none (yet, or ever: not every image does) leaves the key trusted on first use."""
        printed = printed_host_keys(self._console(self._node_id(instance)) or "")
        try:
            check_printed(instance, key, printed)
        except MonkeyError as exc:
            self._refused[instance] = str(exc)
            raise
        if not printed:
            log.info("%s: its console prints no host keys; key pinned on first use", instance)

    def _refresh_soon(self) -> None:
        """List the instances in a thread when due: at first, while one boots, and now and
        then (one may vanish). While one boots, the thread lists again at the booting pace
        on its own, and contacts the instances that came up at once: a create is reached
        without waiting for the core's next pass."""
        with self._refresh_lock:
            if self._refresher is not None or (
                not self._boot_wait and time.monotonic() < self._next_refresh
            ):
                return
            self._refresher = threading.Thread(
                target=self._refresh, daemon=True, name=f"{self.kind}-{self.name}"
            )
            self._refresher.start()

    def _refresh(self) -> None:
        try:
            while True:
                delay = self._next_refresh - time.monotonic()
                if delay > 0 and self.pool.closing.wait(delay):
                    return
                self._next_refresh = (
                    time.monotonic() + _REFRESH_BOOTING[1]
                )  # until the listing says more
                try:
                    self.list_nodes()
                except Exception as exc:  # noqa: BLE001 - logged once per change; tried again
                    why = (
                        str(exc) if isinstance(exc, MonkeyError) else f"{type(exc).__name__}: {exc}"
                    )
                    if why != self._refresh_error:  # once per change, not once per retry
                        log.warning("%s", why)
                    self._refresh_error = why
                else:
                    self._refresh_error = ""
                    self.pool.reached()  # contact the instances that came up, now
                self.wake()
                with self._refresh_lock:
                    if not self._boot_wait:
                        self._refresher = None
                        return
        finally:
            with self._refresh_lock:
                if self._refresher is threading.current_thread():
                    self._refresher = None

    def _clean_up(self, launch: str) -> None:
        """Terminate what a failed launch may have started anyway (its launch label finds it)."""
        try:
            for inst in self._launched(launch):
                if inst.state != InstanceState.TERMINATED:
                    self.destroy_node(inst.id)
        except MonkeyError as exc:
            log.error(
                "%s: after a failed launch, could not check for a leaked instance "
                "(label monkey-launch=%s): %s",
                self.name,
                launch,
                exc,
            )


def cause(exc: BaseException) -> str:
    """What a connection error comes down to ("Connection refused", "timed out"), not the
    whole chain of wrappers and the request's URL."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if found:
        return found.group(1).strip()
    return "timed out" if "timed out" in text.lower() else one_line(exc)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    text = getattr(exc, "message", None) or getattr(exc, "value", None) or str(exc)
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
