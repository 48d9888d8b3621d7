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
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from monkey.drivers import ec2_setup
from monkey.drivers.base import NoCapacity
from monkey.drivers.cloud import GIB, USER_DATA, CloudDriver, Size, cause, one_line
from monkey.models import Instance, InstanceState, MonkeyError, parse_size

if TYPE_CHECKING:
    from libcloud.compute.base import Node
    from libcloud.compute.drivers.ec2 import EC2NodeDriver

    from monkey.config import Home, ProviderConfig
    from monkey.storage.s3 import S3Storage

log = logging.getLogger("monkey.ec2")
T = TypeVar("T")
_SPOT_PRICE_TTL = 3600.0  # seconds a spot price EC2 reported is used before asking again

# Common instance types, cheapest first (us-east-1 on-demand prices): `size_for` takes the
# first that holds a job.
SIZES = [
    Size(*s)
    for s in (
        ("t3.nano", 2, 0.5),
        ("t3.micro", 2, 1),
        ("t3.small", 2, 2),
        ("t3.medium", 2, 4),
        ("t3.large", 2, 8),
        ("c5.large", 2, 4),
        ("m5.large", 2, 8),
        ("t3.xlarge", 4, 16),
        ("c5.xlarge", 4, 8),
        ("m5.xlarge", 4, 16),
        ("r5.large", 2, 16),
        ("t3.2xlarge", 8, 32),
        ("c5.2xlarge", 8, 16),
        ("m5.2xlarge", 8, 32),
        ("r5.xlarge", 4, 32),
        ("g4dn.xlarge", 4, 16, 1),
        ("c5.4xlarge", 16, 32),
        ("g4dn.2xlarge", 8, 32, 1),
        ("m5.4xlarge", 16, 64),
        ("g5.xlarge", 4, 16, 1),
        ("g5.2xlarge", 8, 32, 1),
        ("c5.9xlarge", 36, 72),
        ("g4dn.12xlarge", 48, 192, 4),
        ("g5.12xlarge", 48, 192, 4),
        ("g5.48xlarge", 192, 768, 8),
    )
]
# EC2's own state names, where libcloud's map says only "unknown".
_EC2_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    "terminated": InstanceState.TERMINATED,
}
_QUOTA = (
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "SpotMaxPriceTooLow",
    "RequestLimitExceeded",
)


def _state(node: Node) -> InstanceState:
    """libcloud's NodeState of NODE as an InstanceState (EC2's name where libcloud has none)."""
    from libcloud.compute.types import NodeState

    mapped = {
        NodeState.PENDING: InstanceState.PENDING,
        NodeState.STARTING: InstanceState.PENDING,
        NodeState.RUNNING: InstanceState.RUNNING,
        NodeState.REBOOTING: InstanceState.RUNNING,
        NodeState.STOPPING: InstanceState.STOPPING,
        NodeState.STOPPED: InstanceState.STOPPED,
        NodeState.TERMINATED: InstanceState.TERMINATED,
    }.get(node.state)
    return mapped or _EC2_STATES.get(str(node.extra.get("status")), InstanceState.UNKNOWN)


def _options(config: ProviderConfig) -> dict[str, Any]:
    return {**ec2_setup.DEFAULTS, **config.options}


