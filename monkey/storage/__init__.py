"""Where blobs and run results live: MONKEY_HOME (local.py) or a bucket (s3.py, gcs.py)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from monkey.storage.base import Storage

if TYPE_CHECKING:
    from monkey.config import Home, ProviderConfig

__all__ = ["Storage", "storage_for"]

# The bucket storage of each kind whose entry may name a ``bucket``: (module, class),
# imported only when used (boto3 and Google's libraries are heavy). A new kind is one line.
BUCKET_STORAGES = {"ec2": ("monkey.storage.s3", "S3Storage"),
                   "gce": ("monkey.storage.gcs", "GCSStorage")}


def storage_for(config: ProviderConfig, home: Home) -> Storage:
    """The storage of a provider: its S3 bucket for ``ec2`` with a ``bucket``, its GCS
    bucket for ``gce`` with a ``bucket``, else MONKEY_HOME (local and SSH providers)."""
    target = BUCKET_STORAGES.get(config.type) if config.options.get("bucket") else None
    if target is not None:
        module, name = target
        return getattr(import_module(module), name).from_config(config)
    from monkey.storage.local import LocalStorage

    return LocalStorage(home)
