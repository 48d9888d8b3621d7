"""The `ec2` provider: instances monkey creates in an EC2 region (libcloud's EC2NodeDriver),
reached over SSH like the hosts of an `ssh` provider once they run.

Provisioning lists, creates and terminates instances tagged ``monkey-home=<home id>`` and
``monkey-provider=<name>``, so a home only ever sees and touches its own. Each instance is
created in the provider's subnet and security group with its key pair, and a startup script
(user data) that makes sure python3 exists. A spot instance is asked for with ``spot: true``
(or the job's ``spot`` option).

Transport is an :class:`~monkey.drivers.ssh.SSHDriver` whose hosts are the running
instances (their public or private address, as ``address:`` says): agent install, logs and
fencing are the SSH provider's. Blobs (code, datasets) go to the provider's ``bucket``,
each uploaded once by digest, and the agent downloads those it lacks through presigned
URLs in its ``start`` request, so instances hold no credentials; an entry without a bucket
sends them over SSH instead. An instance's host key is pinned at first contact
under its instance id (trust on first use, for machines monkey created only) and forgotten
when the instance is terminated; a changed key on a live instance is refused.

libcloud and boto3 load only when the cloud is called (in the core's workers), never when
the kind's rules are asked.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from monkey.drivers import ec2_setup
from monkey.drivers.base import Capacity, Driver, NoCapacity, hosts_summary
from monkey.drivers.ssh import SSHDriver
from monkey.drivers.ssh_hosts import host_spec, ssh_config
from monkey.models import Instance, InstanceState, MonkeyError, Resources, parse_size
from monkey.snapshot import BlobStore
from monkey.storage import results as bucket_results
from monkey.storage import storage_for
from monkey.storage.base import source_size

if TYPE_CHECKING:
    from libcloud.compute.base import Node
    from libcloud.compute.drivers.ec2 import EC2NodeDriver

    from monkey.config import Home, ProviderConfig
    from monkey.drivers.agent_link import AgentLink
    from monkey.storage import Storage

log = logging.getLogger("monkey.ec2")
T = TypeVar("T")

_GIB = 1 << 30
_REFRESH_BOOTING = (0.25, 2.0)  # seconds between listings while one boots: first, at most
_REFRESH_IDLE = 30.0  # and otherwise (an instance may vanish: a spot reclaim)


class Size(NamedTuple):
    """An instance type: vCPUs, memory in GiB, GPUs."""

    name: str
    cpus: int
    memory: float
    gpus: int = 0

    def holds(self, resources: Resources) -> bool:
        memory = parse_size(resources.memory) / _GIB if resources.memory else 0
        return resources.cpus <= self.cpus and resources.gpus <= self.gpus and memory <= self.memory


# Common instance types, cheapest first (us-east-1 on-demand prices): `size_for` takes the
# first that holds a job.
SIZES = [Size(*s) for s in (
    ("t3.nano", 2, 0.5), ("t3.micro", 2, 1), ("t3.small", 2, 2), ("t3.medium", 2, 4), ("t3.large", 2, 8), ("c5.large", 2, 4),
    ("m5.large", 2, 8), ("t3.xlarge", 4, 16), ("c5.xlarge", 4, 8), ("m5.xlarge", 4, 16),
    ("r5.large", 2, 16), ("t3.2xlarge", 8, 32), ("c5.2xlarge", 8, 16), ("m5.2xlarge", 8, 32),
    ("r5.xlarge", 4, 32), ("g4dn.xlarge", 4, 16, 1), ("c5.4xlarge", 16, 32),
    ("g4dn.2xlarge", 8, 32, 1), ("m5.4xlarge", 16, 64), ("g5.xlarge", 4, 16, 1),
    ("g5.2xlarge", 8, 32, 1), ("c5.9xlarge", 36, 72), ("g4dn.12xlarge", 48, 192, 4),
    ("g5.12xlarge", 48, 192, 4), ("g5.48xlarge", 192, 768, 8),
)]  # fmt: skip
_BY_NAME = {s.name: s for s in SIZES}

# The startup script: the agent needs python3 and nothing else.
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

# EC2's own state names, where libcloud's map says only "unknown".
_EC2_STATES = {
    "pending": InstanceState.PENDING, "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING, "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED, "terminated": InstanceState.TERMINATED,
}  # fmt: skip
_QUOTA = ("InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
          "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
          "SpotMaxPriceTooLow", "RequestLimitExceeded")  # fmt: skip


def _state(node: Node) -> InstanceState:
    """libcloud's NodeState of NODE as an InstanceState (EC2's name where libcloud has none)."""
    from libcloud.compute.types import NodeState

    mapped = {
        NodeState.PENDING: InstanceState.PENDING, NodeState.STARTING: InstanceState.PENDING,
        NodeState.RUNNING: InstanceState.RUNNING, NodeState.REBOOTING: InstanceState.RUNNING,
        NodeState.STOPPING: InstanceState.STOPPING, NodeState.STOPPED: InstanceState.STOPPED,
        NodeState.TERMINATED: InstanceState.TERMINATED,
    }.get(node.state)  # fmt: skip
    return mapped or _EC2_STATES.get(str(node.extra.get("status")), InstanceState.UNKNOWN)


def _options(config: ProviderConfig) -> dict[str, Any]:
    return {**ec2_setup.DEFAULTS, **config.options}


class EC2Driver(Driver):
    """Instances created on demand in one EC2 region, reached over SSH."""

    kind = "ec2"
    elastic = True
    job_options = frozenset({"size", "spot", "image", "disk"})

    # -- the kind's rules -------------------------------------------------------------------

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        ec2_setup.validate(where, name, entry)

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        """Only when no size of the table (nor the entry's own, when the table knows it)
        holds the job; an entry size the table does not know is given the benefit of doubt."""
        why = super().never_fits(config, resources)
        if why or any(s.holds(resources) for s in SIZES):
            return why
        if str(config.options.get("size")) not in _BY_NAME:
            return None
        top = max(SIZES, key=lambda s: (s.cpus, s.gpus, s.memory))
        memory = f" --memory {resources.memory}" if resources.memory else ""
        return (f"no instance size of provider {config.name!r} holds --cpus {resources.cpus} "
                f"--gpus {resources.gpus}{memory}; the largest, {top.name}, has {top.cpus} cpus, "
                f"{top.gpus} gpus, {top.memory:.0f}G")  # fmt: skip

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
            hosts.append({
                "instance": rec["id"], "host": rec.get("address") or "-", "state": state,
                "slots": extra.get("slots"), "gpus": extra.get("gpus") or [],
                "memory": extra.get("memory"), "running": rec.get("running", 0),
                "error": extra.get("error"), "size": rec.get("size") or "-",
                "spot": bool(rec.get("spot")), "age": now - launched if launched else None,
            })  # fmt: skip
        return hosts_summary(hosts)

    # -- provisioning ---------------------------------------------------------------------

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home)
        self.entry = _options(config)
        self.pool = SSHDriver(config, home)
        self.tags = {"monkey-home": home.home_id(), "monkey-provider": self.name}
        self._api: EC2NodeDriver | None = None
        self._api_lock = threading.Lock()  # one cloud call at a time on the one connection
        self._track_lock = threading.Lock()
        self._boot_wait = 0.0  # next wait between listings while one boots (0: none boots)
        self._next_refresh = 0.0  # 0: never listed
        self._refresher: threading.Thread | None = None
        self._refresh_error = ""  # the last listing error logged (logged again when it changes)
        # The bucket blobs go through (its client is made on first use); None: over SSH.
        self.storage: Storage | None = storage_for(config, home) if config.options.get("bucket") else None
        if self.storage is not None:  # kept folders go through the bucket, not over SSH
            self.pool.checkpoint_every = math.inf
        self.spot_nodes: dict[str, str] = {}  # spot instance -> its address (watched)
        self._reasons: dict[str, str] = {}  # node id -> EC2's state reason code (ended ones)

    @property
    def max_instances(self) -> int | None:
        return int(self.entry["max_instances"])

    def list_nodes(self) -> list[Instance]:
        """This home's instances of the provider, terminated ones included while EC2 still
        lists them; running ones with an address become the transport's hosts."""
        filters = {f"tag:{k}": v for k, v in self.tags.items()}
        nodes = self._call("cannot list instances", lambda api: api.list_nodes(ex_filters=filters))
        found = [self._reclaimed(self._instance(n)) for n in nodes]
        self._track(found, listed=True)
        return [self._with_reach(i) for i in found]

    def create_node(self, size: str | None = None,
                    options: Mapping[str, Any] | None = None) -> Instance:
        """Launch one instance of SIZE (the job's `size` option first, else the entry's);
        OPTIONS are the job's job.yml options (size, spot, image, disk). NoCapacity at
        ``max_instances`` or when EC2 has none (a quota, no capacity), MonkeyError naming
        the key to fix otherwise; a launch that fails leaves no instance behind."""
        from libcloud.compute.base import NodeImage, NodeSize
        from libcloud.compute.drivers.ec2 import EC2NetworkSubnet

        opts = dict(options or {})
        size = str(opts.get("size") or size or self.entry["size"])
        image = str(opts.get("image") or self.entry["image"])
        spot = bool(opts.get("spot", self.entry["spot"]))
        live = [i for i in self.list_nodes() if i.state != InstanceState.TERMINATED]
        limit = self.max_instances
        if limit is not None and len(live) >= limit:
            raise NoCapacity(f"{self.name}: {len(live)} instance(s) exist, max_instances is "
                             f"{limit}; jobs wait for one to be free (or raise max_instances)")
        launch = uuid.uuid4().hex
        kwargs: dict[str, Any] = {
            "name": f"monkey-{self.name}", "ex_userdata": USER_DATA, "ex_clienttoken": launch,
            "ex_metadata": {**self.tags, "monkey-launch": launch}, "ex_spot": spot,
        }  # fmt: skip
        if self.entry.get("key_name"):
            kwargs["ex_keyname"] = self.entry["key_name"]
        if self.entry.get("subnet"):
            kwargs["ex_subnet"] = EC2NetworkSubnet(self.entry["subnet"], None, None)
            if self.entry.get("security_group"):
                kwargs["ex_security_group_ids"] = [self.entry["security_group"]]
        what = f"cannot create a {'spot ' if spot else ''}{size}"

        def run(api: EC2NodeDriver) -> Node:
            if opts.get("disk") is not None:
                kwargs["ex_blockdevicemappings"] = self._disk(api, image, opts["disk"])
            return api.create_node(size=NodeSize(size, size, None, None, None, None, api),
                                   image=NodeImage(image, image, api), **kwargs)

        try:
            node = self._call(what, run)
        except MonkeyError:
            self._clean_up(launch)
            raise
        created = self._instance(node)
        self._track([created])
        log.info("%s: created %s (%s%s)", self.name, created.id, size, ", spot" if spot else "")
        return created

    def destroy_node(self, instance: str) -> None:
        """Terminate the instance (nothing happens when it is gone already) and forget its
        host key."""
        from libcloud.compute.base import Node

        node_id = self._node_id(instance)

        def run(api: EC2NodeDriver) -> None:
            try:
                api.destroy_node(Node(node_id, None, None, [], [], api))
            except Exception as exc:
                if "InvalidInstanceID.NotFound" not in str(exc):
                    raise

        self._call(f"cannot terminate {node_id}", run)
        self.pool.remove_host(instance)
        self.pool.host_keys.forget(instance)

    def size_for(self, resources: Resources) -> str | None:
        """The entry's size when it holds the job (or the table does not know it and the job
        asks for nothing more than one cpu), else the cheapest size of the table that holds
        it, else the entry's size."""
        default = str(self.entry["size"])
        known = _BY_NAME.get(default)
        if (known and known.holds(resources)) or (known is None and resources == Resources()):
            return default
        return next((s.name for s in SIZES if s.holds(resources)), default)

    def size_slots(self, size: str | None) -> int:
        """vCPUs of SIZE (the entry's by default) when the table knows it, else 1."""
        known = _BY_NAME.get(size or str(self.entry["size"]))
        return known.cpus if known else 1

    def instances(self) -> list[Capacity]:
        """The instances reached (never waits): listing and contacting run in threads."""
        self._refresh_soon()
        return self.pool.reached()

    # -- transport: the SSH provider's, over the running instances ------------------------

    def connect(self, instance: str) -> AgentLink:
        if instance not in self.pool.hosts:  # after a restart: list before giving up
            self.list_nodes()
        if instance not in self.pool.hosts:
            raise MonkeyError(f"{instance} is not a running instance of provider {self.name!r}")
        return self.pool.connect(instance)

    def blobs_dir(self, instance: str) -> str:
        return self.pool.blobs_dir(instance)

    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        return self.pool.run_dir(instance, juid, attempt)

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        return self.pool.checkpoint_dir(instance, juid)

    def persist_dir(self, instance: str, juid: str) -> str:
        return self.pool.persist_dir(instance, juid)

    def job_env(self, env: dict[str, str]) -> dict[str, str]:
        return self.pool.job_env(env)

    def prepare(self, instance: str, blobs: list[str]) -> None:
        """Upload the blobs the bucket lacks (each digest once); without a bucket, send
        those the instance lacks over SSH."""
        if self.storage is None:
            self.pool.prepare(instance, blobs)
        else:
            self.storage.put_blobs(blobs, BlobStore(self.home.blobs))

    def blob_fields(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        """``blob_urls``: a presigned URL and the size of each blob the instance lacks (one
        SSH round trip asks which, until all are known to be there)."""
        if self.storage is None:
            return {}
        missing = self.pool.missing(instance, blobs)
        if not missing:
            return {}
        source = BlobStore(self.home.blobs)
        return {"blob_urls": {d: [self.storage.blob_url(d), source_size(source, d)] for d in missing}}

    def start_fields(self, instance: str, juid: str, attempt: int) -> dict[str, Any]:
        """``results``: the bucket's upload form for the job, the kept folders to restore
        from its newest manifest (see monkey.storage.results); ``watch`` for spot ones."""
        if self.storage is None:
            return {}
        with self.pool.store_lock:
            outputs = self.pool.store.outputs(juid)
        dirs = {"checkpoint": self.checkpoint_dir(instance, juid),
                "persist": self.persist_dir(instance, juid)}  # fmt: skip
        every = float(self.entry.get("checkpoint_every", 60))
        return {**bucket_results.start_fields(self.storage, juid, dirs, outputs, every),
                **self.sync_fields(instance)}  # fmt: skip

    def sync_fields(self, instance: str) -> dict[str, Any]:
        """``watch`` of the instance's metadata (``metadata_url``, ``{address}`` replaced)
        when it is a spot instance."""
        address = self.spot_nodes.get(instance)
        if address is None:
            return {}
        url = str(self.entry["metadata_url"]).replace("{address}", address)
        return {"watch": {"kind": "ec2", "url": url, "every": float(self.entry.get("notice_every", 1.0))}}

    def finish(self, instance: str, juid: str, attempt: int) -> None:
        """Without a bucket, the SSH provider's. With one: the logs over SSH while the
        instance is up, the checkpoint, persisted folders and outputs from the bucket
        (also when the instance is gone)."""
        if self.storage is None:
            self.pool.finish(instance, juid, attempt)
            return
        host = self.pool.hosts.get(instance)
        logs_error = None
        if host is not None and host.up:
            try:
                self.pool._fetch_logs(host, [(juid, attempt)])
            except Exception as exc:  # noqa: BLE001 - the bucket's part comes first
                logs_error = exc
        current = self.pool._is_current(juid, attempt)
        fetched = bucket_results.bring_back(self.storage, self.home, juid, attempt, current)
        if fetched:
            log.info("%s: %s attempt %d: %d bytes of results from the bucket", self.name, juid,
                     attempt, fetched)  # fmt: skip
        if logs_error is not None:
            raise logs_error

    def changes(self) -> list[tuple[Instance, str | None, dict[str, Any] | None]]:
        return self.pool.changes()

    def close(self) -> None:
        self.pool.close()

    # -- helpers --------------------------------------------------------------------------

    def _node_id(self, instance: str) -> str:
        prefix = f"{self.name}/"
        if not instance.startswith(prefix):
            raise MonkeyError(f"{instance!r} is not an instance of provider {self.name!r}")
        return instance[len(prefix):]

    def _instance(self, node: Node) -> Instance:
        """NODE as monkey's Instance: its address is the public or private one (`address:`)."""
        extra = node.extra
        ips = node.public_ips if self.entry["address"] == "public" else node.private_ips
        created = node.created_at.timestamp() if node.created_at else None
        return Instance(
            f"{self.name}/{node.id}", self.name, node.name or node.id, _state(node),
            address=next((ip for ip in ips or [] if ip), None),
            size=extra.get("instance_type"), spot=extra.get("instance_lifecycle") == "spot",
            launched_at=created,
            extra={"kind": self.kind, "node": node.id, "image": extra.get("image_id"),
                   "status": extra.get("status"), "private_ip": (node.private_ips or [None])[0],
                   "public_ip": (node.public_ips or [None])[0]},
        )  # fmt: skip

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
        return replace(inst, extra=extra)

    def _track(self, instances: list[Instance], listed: bool = False) -> None:
        """Make the running instances (with an address) the transport's hosts; the others
        leave it, a terminated one (or, after a full LISTED listing, a vanished one) with
        its pinned host key."""
        sshconf = ssh_config()
        with self._track_lock:
            seen = set()
            for inst in instances:
                seen.add(inst.id)
                if inst.spot and inst.address and inst.state in (InstanceState.PENDING, InstanceState.RUNNING):
                    self.spot_nodes[inst.id] = inst.address
                if inst.state == InstanceState.RUNNING and inst.address:
                    spec = host_spec({"host": inst.address, "name": inst.extra["node"],
                                      "user": self.entry["user"], "key": self.entry.get("key")},
                                     sshconf)  # fmt: skip
                    self.pool.add_host(inst.id, replace(spec, host_key_alias=inst.id), inst)
                elif inst.state != InstanceState.PENDING:
                    self.pool.remove_host(inst.id)
                    if inst.state == InstanceState.TERMINATED:
                        self.pool.host_keys.forget(inst.id)
            booting = any(i.state == InstanceState.PENDING for i in instances)
            if listed:
                for gone in set(self.pool.hosts) - seen:
                    self.pool.remove_host(gone)
                    self.pool.host_keys.forget(gone)
                wait = min(max(self._boot_wait * 2, _REFRESH_BOOTING[0]), _REFRESH_BOOTING[1]) if booting else 0.0
            else:  # a create: look again soon
                wait = _REFRESH_BOOTING[0] if booting else self._boot_wait
            self._boot_wait = wait
            self._next_refresh = time.monotonic() + (wait or _REFRESH_IDLE)

    def _reclaimed(self, inst: Instance) -> Instance:
        """INST with ``extra["preempted"]`` when EC2 ended it as a spot interruption
        (``Server.SpotInstanceTermination``: its state reason, asked once per instance)."""
        if not inst.spot or inst.state not in (InstanceState.TERMINATED, InstanceState.STOPPED,
                                               InstanceState.STOPPING):
            return inst
        node = inst.extra["node"]
        if node not in self._reasons:

            def ask(api: EC2NodeDriver) -> str:
                reply = api.connection.request(api.path, params={"Action": "DescribeInstances",
                                                                 "InstanceId.1": node}).object
                found = [e.text for e in reply.iter() if e.tag.endswith("code") and e.text]
                return next((c for c in found if c.startswith(("Server.", "Client."))), "")

            self._reasons[node] = self._call(f"cannot describe {node}", ask)
        spot = self._reasons[node].startswith(("Server.SpotInstance", "Server.SpotInstanceTermination"))
        return replace(inst, extra={**inst.extra, "reason": self._reasons[node], "preempted": spot})

    def _refresh_soon(self) -> None:
        """List the instances in a thread when due: at first, while one boots, and now and
        then (one may vanish)."""
        if time.monotonic() < self._next_refresh or (self._refresher and self._refresher.is_alive()):
            return
        self._next_refresh = time.monotonic() + _REFRESH_BOOTING[1]  # until the listing says more

        def refresh() -> None:
            try:
                self.list_nodes()
            except MonkeyError as exc:
                if str(exc) != self._refresh_error:  # once per change, not once per retry
                    log.warning("%s", exc)
                self._refresh_error = str(exc)
            else:
                self._refresh_error = ""

        self._refresher = threading.Thread(target=refresh, daemon=True, name=f"ec2-{self.name}")
        self._refresher.start()

    def _disk(self, api: EC2NodeDriver, image: str, disk: int | str) -> list[dict[str, Any]]:
        """The block device mapping giving the image's root volume DISK (GiB, or a size)."""
        gib = disk if isinstance(disk, int) else math.ceil(parse_size(str(disk)) / _GIB)
        [found] = api.list_images(ex_image_ids=[image])
        root = found.extra.get("root_device_name") or "/dev/xvda"
        return [{"DeviceName": root, "Ebs": {"VolumeSize": int(gib), "DeleteOnTermination": True}}]

    def _clean_up(self, launch: str) -> None:
        """Terminate what a failed launch may have started anyway (its launch tag finds it)."""
        try:
            nodes = self._call("", lambda api: api.list_nodes(ex_filters={"tag:monkey-launch": launch}))
            for node in nodes:
                if _state(node) != InstanceState.TERMINATED:
                    self.destroy_node(f"{self.name}/{node.id}")
        except MonkeyError as exc:
            log.error("%s: after a failed launch, could not check for a leaked instance "
                      "(tag monkey-launch=%s): %s", self.name, launch, exc)

    def _call(self, what: str, call: Callable[[EC2NodeDriver], T]) -> T:
        """CALL with the provider's libcloud driver; its errors as one MonkeyError line
        ("NAME: WHAT: CODE: message; the fix"), NoCapacity for quotas and capacity."""
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import InvalidCredsError, LibcloudError
        from libcloud.compute.types import KeyPairDoesNotExistError

        with self._api_lock:
            try:
                if self._api is None:
                    from monkey.drivers.ec2_api import ec2_node_driver

                    self._api = ec2_node_driver(self.entry)
                return call(self._api)
            except MonkeyError:
                raise
            except InvalidCredsError as exc:
                raise MonkeyError(f"{self.name}: {what}: AWS refused the credentials ({_text(exc)}); "
                                  "check `profile`/`credentials` in providers.yml or "
                                  "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from None
            except KeyPairDoesNotExistError as exc:
                said = f"InvalidKeyPair.NotFound: key pair {exc.name} does not exist"
                raise self._cloud_error(what, said) from None
            except (BaseHTTPError, LibcloudError) as exc:
                raise self._cloud_error(what, _text(exc)) from None
            except OSError as exc:  # requests' connection errors are OSErrors too
                where = self.entry.get("endpoint") or f"EC2 in {self.entry['region']}"
                raise MonkeyError(f"{self.name}: {what}: cannot reach {where} ({_cause(exc)}); "
                                  "check the network or `endpoint:`") from None

    def _cloud_error(self, what: str, said: str) -> MonkeyError:
        code = said.split(":", 1)[0].strip()
        again = f"run `monkey provider add aws {self.name}` again to repair it"
        if code.startswith(_QUOTA):
            return NoCapacity(f"{self.name}: {what}: {said}; monkey tries again later (a quota "
                              "can be raised in the AWS console, or choose another size)")
        if code.startswith("InvalidAMIID"):
            fix = f"fix `image:` in providers.yml (an AMI id of {self.entry['region']})"
        elif code.startswith(("InvalidInstanceType", "Unsupported")) or "InstanceType" in said:
            fix = "fix `size:` in providers.yml (or the job's size option), e.g. t3.micro"
        elif code.startswith(("InvalidKeyPair", "InvalidSubnet", "InvalidGroup", "InvalidVpc")):
            fix = again
        else:
            fix = ""
        return MonkeyError(f"{self.name}: {what}: {said}" + (f"; {fix}" if fix else ""))


def _cause(exc: BaseException) -> str:
    """What a connection error comes down to ("Connection refused", "timed out"), not the
    whole chain of wrappers and the request's URL."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if found:
        return found.group(1).strip()
    return "timed out" if "timed out" in text.lower() else _text(exc)


def _text(exc: BaseException) -> str:
    """An exception's message on one line."""
    text = getattr(exc, "message", None) or getattr(exc, "value", None) or str(exc)
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