class EC2Driver(CloudDriver):
    """Instances created on demand in one EC2 region, reached over SSH."""

    kind = "ec2"
    notice = "ec2"
    job_options = frozenset({"size", "spot", "image", "disk"})
    SIZES = SIZES

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        ec2_setup.validate(where, name, entry)

    @classmethod
    def bucket_storage(cls, config: ProviderConfig) -> S3Storage:
        from monkey.storage.s3 import S3Storage

        return S3Storage.from_config(config)

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home, _options(config))
        self.tags = {"monkey-home": home.home_id(), "monkey-provider": self.name}
        self._api: EC2NodeDriver | None = None
        self._api_lock = threading.Lock()  # one cloud call at a time on the one connection
        self._spot_prices: dict[tuple[str, str | None], tuple[float, float | None]] = {}
        self._reasons: dict[str, str] = {}  # node id -> EC2's state reason code (ended ones)

    # -- the cloud's calls ------------------------------------------------------------------

    def _list(self) -> list[Instance]:
        filters = {f"tag:{k}": v for k, v in self.tags.items()}
        # libcloud annotates ex_filters as str; it takes (and documents) a dict of filters
        nodes = self._call("cannot list instances", lambda api: api.list_nodes(ex_filters=filters))  # type: ignore[arg-type]
        return [self._reclaimed(self._instance(n)) for n in nodes]

    def _launched(self, launch: str) -> list[Instance]:
        nodes = self._call("", lambda api: api.list_nodes(ex_filters={"tag:monkey-launch": launch}))  # type: ignore[arg-type]  # as in _list
        return [self._instance(n) for n in nodes]

    def _launch(self, size: str, launch: str, opts: dict[str, Any]) -> Instance:
        """In the provider's subnet and security group with its key pair; OPTS: size, spot,
        image, disk."""
        from libcloud.compute.base import NodeImage, NodeSize
        from libcloud.compute.drivers.ec2 import EC2NetworkSubnet

        image = str(opts.get("image") or self.entry["image"])
        spot = bool(opts.get("spot", self.entry["spot"]))
        kwargs: dict[str, Any] = {
            "name": f"monkey-{self.name}",
            "ex_userdata": USER_DATA,
            "ex_clienttoken": launch,
            "ex_metadata": {**self.tags, "monkey-launch": launch},
            "ex_spot": spot,
            # its agent powers it off when orphaned (orphan_timeout): that terminates it
            "ex_terminate_on_shutdown": True,
        }
        if self.entry.get("key_name"):
            kwargs["ex_keyname"] = self.entry["key_name"]
        if self.entry.get("subnet"):
            kwargs["ex_subnet"] = EC2NetworkSubnet(self.entry["subnet"], None, None)
            if self.entry.get("security_group"):
                kwargs["ex_security_group_ids"] = [self.entry["security_group"]]

        def run(api: EC2NodeDriver) -> Node:
            if opts.get("disk") is not None:
                kwargs["ex_blockdevicemappings"] = self._disk(api, image, opts["disk"])
            # libcloud's annotations want every figure; EC2 needs only the id
            return api.create_node(
                size=NodeSize(size, size, None, None, None, None, api),  # type: ignore[arg-type]
                image=NodeImage(image, image, api),
                **kwargs,
            )

        return self._instance(self._call(f"cannot create a {'spot ' if spot else ''}{size}", run))

    def _destroy(self, node_id: str) -> None:
        from libcloud.compute.base import Node

        def run(api: EC2NodeDriver) -> None:
            try:
                # libcloud's annotations want a name and state; destroy reads only the id
                api.destroy_node(Node(node_id, None, None, [], [], api))  # type: ignore[arg-type]
            except Exception as exc:
                if "InvalidInstanceID.NotFound" not in str(exc):
                    raise

        self._call(f"cannot terminate {node_id}", run)

    # -- helpers --------------------------------------------------------------------------

    def _instance(self, node: Node) -> Instance:
        """NODE as monkey's Instance: its address is the public or private one (`address:`)."""
        extra = node.extra
        ips = node.public_ips if self.entry["address"] == "public" else node.private_ips
        created = node.created_at.timestamp() if node.created_at else None
        return Instance(
            f"{self.name}/{node.id}",
            self.name,
            node.name or str(node.id),
            _state(node),
            address=next((ip for ip in ips or [] if ip), None),
            size=extra.get("instance_type"),
            spot=extra.get("instance_lifecycle") == "spot",
            launched_at=created,
            price=self._price(
                extra.get("instance_type"),
                extra.get("instance_lifecycle") == "spot",
                extra.get("availability"),
            ),
            extra={
                "kind": self.kind,
                "node": node.id,
                "image": extra.get("image_id"),
                "status": extra.get("status"),
                "private_ip": next(iter(node.private_ips or []), None),
                "public_ip": next(iter(node.public_ips or []), None),
            },
        )

    def _reclaimed(self, inst: Instance) -> Instance:
        """INST with ``extra["preempted"]`` when EC2 ended it as a spot interruption
        (``Server.SpotInstanceTermination``: its state reason, asked once per instance)."""
        if not inst.spot or inst.state not in (
            InstanceState.TERMINATED,
            InstanceState.STOPPED,
            InstanceState.STOPPING,
        ):
            return inst
        node = inst.extra["node"]
        if node not in self._reasons:

            def ask(api: EC2NodeDriver) -> str:
                reply = api.connection.request(
                    api.path, params={"Action": "DescribeInstances", "InstanceId.1": node}
                ).object
                found = [e.text for e in reply.iter() if e.tag.endswith("code") and e.text]
                return next((c for c in found if c.startswith(("Server.", "Client."))), "")

            self._reasons[node] = self._call(f"cannot describe {node}", ask)
        spot = self._reasons[node].startswith("Server.SpotInstance")
        return inst.replace(extra={**inst.extra, "reason": self._reasons[node], "preempted": spot})

    def _console(self, node: str) -> str | None:
        from libcloud.compute.base import Node

        found = Node(node, None, None, [], [], None)  # type: ignore[arg-type]  # only the id is read
        return self._call(
            f"cannot read the console of {node}", lambda api: api.ex_get_console_output(found)
        )["output"]

    def price(self, size: str | None, spot: bool = False) -> float | None:
        """The entry's ``prices:`` for SIZE, else libcloud's on-demand price in the region
        (a spot machine's too: its going rate needs an API call, see ``_price``)."""
        if not size:
            return None
        price = (self.entry.get("prices") or {}).get(size)
        if price is None:
            from libcloud.pricing import get_size_price

            price = get_size_price("compute", "ec2_linux", size, self.entry["region"])
        return None if price is None else float(price)

    def _price(self, size: str | None, spot: bool, zone: str | None) -> float | None:
        """Estimated $/hour of an instance of SIZE (``price``); a spot one costs the spot
        price EC2 reports for the size (in ZONE) when it reports one. None when nothing knows."""
        price = self.price(size)
        if spot and size:
            price = self._spot_price(size, zone) or price
        return price

    def _spot_price(self, size: str, zone: str | None) -> float | None:
        """The current spot price of SIZE in ZONE (else the lowest of the region), as EC2
        reports it; asked at most once an hour (None: it reports none, or cannot be asked)."""
        asked_at, price = self._spot_prices.get((size, zone), (-_SPOT_PRICE_TTL, None))
        if time.monotonic() - asked_at < _SPOT_PRICE_TTL:
            return price
        from monkey.drivers.ec2_api import boto3_client

        try:
            history = boto3_client(self.entry, "ec2").describe_spot_price_history(
                InstanceTypes=[size], ProductDescriptions=["Linux/UNIX"], StartTime=time.time()
            )["SpotPriceHistory"]
            prices = {h.get("AvailabilityZone"): float(h["SpotPrice"]) for h in history}
            price = prices.get(zone, min(prices.values(), default=None))
        except Exception as exc:  # noqa: BLE001 - botocore's errors: the estimate goes without
            log.warning(
                "%s: no spot price for %s (%s); its on-demand price is shown",
                self.name,
                size,
                one_line(exc),
            )
            price = None
        self._spot_prices[(size, zone)] = (time.monotonic(), price)
        return price

    def _disk(self, api: EC2NodeDriver, image: str, disk: int | str) -> list[dict[str, Any]]:
        """The block device mapping giving the image's root volume DISK (GiB, or a size)."""
        gib = disk if isinstance(disk, int) else math.ceil(parse_size(str(disk)) / GIB)
        [found] = api.list_images(ex_image_ids=[image])
        root = found.extra.get("root_device_name") or "/dev/xvda"
        return [{"DeviceName": root, "Ebs": {"VolumeSize": int(gib), "DeleteOnTermination": True}}]

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
                raise MonkeyError(
                    f"{self.name}: {what}: AWS refused the credentials ({one_line(exc)}); "
                    "check `profile`/`credentials` in providers.yml or "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
                ) from None
            except KeyPairDoesNotExistError as exc:
                said = f"InvalidKeyPair.NotFound: key pair {exc.name} does not exist"
                raise self._cloud_error(what, said) from None
            except (BaseHTTPError, LibcloudError) as exc:
                raise self._cloud_error(what, one_line(exc)) from None
            except OSError as exc:  # requests' connection errors are OSErrors too
                where = self.entry.get("endpoint") or f"EC2 in {self.entry['region']}"
                raise MonkeyError(
                    f"{self.name}: {what}: cannot reach {where} ({cause(exc)}); "
                    "check the network or `endpoint:`"
                ) from None

    def _cloud_error(self, what: str, said: str) -> MonkeyError:
        code = said.split(":", 1)[0].strip()
        again = f"run `monkey provider add aws {self.name}` again to repair it"
        if code.startswith(_QUOTA):
            return NoCapacity(
                f"{self.name}: {what}: {said}; monkey tries again later (a quota "
                "can be raised in the AWS console, or choose another size)"
            )
        if code.startswith("InvalidAMIID"):
            fix = f"fix `image:` in providers.yml (an AMI id of {self.entry['region']})"
        elif code.startswith(("InvalidInstanceType", "Unsupported")) or "InstanceType" in said:
            fix = "fix `size:` in providers.yml (or the job's size option), e.g. t3.micro"
        elif code.startswith(("InvalidKeyPair", "InvalidSubnet", "InvalidGroup", "InvalidVpc")):
            fix = again
        else:
            fix = ""
        return MonkeyError(f"{self.name}: {what}: {said}" + (f"; {fix}" if fix else ""))
