"""Where blobs and run results live: MONKEY_HOME (local.py) or a bucket (s3.py)."""

from monkey.storage.base import Storage, storage_for

__all__ = ["Storage", "storage_for"]
