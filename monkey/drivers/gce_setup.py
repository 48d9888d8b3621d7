"""`monkey provider add gcp NAME`: what a `gce` provider needs in the cloud, and the rules
of its providers.yml entry.

`setup()` checks the service account, project and zone with one API call, refuses a machine
type or image the zone lacks, then finds or creates, in this order: the network, a firewall
rule letting SSH in from one address range only to instances with the provider's network
tag, an SSH key (made under MONKEY_HOME/keys, 0600; instances get its public half in their
`ssh-keys` metadata) and the GCS bucket. Each is found by its name first, so a second run
creates nothing and a run cut short is completed by the next one.

`validate()` checks a `type: gce` entry; this module imports no SDK at the top.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from monkey.drivers.ec2_setup import (
    _cidr,
    _loopback,
    _url_problem,
    check_cloud_keys,
    check_entry,
    default_bucket,
    ssh_key,
)
from monkey.models import MonkeyError

DEFAULTS: dict[str, Any] = {
    "user": "monkey", "address": "public", "preemptible": False, "max_instances": 1,
    "idle_timeout": 600, "network": "default", "metadata_url": "http://metadata.google.internal",
}  # fmt: skip
_TEXT = ("project", "zone", "endpoint", "storage_endpoint", "credentials", "size", "image", "user", "key",
         "network", "firewall", "bucket", "metadata_url", "shutdown_command")
_ORDER = ("type", "project", "zone", "zones", "endpoint", "storage_endpoint", "credentials", "size", "image", "user",
          "key", "network", "firewall", "address", "preemptible", "max_instances", "idle_timeout",
          "boot_timeout", "bucket", "metadata_url", "prices", "checkpoint_every", "notice_every",
          "max_preemptions", "fallback", "zone_cooldown", "orphan_timeout", "shutdown_command")
KEYS = frozenset(_ORDER)
REQUIRED = {"credentials": "a service-account JSON key file", "size": "a machine type, e.g. e2-small",
            "image": "an image or image family, e.g. debian-12"}
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
    if listed is not None and (not isinstance(listed, list) or not listed
                               or not all(isinstance(z, str) for z in listed)):  # fmt: skip
        raise bad(f"zones must be a list of zone names, got {listed!r}")
    zones = listed or ([entry["zone"]] if entry.get("zone") else [])
    if not zones:
        raise bad("needs `zone:` (e.g. us-central1-a) or `zones: [..]`")
    for zone in zones:
        if not _ZONE.match(zone):
            raise bad(f"zone {zone!r} is not a zone name; e.g. zone: us-central1-a")
    cooldown = entry.get("zone_cooldown")
    if cooldown is not None and (isinstance(cooldown, bool) or not isinstance(cooldown, (int, float))
                                 or cooldown < 0):  # fmt: skip
        raise bad(f"zone_cooldown must be a number of minutes, got {cooldown!r}")
    for key in ("network", "firewall"):
        if entry.get(key) is not None and not _NAME.match(entry[key]):
            raise bad(f"{key} {entry[key]!r} is not a GCE name (lowercase letters, digits, '-')")
    for key, with_path in (("endpoint", False), ("storage_endpoint", False), ("metadata_url", True)):
        if entry.get(key) is not None and _url_problem(entry[key], with_path):
            raise bad(f"{key} {entry[key]!r} is not an http(s) URL; e.g. http://127.0.0.1:8080")
    if entry.get("address", "public") not in ("public", "private"):
        raise bad(f"address must be public or private, got {entry['address']!r}")
    if not isinstance(entry.get("preemptible", False), bool):
        raise bad(f"preemptible must be true or false, got {entry['preemptible']!r}")
    check_cloud_keys(entry, bad)
    bucket = entry.get("bucket")
    if bucket is not None and (not _BUCKET.match(bucket) or ".." in bucket):
        raise bad(f"bucket {bucket!r} is not a bucket name: 3-63 lowercase letters, digits, "
                  "'.', '_' and '-', starting and ending with a letter or digit")


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
            raise MonkeyError(f"--credentials {options['credentials']}: no such file; name a "
                              "service-account JSON key file")
        entry["credentials"] = path
    return entry


def network_tag(name: str) -> str:
    """The network tag of provider NAME's instances, which its firewall rule targets."""
    return f"monkey-{label(name)}"[:63].rstrip("-")


def setup(home: Any, name: str, entry: dict[str, Any], *, ssh_from: str | None = None,
          say: Callable[[str], None] = print) -> dict[str, Any]:
    """Find or create what provider NAME's ENTRY needs in the cloud, saying each step; return
    ENTRY with the project, firewall, key and bucket recorded. A failure is a MonkeyError
    after saying what this run created (found by name by the next run)."""
    from monkey.drivers.gce import GCEDriver
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
        firewall = entry.get("firewall") or f"{network_tag(name)}-ssh"
        key_path, _public = ssh_key(home.keys, name)
        bucket = entry.get("bucket") or default_bucket(home.home_id(), name)
        try:
            if driver.ensure_network(network):
                created.append(f"network {network}")
                say(f"created network {network}")
            if driver.ensure_firewall(firewall, network, network_tag(name), source):
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
    done = {**entry, "key": str(key_path), "network": network, "firewall": firewall, "bucket": bucket}
    return {key: done[key] for key in _ORDER if key in done}


def _ssh_source(given: str | None, entry: dict[str, Any]) -> str:
    if given:
        return _cidr(given, "--ssh-from")
    if _loopback(entry.get("endpoint")):
        return "127.0.0.1/32"
    raise MonkeyError("--ssh-from CIDR is needed: the addresses SSH to the instances may come "
                      "from, e.g. --ssh-from 203.0.113.7/32 (this machine's public address; "
                      "monkey asks no outside service for it)")
