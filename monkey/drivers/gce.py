"""The `gce` provider: instances monkey creates in Google Compute Engine (libcloud's
GCENodeDriver), reached over SSH like the hosts of an `ssh` provider once they run.

Instances carry the labels ``monkey-home=<home id>`` and ``monkey-provider=<name>`` (libcloud
cannot filter a listing by label, so the listing is filtered here), the provider's network
tag (its firewall rule lets SSH in), the startup script making sure python3 exists in their
``startup-script`` metadata and the provider key's public half in ``ssh-keys``. They are
created in the first of the entry's ``zones`` that has capacity; ``preemptible: true`` (or
the job's ``preemptible`` option) asks for preemptible ones. A GCE instance that is stopped
(a preemption stops it) is listed STOPPED and destroyed by the core.

An orphaned instance (no job, no word from its core for ``orphan_timeout``) powers itself
off: GCE has no "delete on guest shutdown" for standard VMs (``instanceTerminationAction``
only applies to Spot VMs and run durations, and libcloud's driver cannot set it), so it is
stopped — it bills no vCPU or memory any more, only its disk — and the core deletes it
when it comes back.

Everything else — tracking, transport, blobs through the bucket (GCS, signed URLs) — is
:class:`~monkey.drivers.cloud.CloudDriver`'s, as for EC2.

`setup()` (`monkey provider add gcp NAME`) checks the service account, project and zone
with one API call, refuses a machine type or image the zone lacks, then finds or creates,
in this order: the network, a firewall rule letting SSH in from one address range only to
instances with the provider's network tag, an SSH key (made under MONKEY_HOME/keys, 0600; instances get its public half in their
`ssh-keys` metadata) and the GCS bucket. Each is found by its name first, so a second run
creates nothing and a run cut short is completed by the next one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from monkey.drivers import gce_setup
from monkey.drivers.base import NoCapacity
from monkey.drivers.cloud import GIB, USER_DATA, CloudDriver, Size, cause, one_line
from monkey.drivers.ec2_setup import _cidr, _loopback, default_bucket, ssh_key
from monkey.models import Instance, InstanceState, MonkeyError, parse_size

if TYPE_CHECKING:
    from libcloud.compute.base import Node
    from libcloud.compute.drivers.gce import GCENodeDriver

    from monkey.config import Home, ProviderConfig
    from monkey.storage.gcs import GCSStorage

T = TypeVar("T")

# The vCPUs GCE bills a shared-core machine type for (it shows 2 to the guest).
_SHARED_CORE = {"e2-micro": 0.25, "e2-small": 0.5, "e2-medium": 1.0}

# Common machine types, cheapest first: `size_for` takes the first that holds a job.
SIZES = [
    Size(*s)
    for s in (
        ("e2-micro", 2, 1),
        ("e2-small", 2, 2),
        ("e2-medium", 2, 4),
        ("n1-standard-1", 1, 3.75),
        ("e2-standard-2", 2, 8),
        ("n2-standard-2", 2, 8),
        ("e2-highmem-2", 2, 16),
        ("e2-standard-4", 4, 16),
        ("n2-standard-4", 4, 16),
        ("e2-standard-8", 8, 32),
        ("g2-standard-4", 4, 16, 1),
        ("g2-standard-8", 8, 32, 1),
        ("n2-standard-16", 16, 64),
        ("a2-highgpu-1g", 12, 85, 1),
        ("g2-standard-48", 48, 192, 4),
        ("a2-highgpu-8g", 96, 680, 8),
    )
]

_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.STOPPED,  # GCE's "stopped"
}
_QUOTA = (
    "QUOTA_EXCEEDED",
    "quotaExceeded",
    "rateLimitExceeded",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
)


def _options(config: ProviderConfig) -> dict[str, Any]:
    entry = {**gce_setup.DEFAULTS, **config.options}
    entry.setdefault("zone", (entry.get("zones") or [None])[0])
    return entry


class GCEDriver(CloudDriver):
    """Instances created on demand in GCE zones, reached over SSH."""

    kind = "gce"
    notice = "gce"
    job_options = frozenset({"size", "preemptible", "image", "disk"})
    SIZES = SIZES

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        gce_setup.validate(where, name, entry)

    @classmethod
    def for_setup(cls, name: str, entry: dict[str, Any], home: Home) -> GCEDriver:
        """A driver over ENTRY before it is saved (``provider add gcp``)."""
        from monkey.config import ProviderConfig

        return cls(
            ProviderConfig(name, "gce", {k: v for k, v in entry.items() if k != "bucket"}), home
        )

    @classmethod
    def bucket_storage(cls, config: ProviderConfig) -> GCSStorage:
        from monkey.storage.gcs import GCSStorage

        return GCSStorage.from_config(config)

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home, _options(config))
        self.labels = {"monkey-home": home.home_id(), "monkey-provider": gce_setup.label(self.name)}
        self.zones = list(self.entry.get("zones") or [self.entry["zone"]])
        self._api: GCENodeDriver | None = None
        self._api_lock = threading.Lock()  # one cloud call at a time on the one connection

    # -- the cloud's calls ------------------------------------------------------------------

    def _list(self) -> list[Instance]:
        nodes = self._call("cannot list instances", lambda api: api.list_nodes(ex_zone="all"))
        return [self._instance(n) for n in nodes if self._mine(n)]

    def _launched(self, launch: str) -> list[Instance]:
        nodes = self._call("", lambda api: api.list_nodes(ex_zone="all"))
        return [
            self._instance(n)
            for n in nodes
            if (n.extra.get("labels") or {}).get("monkey-launch") == launch
        ]

    def _launch(self, size: str, launch: str, opts: dict[str, Any]) -> Instance:
        """In the first zone with capacity; OPTS: size, preemptible, image, disk."""
        image = str(opts.get("image") or self.entry["image"])
        preemptible = bool(opts.get("preemptible", self.entry["preemptible"]))
        metadata = {"startup-script": USER_DATA}
        key = self.entry.get("key")
        if key and os.path.isfile(f"{key}.pub"):
            with open(f"{key}.pub") as fh:
                metadata["ssh-keys"] = f"{self.entry['user']}:{fh.read().strip()}"
        disk = opts.get("disk")
        gib = (
            None
            if disk is None
            else (disk if isinstance(disk, int) else -(-parse_size(str(disk)) // GIB))
        )
        what = f"cannot create a {'preemptible ' if preemptible else ''}{size}"
        name = f"monkey-{gce_setup.label(self.name)}"[:40].rstrip("-") + f"-{launch[:12]}"
        zones = self.zones_to_try()  # without those that preempted a machine lately
        for number, zone in enumerate(zones):

            def run(api: GCENodeDriver, zone: str = zone) -> Node:
                try:
                    found_size = api.ex_get_size(size, zone)
                except Exception as exc:
                    if _code(exc) is None or "not found" in str(exc).lower() or "404" in str(exc):
                        raise MonkeyError(
                            f"{self.name}: {what}: machine type {size} does not "
                            f"exist in {zone}; fix `size:` in providers.yml (or "
                            "the job's size option), e.g. e2-small"
                        ) from None
                    raise
                try:
                    found_image = api.ex_get_image(image)
                except Exception as exc:
                    if "could not find" in str(exc).lower() or "not found" in str(exc).lower():
                        raise MonkeyError(
                            f"{self.name}: {what}: image {image} not found; fix "
                            "`image:` in providers.yml (an image or family, e.g. "
                            "debian-12)"
                        ) from None
                    raise
                return api.create_node(
                    name,
                    found_size,
                    found_image,
                    location=zone,
                    ex_network=self.entry.get("network") or "default",
                    ex_tags=[gce_setup.network_tag(self.name)],
                    ex_metadata=metadata,
                    ex_labels={**self.labels, "monkey-launch": launch},
                    ex_preemptible=preemptible or None,
                    ex_disk_size=gib,
                )

            try:
                return self._instance(self._call(what, run))
            except NoCapacity:
                if number == len(zones) - 1:
                    raise
                self._clean_up(launch)
        raise AssertionError("unreachable: there is always a zone")

    def _destroy(self, node: str) -> None:
        from libcloud.common.google import ResourceNotFoundError

        def run(api: GCENodeDriver) -> None:
            for zone in self.zones:
                try:
                    api.connection.async_request(f"/zones/{zone}/instances/{node}", method="DELETE")
                    return
                except ResourceNotFoundError:
                    continue

        self._call(f"cannot delete {node}", run)

    # -- provider add gcp ---------------------------------------------------------------------

    def check_offer(self) -> None:
        """Reach GCE (credentials, project, zone) and refuse a machine type or image it lacks,
        before anything is created."""
        size, image, zone = self.entry["size"], self.entry["image"], self.zones[0]

        def run(api: GCENodeDriver) -> None:
            for other in self.zones:
                api.ex_get_zone(other) or _raise(f"zone {other} does not exist; fix --zone")
            try:
                api.ex_get_size(size, zone)
            except Exception:
                raise MonkeyError(
                    f"machine type {size} does not exist in {zone}; pass --size "
                    "with a machine type, e.g. e2-small"
                ) from None
            try:
                api.ex_get_image(image)
            except Exception:
                raise MonkeyError(
                    f"image {image} not found; pass --image with an image or "
                    "image family, e.g. debian-12"
                ) from None

        self._call("checking the project", run)

    def ensure_network(self, network: str) -> bool:
        """Create NETWORK (auto subnets) unless it exists; whether it was created."""
        from libcloud.common.google import ResourceNotFoundError

        def run(api: GCENodeDriver) -> bool:
            try:
                api.ex_get_network(network)
                return False
            except ResourceNotFoundError:
                api.ex_create_network(network, None, mode="auto")
                return True

        return self._call(f"creating network {network}", run)

    def ensure_firewall(self, name: str, network: str, tag: str, source: str) -> bool:
        """Create the rule NAME letting TCP 22 in from SOURCE to instances tagged TAG unless
        it exists; whether it was created."""
        from libcloud.common.google import ResourceNotFoundError

        def run(api: GCENodeDriver) -> bool:
            try:
                api.ex_get_firewall(name)
                return False
            except ResourceNotFoundError:
                api.ex_create_firewall(
                    name,
                    [{"IPProtocol": "tcp", "ports": ["22"]}],
                    network=network,
                    source_ranges=[source],
                    target_tags=[tag],
                )
                return True

        return self._call(f"creating firewall rule {name}", run)

    def price(self, size: str | None, spot: bool = False, zone: str | None = None) -> float | None:
        """The entry's ``prices:`` for SIZE, else GCE's list price of its vCPUs and memory
        in ZONE's region (the entry's first zone by default; libcloud's price list, which
        has the general-purpose families' on-demand and preemptible rates, not GPUs')."""
        if not size:
            return None
        price = (self.entry.get("prices") or {}).get(size)
        if price is not None:
            return float(price)
        return list_price(size, (zone or self.zones[0]).rsplit("-", 1)[0], spot)

    # -- helpers --------------------------------------------------------------------------

    def _mine(self, node: Node) -> bool:
        labels = node.extra.get("labels") or {}
        return all(labels.get(k) == v for k, v in self.labels.items())

    def _instance(self, node: Node) -> Instance:
        """NODE as monkey's Instance: its address is the public or private one (`address:`)."""
        extra = node.extra
        ips = node.public_ips if self.entry["address"] == "public" else node.private_ips
        stamp = extra.get("creationTimestamp")
        try:
            launched = datetime.fromisoformat(stamp).timestamp() if stamp else None
        except ValueError:
            launched = None
        scheduling = extra.get("scheduling") or {}
        zone = extra.get("zone")
        state = _STATES.get(str(extra.get("status")), InstanceState.UNKNOWN)
        spot = bool(scheduling.get("preemptible")) or scheduling.get("provisioningModel") == "SPOT"
        return Instance(
            f"{self.name}/{node.name}",
            self.name,
            node.name,
            state,
            # libcloud annotates Node.size as a NodeSize; GCE's nodes hold the type's name
            address=next((ip for ip in ips or [] if ip), None),
            size=node.size,  # type: ignore[arg-type]
            spot=spot,
            launched_at=launched,
            price=self.price(node.size, spot, getattr(zone, "name", zone)),  # type: ignore[arg-type]
            # GCE stops a preemptible instance it reclaims: its jobs were preempted.
            extra={
                "kind": self.kind,
                "node": node.name,
                "zone": getattr(zone, "name", zone),
                "preempted": spot
                and state
                in (InstanceState.STOPPED, InstanceState.STOPPING, InstanceState.TERMINATED),
                "status": extra.get("status"),
                "private_ip": next(iter(node.private_ips or []), None),
                "public_ip": next(iter(node.public_ips or []), None),
            },
        )

    def _call(self, what: str, call: Callable[[GCENodeDriver], T]) -> T:
        """CALL with the provider's libcloud driver; its errors as one MonkeyError line
        ("NAME: WHAT: CODE: message; the fix"), NoCapacity for quotas and capacity."""
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.google import GoogleAuthError
        from libcloud.common.types import InvalidCredsError, LibcloudError

        with self._api_lock:
            try:
                if self._api is None:
                    from monkey.drivers.gce_api import gce_node_driver

                    self._api = gce_node_driver(self.entry, self.home)
                return call(self._api)
            except MonkeyError:
                raise
            except (GoogleAuthError, InvalidCredsError) as exc:
                raise MonkeyError(
                    f"{self.name}: {what}: Google refused the credentials "
                    f"({one_line(exc)}); check `credentials:` (a service-account "
                    "JSON key with Compute Admin rights)"
                ) from None
            except (BaseHTTPError, LibcloudError) as exc:
                raise self._cloud_error(what, exc) from None
            except OSError as exc:  # requests' connection errors are OSErrors too
                where = self.entry.get("endpoint") or "the GCE API"
                raise MonkeyError(
                    f"{self.name}: {what}: cannot reach {where} ({cause(exc)}); "
                    "check the network or `endpoint:`"
                ) from None

    def _cloud_error(self, what: str, exc: Exception) -> MonkeyError:
        code = _code(exc)
        said = f"{code}: {one_line(exc)}" if code else one_line(exc)
        if code in _QUOTA:
            return NoCapacity(
                f"{self.name}: {what}: {said}; monkey tries again later (a quota "
                "can be raised in the Cloud console, or add `zones:`)"
            )
        if getattr(exc, "http_code", None) in (401, 403):
            return MonkeyError(
                f"{self.name}: {what}: {said}; give the service account Compute "
                "Admin rights on the project, or fix `project:`"
            )
        return MonkeyError(f"{self.name}: {what}: {said}")


