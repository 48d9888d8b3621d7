"""The rules of a `gce` provider's providers.yml entry and what `monkey provider add gcp
NAME` records; `setup()`, which makes what the entry needs in the cloud, is in
monkey.drivers.gce (it works through the driver).

`validate()` checks a `type: gce` entry; this module imports no SDK at the top.
"""

from __future__ import annotations

import re

from monkey.drivers.ec2_setup import (
    _url_problem,
    check_cloud_keys,
    check_entry,
)
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULTS: dict[str, Any] = {
    "user": "monkey",
    "address": "public",
    "preemptible": False,
    "max_instances": 1,
    "idle_timeout": 600,
    "network": "default",
    "metadata_url": "http://metadata.google.internal",
}
_TEXT = (
    "project",
    "zone",
    "endpoint",
    "storage_endpoint",
    "credentials",
    "size",
    "image",
    "user",
    "key",
    "network",
    "firewall",
    "bucket",
    "metadata_url",
    "shutdown_command",
)
_ORDER = (
    "type",
    "project",
    "zone",
    "zones",
    "endpoint",
    "storage_endpoint",
    "credentials",
    "size",
    "image",
    "user",
    "key",
    "network",
    "firewall",
    "address",
    "preemptible",
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
    "zone_cooldown",
    "orphan_timeout",
    "shutdown_command",
)
KEYS = frozenset(_ORDER)
REQUIRED = {
    "credentials": "a service-account JSON key file",
    "size": "a machine type, e.g. e2-small",
    "image": "an image or image family, e.g. debian-12",
}
_ZONE = re.compile(r"^[a-z]+(-[a-z]+)*\d+-[a-z]$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def label(text: str) -> str:
    """TEXT as a GCE label value or resource name part: lowercase letters, digits and '-'."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63] or "x"


def validate(where: str, name: str, entry: dict[str, Any]) -> None:
    """Refuse a `gce` entry of providers.yml with a one-line MonkeyError naming the key."""

    bad = check_entry(where, name, entry, KEYS, REQUIRED, _TEXT)
    listed = entry.get("zones")
    if listed is not None and (
        not isinstance(listed, list) or not listed or not all(isinstance(z, str) for z in listed)
    ):
        raise bad(f"zones must be a list of zone names, got {listed!r}")
    zones = listed or ([entry["zone"]] if entry.get("zone") else [])
    if not zones:
        raise bad("needs `zone:` (e.g. us-central1-a) or `zones: [..]`")
    for zone in zones:
        if not _ZONE.match(zone):
            raise bad(f"zone {zone!r} is not a zone name; e.g. zone: us-central1-a")
    cooldown = entry.get("zone_cooldown")
    if cooldown is not None and (
        isinstance(cooldown, bool) or not isinstance(cooldown, (int, float)) or cooldown < 0
    ):
        raise bad(f"zone_cooldown must be a number of minutes, got {cooldown!r}")
    for key in ("network", "firewall"):
        if entry.get(key) is not None and not _NAME.match(entry[key]):
            raise bad(f"{key} {entry[key]!r} is not a GCE name (lowercase letters, digits, '-')")
    for key, with_path in (
        ("endpoint", False),
        ("storage_endpoint", False),
        ("metadata_url", True),
    ):
        if entry.get(key) is not None and _url_problem(entry[key], with_path):
            raise bad(f"{key} {entry[key]!r} is not an http(s) URL; e.g. http://127.0.0.1:8080")
    if entry.get("address", "public") not in ("public", "private"):
        raise bad(f"address must be public or private, got {entry['address']!r}")
    if not isinstance(entry.get("preemptible", False), bool):
        raise bad(f"preemptible must be true or false, got {entry['preemptible']!r}")
    check_cloud_keys(entry, bad)
    bucket = entry.get("bucket")
    if bucket is not None and (not _BUCKET.match(bucket) or ".." in bucket):
        raise bad(
            f"bucket {bucket!r} is not a bucket name: 3-63 lowercase letters, digits, "
            "'.', '_' and '-', starting and ending with a letter or digit"
        )


def entry_from(options: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The gce entry OPTIONS (flags; None = not given) ask for, over BASE (the provider's
    entry from an earlier run) and DEFAULTS; the credentials file is recorded by path."""
    import os

    entry: dict[str, Any] = {"type": "gce", **DEFAULTS, **base}
    entry.update({k: v for k, v in options.items() if v is not None})
    zones = entry.get("zones")
    if isinstance(zones, str):
        entry["zones"] = [z.strip() for z in zones.split(",") if z.strip()]
    if entry.get("zones"):
        entry["zone"] = entry["zones"][0]
        if len(entry["zones"]) == 1:
            del entry["zones"]
    if options.get("credentials"):
        path = os.path.abspath(os.path.expanduser(options["credentials"]))
        if not os.path.isfile(path):
            raise MonkeyError(
                f"--credentials {options['credentials']}: no such file; name a "
                "service-account JSON key file"
            )
        entry["credentials"] = path
    return entry


def network_tag(name: str) -> str:
    """The network tag of provider NAME's instances, which its firewall rule targets."""
    return f"monkey-{label(name)}"[:63].rstrip("-")
