"""Provider drivers behind one base class (``monkey.drivers.base``); only the core calls
their provisioning and transport, while the shell, the API and the job spec ask their
rules (validation, fit, description) through ``driver_class``.

Adding a kind is one module with one ``Driver`` subclass plus one line in ``_DRIVERS``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from monkey.config import read_providers
from monkey.models import MonkeyError

if TYPE_CHECKING:
    from monkey.config import Home, ProviderConfig
    from monkey.drivers.base import Driver

# Imported lazily: a driver's SDK (paramiko, libcloud, boto3) loads only when it is used.
_DRIVERS = {
    "local": "monkey.drivers.local:LocalDriver",
    "ssh": "monkey.drivers.ssh:SSHDriver",
    "ec2": "monkey.drivers.ec2:EC2Driver",
    "gce": "monkey.drivers.gce:GCEDriver",
    "slurm": "monkey.drivers.slurm:SlurmDriver",
}


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
    is always present. One-line MonkeyError naming the file, the provider and the fix."""
    providers = read_providers(home)
    where = str(home.providers_file)
    for name, config in providers.items():
        if config.type not in _DRIVERS:
            raise MonkeyError(f"{where}: provider {name!r} has type {config.type!r}; "
                              f"use one of {', '.join(supported_kinds())}")  # fmt: skip
        driver_class(config.type).validate(where, name, config.options)
    return providers


def get_driver(config: ProviderConfig, home: Home) -> Driver:
    """An instance of the driver for the provider's kind."""
    return driver_class(config.type)(config, home)
