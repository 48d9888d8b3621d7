"""Provider drivers behind one base class (``monkey.drivers.base``); only the core calls
their provisioning and transport, while the shell, the API and the job spec ask their
rules (validation, fit, description) through ``driver_class``.

Adding a kind is one module with one ``Driver`` subclass plus one line in ``_DRIVERS``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from typing import TYPE_CHECKING

from monkey import __version__
from monkey.config import ProviderConfig, read_config, read_providers, write_private
from monkey.models import MonkeyError

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
}


_CACHE = "providers.json"  # in MONKEY_HOME/private: providers.yml's entries as last checked


def supported_kinds() -> list[str]:
    """Provider kinds this version can drive."""
    return sorted(_DRIVERS)


def driver_class(kind: str) -> type[Driver]:
    """The Driver subclass of KIND; MonkeyError for a kind this monkey cannot drive."""
    target = _DRIVERS.get(kind)
    if target is None:
        raise MonkeyError(f"provider type {kind!r} cannot be driven by this monkey; "
                          f"use one of: {', '.join(supported_kinds())}")  # fmt: skip
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
    text = read_config(home.providers_file)  # refuses a FIFO, a device, a huge file
    key = f"{__version__} {hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"
    cached = _cached(home, key)
    if cached is not None:
        return cached
    providers = read_providers(home, text)
    where = str(home.providers_file)
    for name, config in providers.items():
        if config.type not in _DRIVERS:
            raise MonkeyError(f"{where}: provider {name!r} has type {config.type!r}; "
                              f"use one of {', '.join(supported_kinds())}")  # fmt: skip
        driver_class(config.type).validate(where, name, config.options)
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
