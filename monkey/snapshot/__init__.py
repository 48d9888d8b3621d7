"""Content-addressed code snapshots, dataset digests and git provenance.

Every file is stored once as a read-only blob named by its blake3 digest at
``blobs/D[:2]/D[2:]`` (the worker agent reads this layout). A snapshot or dataset is a
manifest blob listing its files; the manifest's digest names the snapshot.

The manifest format is in ``monkey.snapshot.manifest``.

Blob contents always match their digest: a file is hashed from the bytes that were
actually copied into the store, so an edit racing a snapshot can never corrupt a blob, and
an edit after a snapshot never changes what a queued job runs.
"""

from __future__ import annotations

from monkey.snapshot.blobs import BlobDamaged, BlobStore, hash_file
from monkey.snapshot.git import Folder, GitQuery, locate, repository_root
from monkey.snapshot.manifest import (
    LINK_MODE,
    Dataset,
    FileEntry,
    Snapshot,
    load_manifest,
    snapshot_dir,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.snapshot.datasets import dataset, dataset_name, parse_dataset_spec


def __getattr__(name: str) -> Any:
    """The datasets' functions, loaded by the first submission that has a dataset."""
    if name in ("dataset", "dataset_name", "parse_dataset_spec"):
        from monkey.snapshot import datasets

        return getattr(datasets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BlobDamaged",
    "BlobStore",
    "Dataset",
    "FileEntry",
    "Folder",
    "LINK_MODE",
    "Snapshot",
    "dataset",
    "GitQuery",
    "hash_file",
    "load_manifest",
    "locate",
    "dataset_name",
    "parse_dataset_spec",
    "repository_root",
    "snapshot_dir",
]
