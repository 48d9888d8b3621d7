"""`monkey provider add aws NAME`: what an `ec2` provider needs in the cloud, and the rules
of its providers.yml entry.

`setup()` checks the credentials with one API call, then finds or creates, in this order: a
VPC, its subnet, an internet gateway routed from the VPC's main route table, a security
group letting SSH in from one address range only, an imported key pair (its private key is
made here, under MONKEY_HOME/keys, 0600) and the S3 bucket. Everything it creates is tagged
`monkey-home=<home id>` and `Name=monkey-NAME`; a later run finds each resource by the id
recorded in providers.yml, else by those tags. So a second run creates nothing, and a run cut
short is completed by the next one.

`validate()` checks a `type: ec2` entry; this module imports no SDK at the top, so the
one-shot commands that validate providers.yml stay light.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from monkey.drivers.base import unknown_keys
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULTS: dict[str, Any] = {
    "user": "ubuntu",
    "address": "public",
    "spot": False,
    "max_instances": 1,
    "idle_timeout": 600,
    "metadata_url": "http://169.254.169.254",
}
DEFAULT_SUBNET = "10.77.0.0/24"
_TEXT = (
    "region",
    "endpoint",
    "profile",
    "credentials",
    "size",
    "image",
    "user",
    "key",
    "key_name",
    "vpc",
    "subnet",
    "security_group",
    "bucket",
    "metadata_url",
    "shutdown_command",
)
_ORDER = (
    "type",
    "region",
    "endpoint",
    "credentials",
    "profile",
    "size",
    "image",
    "user",
    "key",
    "key_name",
    "vpc",
    "subnet",
    "security_group",
    "address",
    "spot",
    "max_instances",
    "idle_timeout",
    "boot_timeout",
    "bucket",
    "metadata_url",
    "prices",
    "checkpoint_every",
    "notice_every",
    "max_preemptions",
    "fallback",
    "orphan_timeout",
    "shutdown_command",
)
KEYS = frozenset(_ORDER)
REQUIRED = {
    "region": "e.g. us-east-1",
    "size": "an instance type, e.g. t3.micro",
    "image": "an AMI id of the region, e.g. ami-0123456789abcdef0",
}
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_AUTH_CODES = {
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "AuthFailure",
    "ExpiredToken",
    "UnrecognizedClientException",
    "InvalidAccessKeyId",
}
_DENIED_CODES = {"AccessDenied", "UnauthorizedOperation", "AccessDeniedException"}


def _url_problem(url: str, with_path: bool) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return True
    return (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query != ""
        or (not with_path and parts.path not in ("", "/"))
    )


def bucket_problem(bucket: str) -> str | None:
    """Why BUCKET cannot name an S3 bucket, or None."""
    if not _BUCKET.match(bucket) or ".." in bucket or re.fullmatch(r"[\d.]+", bucket):
        return "3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
    return None


def check_entry(
    where: str,
    name: str,
    entry: dict[str, Any],
    keys: Iterable[str],
    required: dict[str, str],
    text: Iterable[str],
) -> Callable[[str], MonkeyError]:
    """Refuse a cloud entry with an unknown key, a missing REQUIRED one or a TEXT key that is
    not text; returns the maker of its one-line errors."""

    def bad(what: str) -> MonkeyError:
        return MonkeyError(f"{where}: provider {name!r}: {what}")

    unknown_keys(where, name, entry, set(keys))
    for key, example in required.items():
        if entry.get(key) is None:
            raise bad(f"needs `{key}:` ({example})")
    for key in text:
        value = entry.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise bad(f"{key} must be text, got {value!r}")
    return bad


def validate(where: str, name: str, entry: dict[str, Any]) -> None:
    """Refuse an `ec2` entry of providers.yml with a one-line MonkeyError naming the key."""

    bad = check_entry(where, name, entry, KEYS, REQUIRED, _TEXT)
    if not _REGION.match(entry["region"]):
        raise bad(f"region {entry['region']!r} is not a region name; e.g. region: us-east-1")
    for key, with_path in (("endpoint", False), ("metadata_url", True)):
        if entry.get(key) is not None and _url_problem(entry[key], with_path):
            raise bad(f"{key} {entry[key]!r} is not an http(s) URL; e.g. http://127.0.0.1:5000")
    if entry.get("address", "public") not in ("public", "private"):
        raise bad(f"address must be public or private, got {entry['address']!r}")
    if not isinstance(entry.get("spot", False), bool):
        raise bad(f"spot must be true or false, got {entry['spot']!r}")
    check_cloud_keys(entry, bad)
    if entry.get("bucket") is not None and bucket_problem(entry["bucket"]):
        raise bad(
            f"bucket {entry['bucket']!r} is not a bucket name: {bucket_problem(entry['bucket'])}"
        )


def check_cloud_keys(entry: dict[str, Any], bad: Callable[[str], MonkeyError]) -> None:
    """The keys every cloud kind shares: max_instances, timeouts, spot recovery, prices."""
    count = entry.get("max_instances")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise bad(f"max_instances must be a positive integer, got {count!r}")
    for key in ("max_preemptions",):
        value = entry.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise bad(f"{key} must be a whole number, got {value!r}")
    fallback = entry.get("fallback")
    if fallback is not None:
        after = fallback.get("on_demand_after") if isinstance(fallback, dict) else None
        if (
            set(fallback or {}) != {"on_demand_after"}
            or not isinstance(after, int)
            or isinstance(after, bool)
            or after < 0
        ):
            raise bad(f"fallback must be {{on_demand_after: N}} (N preemptions), got {fallback!r}")
    for key in ("idle_timeout", "boot_timeout", "checkpoint_every", "notice_every"):
        value = entry.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise bad(f"{key} must be a positive number of seconds, got {value!r}")
    orphan = entry.get("orphan_timeout")
    if orphan is not None and (
        isinstance(orphan, bool) or not isinstance(orphan, (int, float)) or orphan < 0
    ):
        raise bad(
            f"orphan_timeout must be a number of seconds (0: never), got {orphan!r}; an "
            "instance with no job and no word from its core that long powers itself off"
        )
    prices = entry.get("prices")
    if prices is not None and not (
        isinstance(prices, dict)
        and all(
            isinstance(k, str)
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v >= 0
            for k, v in prices.items()
        )
    ):
        raise bad(
            f"prices must map sizes to $ per hour, e.g. prices: {{t3.micro: 0.0104}}, got {prices!r}"
        )


def entry_from(options: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The ec2 entry OPTIONS (flags; None = not given) ask for, over BASE (the provider's
    entry from an earlier run, ids included) and DEFAULTS."""
    entry: dict[str, Any] = {"type": "ec2", **DEFAULTS, **base}
    entry.update({k: v for k, v in options.items() if v is not None})
    if options.get("credentials"):
        path = os.path.abspath(os.path.expanduser(options["credentials"]))
        if not os.path.isfile(path):
            raise MonkeyError(
                f"--credentials {options['credentials']}: no such file; name an "
                "AWS credentials file (like ~/.aws/credentials)"
            )
        entry["credentials"] = path
    return entry


