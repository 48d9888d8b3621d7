"""Provider drivers behind a contract in two halves: ``Driver`` (``monkey.drivers.base``:
the kind's rules and provisioning) and the ``Transport`` it has (``monkey.drivers.transport``:
reaching agents, moving files). Only the core calls provisioning and transport; the shell,
the API and the job spec ask a kind's rules (validation, fit, description) through
``driver_class``.

The transports kinds compose: ``LocalTransport`` (local.py: this machine's agent over a Unix
socket, MONKEY_HOME's folders), ``SSHTransport`` (ssh_transport.py: a pool of hosts over
paramiko, whose hosts may come and go), ``BucketTransport`` (bucket_transport.py: SSH for the
agent and logs, the provider's bucket for blobs and results) and ``SlurmTransport``
(slurm.py: allocations' sockets, or srun relays through a login host's SSHTransport).

Adding a kind (Kubernetes, Ray, ...) is:
1. a module ``monkey/drivers/KIND.py`` with one ``Driver`` subclass: its rules
   (``validate``, and ``never_fits``, ``describe``, ``job_options`` when the defaults do not
   fit) and its provisioning (``instances``, and for machines it makes ``elastic = True``,
   ``list_nodes``, ``create_node(size, options)``, ``destroy_node``); its ``__init__`` sets
   ``self.transport``; a cloud-like kind subclasses ``cloud.CloudDriver`` instead, which
   brings the bucket transport, and supplies the cloud's calls;
2. a ``Transport`` subclass only when none of the above reaches its agents (a pod's exec
   channel, say): ``connect``, ``blobs_dir``, ``run_dir``, ``checkpoint_dir``, and whatever
   moving of files its instances need (``prepare``, ``follow``, ``finish``);
3. one line in ``_DRIVERS`` below (and in ``HOST_FOLDERS`` or ``BUCKET_FILES`` when its jobs
   leave folders on hosts or files in a bucket that ``rm`` and ``gc`` must clean);
4. one test module with a subclass of ``tests/driver_contract.py``'s ``DriverContract``
   saying how to set the provider up; the contract's scenarios then run against it.
"""

from __future__ import annotations

import importlib
import json
import os

from monkey import __version__
from monkey.config import ProviderConfig, read_config, read_providers, write_private
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from monkey.config import Home
    from monkey.drivers.base import Driver

# Imported lazily: a driver's SDK (paramiko, libcloud, boto3) loads only when it is used.
_DRIVERS = {
    "local": "monkey.drivers.local:LocalDriver",
    "ssh": "monkey.drivers.ssh:SSHDriver",
    "ec2": "monkey.drivers.ec2:EC2Driver",
    "gce": "monkey.drivers.gce:GCEDriver",
    "slurm": "monkey.drivers.slurm:SlurmDriver",
    "kubernetes": "monkey.drivers.kubernetes:KubernetesDriver",
}
# Kinds whose jobs leave something behind that `rm` and `gc` owe a clean-up (see
# monkey/store/hosts.py), read without importing any driver: folders on the hosts, which
# outlive their jobs (cloud machines do not), and files in the provider's bucket.
HOST_FOLDERS = ("ssh",)
BUCKET_FILES = ("ec2", "gce")


def cache_claims(home: Home) -> list[str]:
    """The providers whose entry names a cluster's cache claim (`kubernetes`, cache_claim):
    `gc` and `du --hosts` reach it as a host (see monkey/drivers/k8s_cache.py); none while
    providers.yml is broken (its error is every other command's to say)."""
    try:
        providers = load_providers(home)
    except MonkeyError:
        return []
    return sorted(name for name, config in providers.items()
                  if config.type == "kubernetes" and config.options.get("cache_claim"))  # fmt: skip


_CACHE = "providers.json"  # in MONKEY_HOME/private: providers.yml's entries as last checked


def supported_kinds() -> list[str]:
    """Provider kinds this version can drive."""
    return sorted(_DRIVERS)


def driver_class(kind: str) -> type[Driver]:
    """The Driver subclass of KIND; MonkeyError for a kind this monkey cannot drive."""
    target = _DRIVERS.get(kind)
    if target is None:
        raise MonkeyError(
            f"provider type {kind!r} cannot be driven by this monkey; "
            f"use one of: {', '.join(supported_kinds())}"
        )
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def load_providers(home: Home) -> dict[str, ProviderConfig]:
    """providers.yml read and each entry checked by its kind's rules; the `local` provider
    is always present. One-line MonkeyError naming the file, the provider and the fix.

    Once checked, the entries are kept in ``private/providers.json`` under a digest of the
    file's bytes and monkey's version, and read back from there while both stay the same:
    a one-shot command then loads neither the YAML parser nor any driver's module."""
    if not os.path.exists(home.providers_file):
        return read_providers(home)
    import hashlib  # (here: loading OpenSSL costs a command with no providers.yml 1 ms)

    text = read_config(home.providers_file)  # refuses a FIFO, a device, a huge file
    key = f"{__version__} {hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"
    cached = _cached(home, key)
    if cached is not None:
        return cached
    providers = read_providers(home, text)
    where = str(home.providers_file)
    for name, config in providers.items():
        if config.type not in _DRIVERS:
            raise MonkeyError(
                f"{where}: provider {name!r} has type {config.type!r}; "
                f"use one of {', '.join(supported_kinds())}"
            )
        driver_class(config.type).validate(where, name, config.options)
    machine = sorted(name for name, config in providers.items() if config.type == "local")
    if len(machine) > 1:  # one agent serves this machine: two entries would share its slots
        raise MonkeyError(
            f"{where}: providers {' and '.join(repr(n) for n in machine)} are both this "
            "machine (type local; `local` is there even when not written), whose one agent "
            "they would share; keep one entry, named local, with this machine's slots and GPUs"
        )
    _cache(home, key, providers)
    return providers


def _cached(home: Home, key: str) -> dict[str, ProviderConfig] | None:
    """The entries kept under KEY, or None (none kept, another key, unreadable)."""
    try:
        kept = json.loads(read_config(home.private / _CACHE))  # never blocks on a FIFO
        if kept["key"] != key:
            return None
        providers = {}
        for name, (kind, options) in kept["providers"].items():
            if not isinstance(kind, str) or not isinstance(options, dict):
                return None
            providers[name] = ProviderConfig(name, kind, options)
        return providers
    except (MonkeyError, ValueError, KeyError, TypeError):
        return None


def _cache(home: Home, key: str, providers: dict[str, ProviderConfig]) -> None:
    """Keep the checked entries under KEY (written aside, then renamed: a reader sees the
    old file or the new one). Entries JSON cannot hold as they are (a YAML date, a number
    as a key) are not kept."""
    try:
        entries = {n: [c.type, c.options] for n, c in providers.items()}
        data = json.dumps({"key": key, "providers": entries})
        if json.loads(data)["providers"] != entries:
            return
        tmp = home.private / f".{_CACHE}.{os.getpid()}"
        write_private(tmp, data.encode())
        os.replace(tmp, home.private / _CACHE)
    except (OSError, TypeError, ValueError):
        pass  # a read-only or full home: read providers.yml each time


def get_driver(config: ProviderConfig, home: Home) -> Driver:
    """An instance of the driver for the provider's kind."""
    return driver_class(config.type)(config, home)
