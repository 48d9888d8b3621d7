"""Provider drivers behind one base class; only the core calls them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from monkey.models import MonkeyError

if TYPE_CHECKING:
    from monkey.config import Home, ProviderConfig
    from monkey.drivers.base import Driver

# Imported lazily: a driver's SDK (paramiko, libcloud, boto3) loads only when it is used.
_DRIVERS = {"local": "monkey.drivers.local:LocalDriver", "ssh": "monkey.drivers.ssh:SSHDriver"}


def supported_kinds() -> list[str]:
    """Provider kinds this version can drive."""
    return sorted(_DRIVERS)


def get_driver(config: ProviderConfig, home: Home) -> Driver:
    """An instance of the driver for the provider's kind."""
    target = _DRIVERS.get(config.type)
    if target is None:
        raise MonkeyError(
            f"provider {config.name!r} has type {config.type!r}, which this monkey cannot drive yet; "
            f"use one of: {', '.join(supported_kinds())}"
        )
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(config, home)