def default_bucket(home_id: str, name: str) -> str:
    """A bucket name for provider NAME that no other home picks: monkey-<home id>-<name>."""
    return re.sub(r"[^a-z0-9-]+", "-", f"monkey-{home_id}-{name}".lower())[:63].rstrip("-")


def ssh_key(keys: Path, name: str) -> tuple[Path, str]:
    """Provider NAME's private key under KEYS (an ed25519 key made on first use, 0600) and
    the OpenSSH line of its public half."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from monkey.config import write_private

    keys.mkdir(mode=0o700, exist_ok=True)
    path = keys / name
    if path.exists():
        try:
            key: Any = ser.load_ssh_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise MonkeyError(
                f"{path} is not an unencrypted SSH private key ({exc}); move it "
                "aside and run again to make a new one"
            ) from None
        os.chmod(path, 0o600)
    else:
        key = ed25519.Ed25519PrivateKey.generate()
        staged = path.with_name(f"{name}.tmp")
        write_private(
            staged,
            key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()),
        )
        os.replace(staged, path)
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    line = f"{public.decode()} monkey-{name}"
    path.with_name(f"{name}.pub").write_text(line + "\n")
    return path, line


def _loopback(endpoint: str | None) -> bool:
    host = urlsplit(endpoint).hostname if endpoint else None
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cidr(text: str, flag: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise MonkeyError(
            f"{flag} {text!r} is not an address range; e.g. {flag} 203.0.113.7/32"
        ) from None


def _aws_error(doing: str, exc: Exception, fix: str = "") -> MonkeyError:
    """EXC, raised by boto3 while DOING something, as a one-line MonkeyError."""
    from botocore.exceptions import ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return MonkeyError(
            "no AWS credentials found; pass --profile or --credentials FILE, or "
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "error")
        message = (error.get("Message") or "").strip().splitlines()[:1]
        said = f"{code}: {message[0]}" if message else code
        if code in _AUTH_CODES:
            return MonkeyError(
                f"{doing}: AWS refused the credentials ({said}); check --profile, "
                "--credentials or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
            )
        if code in _DENIED_CODES:
            return MonkeyError(
                f"{doing}: not permitted ({said}); give the credentials' IAM "
                "identity EC2 and S3 rights, or pass --profile for another"
            )
        return MonkeyError(f"{doing}: {said}" + (f"; {fix}" if fix else ""))
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return MonkeyError(f"{doing}: {first}; check --endpoint (or the network) and run again")


def _not_found(exc: Exception) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code", "").endswith(
        "NotFound"
    )


class _Setup:
    """One run of `setup()`: the clients, this home's tags, and what the run created."""

    def __init__(
        self, home: Any, name: str, entry: dict[str, Any], say: Callable[[str], None]
    ) -> None:
        from monkey.drivers.ec2_api import boto3_client

        self.name, self.keys = name, home.keys
        self.entry, self.say, self.region = entry, say, entry["region"]
        self.ec2, self.s3 = boto3_client(entry, "ec2"), boto3_client(entry, "s3")
        self.sts = boto3_client(entry, "sts")
        self.home_id = home.home_id()
        self.label = f"monkey-{name}"
        self.tags = [
            {"Key": "monkey-home", "Value": self.home_id},
            {"Key": "Name", "Value": self.label},
        ]
        self.mine = [
            {"Name": "tag:monkey-home", "Values": [self.home_id]},
            {"Name": "tag:Name", "Values": [self.label]},
        ]
        self.created: list[str] = []

    def call(self, doing: str, method: Callable[..., Any], fix: str = "", **kwargs: Any) -> Any:
        """METHOD(**KWARGS), a boto3 call; an AWS error becomes a MonkeyError about DOING."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return method(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise _aws_error(doing, exc, fix) from None

    def spec(self, kind: str) -> list[dict[str, Any]]:
        return [{"ResourceType": kind, "Tags": self.tags}]

    def made(self, what: str) -> None:
        self.created.append(what)
        self.say(f"created {what}")

    def find(
        self,
        kind: str,
        method: str,
        field: str,
        ids: str,
        recorded: str | None,
        filters: list[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """The resource RECORDED names if it still exists, else the one FILTERS find."""
        from botocore.exceptions import BotoCoreError, ClientError

        if recorded:
            try:
                found = getattr(self.ec2, method)(**{ids: [recorded]})[field]
            except (BotoCoreError, ClientError) as exc:
                if not _not_found(exc):
                    raise _aws_error(f"looking up {kind} {recorded}", exc) from None
                found = []
            if found:
                return found[0]
            self.say(f"{kind} {recorded} (recorded in providers.yml) is gone; looking for another")
        found = self.call(f"looking up {kind}s", getattr(self.ec2, method), Filters=filters)[field]
        return found[0] if found else None

    def run(self, subnet_cidr: str, ssh_from: str | None) -> dict[str, Any]:
        entry = self.entry
        account = self.call("checking the AWS credentials", self.sts.get_caller_identity)["Account"]
        self.say(f"AWS account {account}, region {self.region}")
        self.check_offer()
        group = self.find(
            "security group",
            "describe_security_groups",
            "SecurityGroups",
            "GroupIds",
            entry.get("security_group"),
            self.mine,
        )
        source = self.ssh_source(ssh_from, group)
        key_path, public = ssh_key(self.keys, self.name)
        try:
            vpc = self.vpc(subnet_cidr)
            subnet = self.subnet(vpc, subnet_cidr)
            self.gateway(vpc)
            group_id = self.group(vpc, group, source)
            key_name = self.key_pair(public)
            bucket = self.bucket()
        except MonkeyError:
            if self.created:
                self.say(f"created so far, reused by the next run: {', '.join(self.created)}")
            raise
        if not self.created:
            self.say(
                f"reusing VPC {vpc}, subnet {subnet}, security group {group_id}, "
                f"key pair {key_name}, bucket {bucket}"
            )
        done = {
            **entry,
            "key": str(key_path),
            "key_name": key_name,
            "vpc": vpc,
            "subnet": subnet,
            "security_group": group_id,
            "bucket": bucket,
        }
        return {key: done[key] for key in _ORDER if key in done}

    def check_offer(self) -> None:
        """Refuse an image or a size the region does not have, before creating anything."""
        image, size = self.entry["image"], self.entry["size"]
        fix = f"pass --image with an AMI id of {self.region}"
        images = self.call(
            f"looking up image {image}", self.ec2.describe_images, fix, ImageIds=[image]
        )["Images"]
        if not images:
            raise MonkeyError(f"image {image} does not exist in {self.region}; {fix}")
        self.call(
            f"looking up size {size}",
            self.ec2.describe_instance_types,
            "pass --size with an instance type, e.g. t3.micro",
            InstanceTypes=[size],
        )

    def ssh_source(self, given: str | None, group: dict[str, Any] | None) -> str:
        """The address range SSH may come from: --ssh-from, else 127.0.0.1/32 for a loopback
        endpoint, else what the group already allows. Never guessed through an outside service."""
        if given:
            return _cidr(given, "--ssh-from")
        if _loopback(self.entry.get("endpoint")):
            return "127.0.0.1/32"
        allowed = [
            r
            for p in (group or {}).get("IpPermissions", [])
            if p.get("FromPort") == 22
            for r in p.get("IpRanges", []) + p.get("Ipv6Ranges", [])
        ]
        if allowed:
            return allowed[0].get("CidrIp") or allowed[0]["CidrIpv6"]
        raise MonkeyError(
            "--ssh-from CIDR is needed: the addresses SSH to the instances may "
            "come from, e.g. --ssh-from 203.0.113.7/32 (this machine's public "
            "address; monkey asks no outside service for it)"
        )

    def vpc(self, cidr: str) -> str:
        found = self.find(
            "VPC", "describe_vpcs", "Vpcs", "VpcIds", self.entry.get("vpc"), self.mine
        )
        if found:
            return found["VpcId"]
        vpc = self.call(
            "creating the VPC",
            self.ec2.create_vpc,
            "pass another --subnet-cidr",
            CidrBlock=cidr,
            TagSpecifications=self.spec("vpc"),
        )["Vpc"]["VpcId"]
        self.made(f"VPC {vpc} ({cidr})")
        return vpc

    def subnet(self, vpc: str, cidr: str) -> str:
        in_vpc = [{"Name": "vpc-id", "Values": [vpc]}]
        found = self.find(
            "subnet",
            "describe_subnets",
            "Subnets",
            "SubnetIds",
            self.entry.get("subnet"),
            self.mine + in_vpc,
        )
        if found and found["VpcId"] == vpc:
            subnet, public_ips = found["SubnetId"], found.get("MapPublicIpOnLaunch")
        else:
            subnet = self.call(
                "creating the subnet",
                self.ec2.create_subnet,
                "pass another --subnet-cidr",
                VpcId=vpc,
                CidrBlock=cidr,
                TagSpecifications=self.spec("subnet"),
            )["Subnet"]["SubnetId"]
            public_ips = False
            self.made(f"subnet {subnet} ({cidr})")
        if self.entry["address"] == "public" and not public_ips:
            self.call(
                "giving the subnet public addresses",
                self.ec2.modify_subnet_attribute,
                SubnetId=subnet,
                MapPublicIpOnLaunch={"Value": True},
            )
        return subnet

    def gateway(self, vpc: str) -> str:
        """An internet gateway attached to VPC, routed from its main route table."""
        attached = self.call(
            "looking up internet gateways",
            self.ec2.describe_internet_gateways,
            Filters=[{"Name": "attachment.vpc-id", "Values": [vpc]}],
        )
        found = (
            attached["InternetGateways"]
            or self.call(
                "looking up internet gateways",
                self.ec2.describe_internet_gateways,
                Filters=self.mine,
            )["InternetGateways"]
        )  # one left unattached by a run cut short
        if found:
            igw = found[0]["InternetGatewayId"]
        else:
            igw = self.call(
                "creating the internet gateway",
                self.ec2.create_internet_gateway,
                TagSpecifications=self.spec("internet-gateway"),
            )["InternetGateway"]["InternetGatewayId"]
            self.made(f"internet gateway {igw}")
        if not any(
            a.get("VpcId") == vpc for a in (found[0] if found else {}).get("Attachments", [])
        ):
            self.call(
                "attaching the internet gateway",
                self.ec2.attach_internet_gateway,
                InternetGatewayId=igw,
                VpcId=vpc,
            )
        tables = self.call(
            "looking up the VPC's route table",
            self.ec2.describe_route_tables,
            Filters=[
                {"Name": "vpc-id", "Values": [vpc]},
                {"Name": "association.main", "Values": ["true"]},
            ],
        )["RouteTables"]
        if not tables:
            raise MonkeyError(f"VPC {vpc} has no main route table; delete the VPC and run again")
        table = tables[0]["RouteTableId"]
        route = [r for r in tables[0]["Routes"] if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
        if not route or route[0].get("GatewayId") != igw:
            method = "replace_route" if route else "create_route"
            self.call(
                "routing the VPC to its gateway",
                getattr(self.ec2, method),
                RouteTableId=table,
                DestinationCidrBlock="0.0.0.0/0",
                GatewayId=igw,
            )
            self.made(f"route 0.0.0.0/0 -> {igw} in {table}")
        return igw

    def group(self, vpc: str, found: dict[str, Any] | None, source: str) -> str:
        """The security group in VPC, letting in TCP 22 from SOURCE and nothing else."""
        if found is None or found["VpcId"] != vpc:
            found = self.find(
                "security group",
                "describe_security_groups",
                "SecurityGroups",
                "GroupIds",
                None,
                self.mine + [{"Name": "vpc-id", "Values": [vpc]}],
            )
        if found is None:
            group = self.call(
                "creating the security group",
                self.ec2.create_security_group,
                GroupName=self.label,
                VpcId=vpc,
                Description="monkey: SSH in from one address range",
                TagSpecifications=self.spec("security-group"),
            )["GroupId"]
            self.made(f"security group {group}")
            current: list[dict[str, Any]] = []
        else:
            group, current = found["GroupId"], found.get("IpPermissions", [])
        v6 = ipaddress.ip_network(source).version == 6
        ranges = (
            {"Ipv6Ranges": [{"CidrIpv6": source}]} if v6 else {"IpRanges": [{"CidrIp": source}]}
        )
        wanted = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}
        if _rules(current) == _rules([wanted]):
            return group
        if current:
            self.call(
                "replacing the security group's rules",
                self.ec2.revoke_security_group_ingress,
                GroupId=group,
                IpPermissions=current,
            )
        self.call(
            "letting SSH in",
            self.ec2.authorize_security_group_ingress,
            GroupId=group,
            IpPermissions=[wanted],
        )
        self.say(f"security group {group} lets SSH in from {source} only")
        return group

    def key_pair(self, public: str) -> str:
        """The key pair holding PUBLIC, imported under this home's name for the provider."""
        from botocore.exceptions import BotoCoreError, ClientError

        name = self.entry.get("key_name") or f"{self.label}-{self.home_id}"
        try:
            pairs = self.ec2.describe_key_pairs(KeyNames=[name], IncludePublicKey=True)["KeyPairs"]
        except (BotoCoreError, ClientError) as exc:
            if not _not_found(exc):
                raise _aws_error("looking up key pairs", exc) from None
            pairs = []
        if pairs:
            ours = {"Key": "monkey-home", "Value": self.home_id} in pairs[0].get("Tags", [])
            material = pairs[0].get("PublicKey")
            if (material and material.split()[:2] == public.split()[:2]) or (not material and ours):
                return name
            if not ours:
                raise MonkeyError(
                    f"key pair {name} exists in {self.region} with another key and "
                    f"is not this home's; delete it (aws ec2 delete-key-pair "
                    f"--key-name {name}) and run again"
                )
            self.call("replacing the key pair", self.ec2.delete_key_pair, KeyName=name)
            self.say(f"key pair {name} held an older key of this home; replacing it")
        self.call(
            "importing the key pair",
            self.ec2.import_key_pair,
            KeyName=name,
            PublicKeyMaterial=public.encode(),
            TagSpecifications=self.spec("key-pair"),
        )
        self.made(f"key pair {name}")
        return name

    def bucket(self) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket = self.entry.get("bucket") or default_bucket(self.home_id, self.name)
        taken = f"bucket {bucket} belongs to another AWS account; choose another --bucket"
        try:
            self.s3.head_bucket(Bucket=bucket)
            return bucket
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("403", "AccessDenied"):
                raise MonkeyError(
                    f"bucket {bucket} exists and these credentials may not use it; "
                    "choose another --bucket or give them access"
                ) from None
            if code not in ("404", "NoSuchBucket"):
                raise _aws_error(f"looking up bucket {bucket}", exc) from None
        except BotoCoreError as exc:  # no connection, no credentials
            raise _aws_error(f"looking up bucket {bucket}", exc) from None
        where = (
            {}
            if self.region == "us-east-1"
            else {"CreateBucketConfiguration": {"LocationConstraint": self.region}}
        )
        try:
            self.s3.create_bucket(Bucket=bucket, **where)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "BucketAlreadyExists":
                raise MonkeyError(taken) from None
            raise _aws_error(f"creating bucket {bucket}", exc, "choose another --bucket") from None
        self.made(f"bucket {bucket}")
        self.call(
            "tagging the bucket",
            self.s3.put_bucket_tagging,
            Bucket=bucket,
            Tagging={"TagSet": self.tags},
        )
        return bucket


