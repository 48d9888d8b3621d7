"""The provider contract: every kind of compute is driven through this base class and the
transport it has (``monkey.drivers.transport``).

A kind (local, ssh, ec2, gce, slurm) is one module under ``monkey/drivers/`` with one
``Driver`` subclass, named in the lazy table of ``monkey/drivers/__init__.py``. The class
carries two things, and has a third:

**The kind's rules** (class methods, usable without a driver instance or a connection):
``validate`` checks its providers.yml entry, ``never_fits`` says why a job could never run
on it, ``describe`` is its line in ``monkey list providers``, ``job_options`` names the
job.yml ``providers: NAME:`` keys it takes. The shell, the API and the job spec ask these
instead of switching on kinds.

**Provisioning**, in libcloud's terms. ``list_nodes`` returns the provider's machines as
normalised :class:`~monkey.models.Instance` values (for clouds: only those tagged with this
MONKEY_HOME); ``create_node`` creates one (elastic kinds) or claims a free one (fixed kinds:
an SSH host); ``destroy_node`` terminates or releases one and is idempotent. ``elastic``
says whether the kind can create machines; ``max_instances`` bounds them; ``size_for``
picks the smallest size that holds a job. ``instances`` lists the capacity of the machines
that can take jobs now (placement works on it with ``monkey.core.placement``).

**Transport**, the other half, is an object the driver has (``driver.transport``, a
:class:`~monkey.drivers.transport.Transport`): reach an instance's agent (``connect``), make
blobs available there (``prepare``), say where runs, checkpoints and persisted folders live
there (``run_dir``, ``checkpoint_dir``, ``persist_dir``), bring results back (``finish``).
Kinds compose the local, SSH and bucket transports instead of forwarding their methods.

Lifecycle of an attempt, all driven by the core (the core alone writes the store; a
driver call may block, so the core runs them off its loop). ``connect``, ``prepare``,
``run_dir``, ``checkpoint_dir``, ``start_fields``, ``sync_fields``, ``follow`` and ``finish``
below are the transport's:

1. ``instances()`` lists what can take jobs; when queued jobs fit nowhere and the kind is
   elastic, the core calls ``create_node(size_for(resources))`` (booting nodes count as
   capacity) and, once it runs, reaches it like any other instance.
2. ``connect(instance)`` returns a live :class:`AgentLink` to the agent on that
   instance, starting (and, for remote kinds, installing) the agent when needed. The
   link is kept by the core and polled for pushed events; when it breaks the core
   calls ``connect`` again and re-syncs from its stored byte offsets.
3. ``prepare(instance, blobs)`` makes the given content-addressed blobs (code snapshot
   and datasets) available in ``blobs_dir(instance)``, sending only missing ones; or,
   for kinds whose instances fetch them (a cloud's bucket), makes them fetchable and
   returns the ``start`` fields that fetch them.
4. The core then sends the agent's ``start`` request with paths from ``run_dir`` and
   ``checkpoint_dir`` (and ``prepare``'s fields); ``signal`` and ``sync`` go through the
   same link.
   ``start_fields(instance, juid, attempt, outputs)`` adds what the agent needs to move results
   itself (kinds with a bucket: an upload form and the checkpoint to restore, see
   ``monkey.storage.results``); ``sync_fields(instance)`` what every sync carries (a
   ``watch`` of the instance's metadata for spot/preemption notices).
5. ``finish(instance, juid, attempt)`` brings results (logs, outputs, checkpoint) back to
   MONKEY_HOME when they do not already live there (from the bucket for kinds with one,
   also when the instance is gone).

Preemption: an agent that sees a notice ends its attempts with ``reason: preempted`` (after
uploading their checkpoints); an instance the cloud reclaimed without a notice is listed
TERMINATED (or STOPPED) with ``extra["preempted"]`` true, and its attempts end preempted
too. The core re-queues a preempted job at the head of the queue, without using a retry,
up to ``max_preemptions`` (providers.yml, default 10); with ``fallback: {on_demand_after:
N}`` it asks ``create_node(size, {"spot": False})`` for it after N preemptions and places
it only on instances whose Capacity ``extra["spot"]`` is false.
6. An elastic instance idle for ``idle_timeout`` seconds is destroyed with
   ``destroy_node``, and so is one listed by ``distrusted()`` (its host key refused); ``close()`` drops links (agents and their jobs keep running).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from monkey.models import Instance, InstanceState, MonkeyError, Record, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from monkey.config import Home, ProviderConfig
    from monkey.drivers.transport import Transport
    from monkey.models import Resources


class Capacity(Record):
    """What one instance (a machine with an agent) can hold at once."""

    __slots__ = ("instance", "slots", "gpus", "memory", "extra")

    def __init__(
        self,
        instance: str,
        slots: int,
        gpus: list[str] | None = None,
        memory: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.instance = instance
        self.slots = slots
        self.gpus = [] if gpus is None else gpus
        self.memory = memory
        self.extra = {} if extra is None else extra

    def could_hold(self, resources: Resources) -> bool:
        """Whether a job asking RESOURCES could run here when the instance is empty."""
        memory = parse_size(resources.memory) if resources.memory else 0
        return (
            resources.cpus <= self.slots
            and resources.gpus <= len(self.gpus)
            and (self.memory is None or memory <= self.memory)
        )


class NoCapacity(MonkeyError):
    """The provider cannot create or claim another instance now (its limit, a quota, no
    free host); the jobs that wait say why."""


class NotReady(MonkeyError):
    """The provider cannot be reached or trusted yet (a host down, a host key not in
    known_hosts yet): its jobs wait queued, saying why, and start once it can."""


# Keys every kind takes. lost_after: how long an instance may stay out of reach (its
# agent not linked, while the core runs) before its attempts are lost (default 10 minutes).
# isolation: whether jobs run in a sandbox (see client_agent/sandbox.py and start_isolation).
# engine: what runs jobs' images (auto: monkey's own runner where bubblewrap works, else
# the first of docker, podman, apptainer the worker has; see client_agent/engines.py).
SHARED_KEYS = {"type", "lost_after", "isolation", "engine"}
ISOLATIONS = ("auto", "sandbox", "none")
ENGINES = ("auto", "bwrap", "docker", "podman", "apptainer")
LOST_AFTER = 600.0
_LOST_AFTER_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def unknown_keys(where: str, name: str, entry: dict[str, Any], allowed: set[str]) -> None:
    """Refuse a providers.yml entry with a key outside ALLOWED and SHARED_KEYS, or a bad
    value of a shared key."""
    unknown = set(entry) - allowed - SHARED_KEYS
    if unknown:
        raise MonkeyError(
            f"{where}: provider {name!r}: unknown key {sorted(unknown)[0]!r}; "
            f"allowed: {', '.join(sorted((allowed | SHARED_KEYS) - {'type'}))}"
        )
    if entry.get("isolation", "auto") not in ISOLATIONS:
        raise MonkeyError(
            f"{where}: provider {name!r}: isolation must be auto, sandbox or none, "
            f"got {entry['isolation']!r}"
        )
    if entry.get("engine", "auto") not in ENGINES:
        raise MonkeyError(
            f"{where}: provider {name!r}: engine must be one of {', '.join(ENGINES)}, "
            f"got {entry['engine']!r}"
        )
    if "lost_after" in entry and lost_after(entry) is None:
        raise MonkeyError(
            f"{where}: provider {name!r}: lost_after must be a duration like "
            f"600, 90s, 10m or 1h (how long a machine may stay out of reach "
            f"before its jobs are lost), got {entry['lost_after']!r}"
        )


def start_isolation(options: dict[str, Any], users: int, owner: str, me: str) -> str:
    """The ``isolation`` of an agent's start for a job of OWNER on a provider with OPTIONS,
    in a home with USERS users where ME is the home's own Unix user: "sandbox" (in one, or
    refused), "auto" (in one when the worker can make it) or "none".

    ``isolation: auto`` (the default) isolates only where the home serves other people (a
    main node with more than one user); there a worker that cannot make a sandbox runs the
    jobs of ME alone, who has the server's authority anyway, and refuses the others'."""
    mode = options.get("isolation", "auto")
    if mode != "auto":
        return str(mode)
    if users <= 1:
        return "none"
    return "auto" if owner == me else "sandbox"


def isolation_of(options: dict[str, Any], users: int, why_not: str | None) -> str:
    """How a provider with OPTIONS isolates its jobs in a home with USERS users, one line for
    `list providers`: "sandbox ..." or "none (why)". WHY_NOT: why its workers cannot make a
    sandbox ("" when they can; None when unknown here, a remote worker's own)."""
    mode = options.get("isolation", "auto")
    if mode == "none":
        return "none (isolation: none: every job runs with the server's authority)"
    if mode == "auto" and users <= 1:
        return "none (one user; isolation: auto isolates on a main node with more)"
    if why_not is None:
        return "sandbox where a host has bubblewrap (see `monkey provider check`)"
    if not why_not:
        return "sandbox (bubblewrap)"
    if mode == "sandbox":
        return f"none: {why_not}; its jobs fail to start"
    return f"none: {why_not}; other users' jobs fail to start there"


def images_of(hello: dict[str, Any], options: dict[str, Any]) -> str | None:
    """The engine that runs jobs' images where the agent that said HELLO runs, for a
    provider with OPTIONS (its `engine`), for `provider check`: the engine, or "none: why";
    None when it does not say (an older agent)."""
    said = hello.get("images")
    if not isinstance(said, dict):
        return None
    wanted = options.get("engine", "auto")
    if wanted not in ("auto", "bwrap"):
        found = said.get("found") or []
        return str(wanted) if wanted in found else f"none: {wanted} is not installed there"
    return str(said.get("engine") or f"none: {said.get('why')}")


def sandbox_of(hello: dict[str, Any]) -> str | None:
    """Whether the agent that said HELLO can run jobs in a sandbox, for `provider check`:
    "sandbox (bubblewrap)" or "none: why"; None when it does not say (an older agent)."""
    said = hello.get("sandbox")
    if not isinstance(said, dict):
        return None
    return "sandbox (bubblewrap)" if said.get("bwrap") else f"none: {said.get('why')}"


def lost_after(options: dict[str, Any]) -> float | None:
    """Seconds of an entry's ``lost_after`` (LOST_AFTER when absent); None when invalid."""
    value = options.get("lost_after", LOST_AFTER)
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if 0 < value < float("inf") else None
    text = str(value).strip().lower()
    unit = text[-1:] if text[-1:] in "smhd" else ""
    number = text[:-1] if unit else text
    try:
        seconds = float(number) * _LOST_AFTER_UNITS[unit]
    except ValueError:
        return None
    return seconds if 0 < seconds < float("inf") else None


def hosts_summary(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    """``describe``'s answer for a provider of several machines: the machines, and the
    slots and GPUs of those whose agent is reached."""
    up = [h for h in hosts if h["state"] == "up"]
    return {
        "hosts": hosts,
        "slots": sum(h["slots"] or 0 for h in up),
        "gpus": sum(len(h["gpus"]) for h in up),
    }


class Driver(ABC):
    """A provider kind as the core sees it: its rules, provisioning and transport."""

    kind: ClassVar[str] = ""
    elastic: ClassVar[bool] = False  # creates machines on demand (clouds)
    # Creates many machines in one ``create_nodes`` call (Slurm: a job array), one per job,
    # one call per size; a machine whose Capacity ``extra["size"]`` names its size takes
    # only jobs of that size (``size_for``).
    batches: ClassVar[bool] = False
    # Its ``finish`` releases the instance (a Slurm allocation lives for one attempt): the
    # core drops the instance's link quietly and makes no new one.
    releases_on_finish: ClassVar[bool] = False
    # Its instances' agents may be handed starts ahead of their free slots (the start
    # carries the instance's ``slots``; the agent holds what does not fit yet): fixed
    # machines, where a held start cannot keep a job from a machine made for it.
    hands_ahead: ClassVar[bool] = False
    job_options: ClassVar[frozenset[str]] = frozenset()  # job.yml `providers: NAME:` keys
    transport: Transport  # made by each kind's __init__

    @property
    def ping_every(self) -> float | None:
        """Seconds between the core's pings to a linked agent (None: none): a cloud
        instance's agent powers the machine off after `orphan_timeout` with no request from
        its core."""
        return None

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        self.name = config.name
        self.config = config
        self.home = home
        # Called (from any thread) when ``changes()`` has news; the core sets it.
        self.wake: Callable[[], None] = _nothing

    # -- the kind's rules -----------------------------------------------------------------

    @classmethod
    @abstractmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        """Refuse a bad providers.yml entry with a one-line MonkeyError naming the key and
        the fix (WHERE names the file)."""

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        """Why a job asking RESOURCES could never run on this provider, or None."""
        if resources.host:
            return f"provider {config.name!r} has no named hosts; --host is for ssh providers"
        return None

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        """The provider in ``monkey list providers``: ``slots`` and ``gpus`` usable now, and
        for kinds with several machines ``hosts`` (one dict per machine: instance, host,
        state, slots, gpus, memory, running, error). INSTANCES are its recorded ones."""
        return {}

    def default_image(self) -> str | None:
        """The OCI image a job without one runs in on this provider (its entry's), or None:
        such a job runs on the machine itself."""
        return None

    # -- provisioning -----------------------------------------------------------------------

    @property
    def max_instances(self) -> int | None:
        """How many instances the provider may have at once (None: no limit of monkey's)."""
        value = self.config.options.get("max_instances")
        return int(value) if value is not None else None

    def list_nodes(self) -> list[Instance]:
        """The provider's machines as they are now; fixed kinds: one per usable instance."""
        return [
            Instance(c.instance, self.name, c.instance, InstanceState.RUNNING, extra=c.extra)
            for c in self.instances()
        ]

    def create_node(
        self, size: str | None = None, options: Mapping[str, Any] | None = None
    ) -> Instance:
        """Create (or claim) one machine of SIZE (None: the provider's default) and return it,
        usually still PENDING. OPTIONS: the job.yml options of the job it is made for, or how
        the core wants it (``{"spot": False}``: an on-demand machine); kinds that take none
        ignore them. NoCapacity when none can be had now."""
        raise NoCapacity(f"provider {self.name!r} ({self.kind}) cannot create machines")

    def create_nodes(
        self, size: str | None, count: int, throttle: int | None = None
    ) -> list[Instance]:
        """Create COUNT machines of SIZE in one request, at most THROTTLE of them running at
        once (kinds with ``batches``; the core then cancels those not started yet, with
        ``destroy_node``, once no job waits for them). The default makes them one by one."""
        return [self.create_node(size) for _ in range(count)]

    def destroy_node(self, instance: str) -> None:
        """Terminate (or release) the instance; nothing happens when it is already gone."""
        return None

    def distrusted(self) -> dict[str, str]:
        """Instances the transport refused to trust, with why (a host key at first contact
        that is not among those the machine printed on its console): the core destroys
        them at once, never sends them a job, and shows why on the jobs that wait."""
        return {}

    def preempted(self, instance: str) -> None:
        """The instance's agent saw a spot/preemption notice (called on the core's loop: it
        must not block). A kind with several zones avoids the instance's zone for its next
        creations (see ``CloudDriver.zones_to_try``)."""
        return None

    def size_for(self, resources: Resources) -> str | None:
        """The smallest size of the provider that holds RESOURCES (None: its default)."""
        return None

    def size_slots(self, size: str | None) -> int:
        """Job slots (CPUs) of a machine of SIZE (None: the default size) before it is
        reached; the core plans how many machines to create with it."""
        return 1

    def price(self, size: str | None, spot: bool = False) -> float | None:
        """Estimated $/hour of a machine of SIZE (SPOT: a spot or preemptible one), from the
        entry's ``prices:`` or the provider's price list, asking no API (the core calls it
        in its loop, for spend quotas); None when nothing knows."""
        return None

    @property
    def idle_timeout(self) -> float:
        """Seconds an elastic instance may stay without a job before it is destroyed."""
        return float(self.config.options.get("idle_timeout", 600))

    @property
    def boot_timeout(self) -> float:
        """Seconds an elastic instance may take from its creation until its agent answers;
        past them it is destroyed (an instance created but never reached is not kept)."""
        return float(self.config.options.get("boot_timeout", 600))

    @abstractmethod
    def instances(self) -> list[Capacity]:
        """Instances that can take jobs now, and what each can hold."""

    def changes(self) -> list[tuple[Instance, str | None, dict[str, Any] | None]]:
        """What the driver learnt of its instances by itself since the last call (an SSH host
        reached or lost in a background thread): ``(instance, reach, extra)`` each, recorded
        by the core (drivers never write the store)."""
        return []

    def close(self) -> None:
        """Drop connections (the transport's too); agents and jobs keep running."""
        self.transport.close()


def _nothing() -> None:
    return None
