"""Clients for one `type: ec2` provider entry: libcloud's EC2NodeDriver and boto3 clients.

Credentials are resolved by boto3 exactly as the AWS tools resolve them (the entry's
`credentials` file and `profile`, else the environment, ~/.aws, SSO, instance roles); they
are handed to the client objects and never stored. With `endpoint` set, every client talks
to that EC2/S3-compatible endpoint (moto, LocalStack) instead of AWS.

Import this module only where a cloud call is made: it loads boto3 and libcloud.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import ProfileNotFound
from libcloud.compute.drivers.ec2 import EC2Connection, EC2NodeDriver, EC2Response

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Bounded retries and timeouts: a dead endpoint is reported in seconds, not minutes.
_CONFIG = Config(
    connect_timeout=10, read_timeout=60, retries={"mode": "standard", "max_attempts": 3}
)


def session(entry: dict[str, Any]) -> boto3.Session:
    """A boto3 session for the entry's `credentials` file and `profile`.

    With a `credentials` file the profile (default: `default`) is read from that file alone:
    an explicit profile makes boto3 ignore the AWS_* key variables, so the entry means what it
    says whatever the environment holds."""
    core = botocore.session.Session()
    profile = entry.get("profile")
    if entry.get("credentials"):
        core.set_config_variable("credentials_file", os.path.expanduser(entry["credentials"]))
        profile = profile or "default"
    try:
        return boto3.Session(
            botocore_session=core, profile_name=profile, region_name=entry.get("region")
        )
    except ProfileNotFound:
        where = entry.get("credentials") or "~/.aws/config and ~/.aws/credentials"
        raise MonkeyError(
            f"AWS profile {profile!r} is not in {where}; name a profile that is "
            "(--profile, or `profile:` in providers.yml)"
        ) from None


def credentials(entry: dict[str, Any]) -> tuple[str, str, str | None]:
    """(access key, secret key, session token) for the entry, as boto3 resolves them."""
    found = session(entry).get_credentials()
    if found is None:
        raise MonkeyError(
            "no AWS credentials found; pass --profile or --credentials FILE, or "
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    frozen = found.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key, frozen.token


def boto3_client(entry: dict[str, Any], service: str) -> Any:
    """A boto3 client for SERVICE ("ec2", "s3", "sts") in the entry's region, bound to its
    `endpoint` when it has one (S3 then uses path-style addresses, which any host serves)."""
    config = _CONFIG
    if entry.get("endpoint") and service == "s3":
        config = config.merge(Config(s3={"addressing_style": "path"}))
    return session(entry).client(
        service, region_name=entry["region"], endpoint_url=entry.get("endpoint"), config=config
    )


_NAMESPACE = re.compile(r'xmlns="(http://ec2\.amazonaws\.com/doc/[0-9-]+)"')


class _EndpointResponse(EC2Response):
    """EC2-compatible endpoints (moto, LocalStack) write the EC2 XML namespace without its
    trailing slash; libcloud looks names up with it, so every list would come back empty.
    Their error replies carry that namespace too, where AWS's have none: libcloud would
    find no error code in them (an empty message), so it is dropped there."""

    def parse_body(self) -> Any:
        if isinstance(self.body, str):
            self.body = _NAMESPACE.sub(r'xmlns="\1/"', self.body)
        return super().parse_body()

    def parse_error(self) -> Any:
        if isinstance(self.body, str):
            self.body = _NAMESPACE.sub("", self.body)
        return super().parse_error()


class _EndpointConnection(EC2Connection):
    responseCls = _EndpointResponse


class _EndpointEC2NodeDriver(EC2NodeDriver):
    """EC2NodeDriver for an EC2-compatible endpoint.

    Tag with boto3 (or at launch, `ex_metadata`), not `ex_create_tags`: libcloud numbers
    CreateTags parameters from 0, which such endpoints refuse."""

    connectionCls = _EndpointConnection


def ec2_regions() -> list[str]:
    """The regions libcloud's EC2 driver can work in."""
    return list(EC2NodeDriver.list_regions())


def ec2_node_driver(entry: dict[str, Any]) -> EC2NodeDriver:
    """libcloud's EC2 driver for a validated entry: its region and endpoint, SigV4."""
    key, secret, token = credentials(entry)
    region = entry["region"]
    if region not in ec2_regions():
        raise MonkeyError(
            f"region {region!r} is not an EC2 region libcloud knows; fix `region`, e.g. us-east-1"
        )
    kwargs: dict[str, Any] = {"region": region, "token": token, "signature_version": "4"}
    cls = EC2NodeDriver
    if entry.get("endpoint"):
        parts = urlsplit(entry["endpoint"])
        secure = parts.scheme == "https"
        kwargs.update(
            host=parts.hostname, port=parts.port or (443 if secure else 80), secure=secure
        )
        cls = _EndpointEC2NodeDriver
    return cls(key, secret, **kwargs)