def _rules(permissions: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """Ingress PERMISSIONS as (protocol, from, to, source) tuples, to compare them."""
    found = set()
    for p in permissions:
        sources = [r["CidrIp"] for r in p.get("IpRanges", [])]
        sources += [r["CidrIpv6"] for r in p.get("Ipv6Ranges", [])]
        sources += [g.get("GroupId") for g in p.get("UserIdGroupPairs", [])]
        sources += [x.get("PrefixListId") for x in p.get("PrefixListIds", [])]
        found |= {(p.get("IpProtocol"), p.get("FromPort"), p.get("ToPort"), s) for s in sources}
    return found


def setup(
    home: Any,
    name: str,
    entry: dict[str, Any],
    *,
    subnet_cidr: str = DEFAULT_SUBNET,
    ssh_from: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Find or create what provider NAME's ENTRY (its ids from an earlier run included)
    needs in the cloud, saying each step; return ENTRY with every id recorded. A failure is a
    MonkeyError after saying what this run created (tagged, so the next run reuses it)."""
    from monkey.drivers.ec2_api import ec2_regions

    if entry["region"] not in ec2_regions():
        raise MonkeyError(
            f"region {entry['region']!r} is not an EC2 region; e.g. --region us-east-1"
        )
    cidr = _cidr(subnet_cidr, "--subnet-cidr")
    if (
        not 16 <= ipaddress.ip_network(cidr).prefixlen <= 28
        or ipaddress.ip_network(cidr).version != 4
    ):
        raise MonkeyError(
            f"--subnet-cidr {subnet_cidr}: EC2 takes an IPv4 range from /16 to /28, "
            "e.g. 10.77.0.0/24"
        )
    return _Setup(home, name, entry, say).run(cidr, ssh_from)
