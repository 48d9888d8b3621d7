"""Where blobs and run results live: MONKEY_HOME (local.py) or a bucket (s3.py, gcs.py). A
cloud kind's driver picks its bucket's storage (``CloudDriver.bucket_storage``)."""

from __future__ import annotations

from monkey.storage.base import Storage

__all__ = ["Storage"]