def _code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)
    return str(code) if code else None


def _raise(message: str) -> NoReturn:
    raise MonkeyError(message)


def setup(
    home: Any,
    name: str,
    entry: dict[str, Any],
    *,
    ssh_from: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Find or create what provider NAME's ENTRY needs in the cloud, saying each step; return
    ENTRY with the project, firewall, key and bucket recorded. A failure is a MonkeyError
    after saying what this run created (found by name by the next run)."""
    from monkey.drivers.gce_api import project_of
    from monkey.storage.gcs import GCSStorage

    entry = {**entry, "project": project_of(entry)}
    created: list[str] = []
    driver = GCEDriver.for_setup(name, entry, home)
    try:
        driver.check_offer()
        say(f"GCE project {entry['project']}, zone {entry['zone']}")
        source = _ssh_source(ssh_from, entry)
        network = entry.get("network") or "default"
        firewall = entry.get("firewall") or f"{gce_setup.network_tag(name)}-ssh"
        key_path, _public = ssh_key(home.keys, name)
        bucket = entry.get("bucket") or default_bucket(home.home_id(), name)
        try:
            if driver.ensure_network(network):
                created.append(f"network {network}")
                say(f"created network {network}")
            if driver.ensure_firewall(firewall, network, gce_setup.network_tag(name), source):
                created.append(f"firewall rule {firewall}")
                say(f"created firewall rule {firewall} (SSH from {source} only)")
            if GCSStorage.from_entry({**entry, "bucket": bucket}).ensure_bucket():
                created.append(f"bucket {bucket}")
                say(f"created bucket {bucket}")
        except MonkeyError:
            if created:
                say(f"created so far, reused by the next run: {', '.join(created)}")
            raise
    finally:
        driver.close()
    if not created:
        say(f"reusing network {network}, firewall rule {firewall}, bucket {bucket}")
    done = {
        **entry,
        "key": str(key_path),
        "network": network,
        "firewall": firewall,
        "bucket": bucket,
    }
    return {key: done[key] for key in gce_setup._ORDER if key in done}


def _ssh_source(given: str | None, entry: dict[str, Any]) -> str:
    if given:
        return _cidr(given, "--ssh-from")
    if _loopback(entry.get("endpoint")):
        return "127.0.0.1/32"
    raise MonkeyError(
        "--ssh-from CIDR is needed: the addresses SSH to the instances may come "
        "from, e.g. --ssh-from 203.0.113.7/32 (this machine's public address; "
        "monkey asks no outside service for it)"
    )


def list_price(size: str, region: str, preemptible: bool = False) -> float | None:
    """$/hour of machine type SIZE in REGION from libcloud's GCE price list: its family's
    rate per vCPU and per GiB of memory (vCPUs and memory from ``SIZES``; a shared-core
    type is billed its fraction of a vCPU, ``_SHARED_CORE``); None for a type
    the table or the list does not know (GPU families, shared-core micro types...)."""
    from libcloud.pricing import get_pricing

    known = {s.name: s for s in SIZES}.get(size)
    rates = (get_pricing("compute", "gce_instances") or {}).get(size.split("-", 1)[0])
    if known is None or not rates or "cpu" not in rates or "ram" not in rates:
        return None
    cpus = _SHARED_CORE.get(size, known.cpus)
    kind = "preemptible" if preemptible else "on_demand"
    try:
        cpu = rates["cpu"][kind][region]["price"]
        ram = rates["ram"][kind][region]["price"]
    except KeyError:
        return None
    return round(cpus * float(cpu) + known.memory * float(ram), 6)
