"""The storage contract: where blobs, checkpoints, persisted folders and outputs live.

A storage is addressed by *keys*, POSIX paths that are the same for every implementation:

    blobs/<digest>                       a content-addressed blob (code, datasets)
    packs/<sha256>                       small blobs end to end, for workers fetching many
                                         at once (buckets: see ``BucketStorage.put_pack``)
    runs/<juid>/checkpoint/...           the job's checkpoint, kept across attempts
    runs/<juid>/persist/<name>/...       a persisted folder (job.yml ``persist``)
    runs/<juid>/<attempt>/outputs/...    an attempt's outputs brought back
    runs/<juid>/results/...              what workers upload themselves (cloud providers):
                                         objects/<sha256>, manifests/<attempt>-<seq>.json
                                         and manifest.json, the newest one (see
                                         monkey/client_agent/results.py and ``results``)

The local storage (``local.py``) is MONKEY_HOME itself: ``blobs/<digest>`` is the
:class:`~monkey.snapshot.BlobStore` path ``blobs/<d[:2]>/<d[2:]>`` and every other key is
the path under MONKEY_HOME. The S3 storage (``s3.py``) keeps the same keys in the
provider's bucket. Workers never hold credentials: the core hands them URLs minted by
:meth:`Storage.blob_url` and :meth:`Storage.put_url` (presigned for S3; ``file://`` for the
local storage, whose files the worker can read directly).

A *tree* (``put_tree`` / ``get_tree``) holds regular files and folders with their modes;
symlinks and other special files are skipped, as the SSH transport does.
"""

from __future__ import annotations

import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.snapshot.blobs import BlobStore

# Called from any thread with the number of bytes just sent.
ProgressFn = Callable[[int], None]
# rel path -> (mode, size, mtime_ns); folders have size -1. "" is the tree's root folder.
Tree = dict[str, tuple[int, int, int]]

URL_EXPIRES = 3600  # seconds a minted URL stays valid unless told otherwise
_KEY_PART = re.compile(r"[^/\0]+")


class Storage(ABC):
    """Where a provider's blobs and run results live; see the module docstring for keys.

    Every method may be called from a worker thread of the core; none touches the store.
    Failures a user can fix (no credentials, no bucket, a missing local blob) are
    MonkeyError with one line."""

    @abstractmethod
    def has(self, digests: Iterable[str]) -> set[str]:
        """The DIGESTS that are stored, found in one or a few calls."""

    @abstractmethod
    def put_blobs(
        self, digests: Iterable[str], source: BlobStore, progress: ProgressFn | None = None
    ) -> int:
        """Send the blobs among DIGESTS that are not stored yet from the local SOURCE, each
        once, checking its content against its digest first; returns the bytes sent.
        PROGRESS gets byte counts as they go; without it a bar is drawn on stderr when it
        is a terminal and the upload takes more than a second."""

    def distrust(self, digest: str) -> None:  # noqa: B027 - most storages keep no memory
        """A worker found blob DIGEST damaged as fetched from here: store it again when it
        is next sent. The default (MONKEY_HOME itself, checked before every start) does
        nothing."""

    @abstractmethod
    def blob_url(self, digest: str, expires: int = URL_EXPIRES) -> str:
        """A URL a worker can GET the blob from without credentials, for EXPIRES seconds."""

    @abstractmethod
    def put_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        """A URL a worker can PUT one file to at KEY (checkpoint archives, outputs), for
        EXPIRES seconds. Send ``Content-Type: application/octet-stream``."""

    def get_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        """A URL a worker can GET the object at KEY from without credentials."""
        raise MonkeyError(f"{type(self).__name__} cannot give workers download URLs")

    def upload_form(self, prefix: str, expires: int = URL_EXPIRES) -> dict[str, Any]:
        """What lets a worker upload any number of files under PREFIX/ without credentials
        for EXPIRES seconds: ``{"url", "fields"}``, a presigned POST policy (the worker
        posts a multipart form of FIELDS, ``key`` = PREFIX/name and ``file``), or a
        ``file://`` folder URL and no fields (the key is then a path under it)."""
        raise MonkeyError(f"{type(self).__name__} cannot give workers an upload form")

    @abstractmethod
    def get_file(self, key: str, path: Path) -> bool:
        """Copy the object at KEY (such as one a worker sent to ``put_url(KEY)``) to PATH
        through a temporary name; False when KEY holds nothing."""

    @abstractmethod
    def get_tree(self, prefix: str, local_dir: Path) -> int:
        """Make LOCAL_DIR a copy of the tree at PREFIX (files whose size and mtime differ
        are fetched, files not in the tree removed); bytes fetched. A PREFIX that holds no
        tree leaves LOCAL_DIR untouched and returns 0."""

    @abstractmethod
    def put_tree(self, local_dir: Path, prefix: str) -> int:
        """Make the tree at PREFIX a copy of LOCAL_DIR (an absent folder counts as empty);
        bytes sent."""

    @abstractmethod
    def delete(self, prefix: str) -> None:
        """Remove the key PREFIX and everything under it; nothing there is not an error."""


# -- keys -------------------------------------------------------------------------------


def blob_key(digest: str) -> str:
    return f"blobs/{digest}"


def check_key(key: str) -> str:
    """KEY without a trailing slash, or MonkeyError when it is not under blobs/, packs/ or
    runs/ or could leave its folder."""
    parts = key.rstrip("/").split("/")
    if (
        len(parts) < 2
        or parts[0] not in ("blobs", "packs", "runs")
        or not all(_KEY_PART.fullmatch(p) and p not in (".", "..") for p in parts)
    ):
        raise MonkeyError(f"{key!r} is not a storage key; expected blobs/DIGEST or runs/JUID/...")
    return "/".join(parts)


def source_size(source: BlobStore, digest: str) -> int:
    """The size of a blob of the local SOURCE, or MonkeyError when it is missing."""
    try:
        return source.path(digest).stat().st_size
    except FileNotFoundError:
        raise MonkeyError(
            f"blob {digest} is missing from {source.root}; resubmit the job to store it again"
        ) from None


def blob_mismatch(source: BlobStore, digest: str) -> MonkeyError:
    """The error for a blob of SOURCE whose content no longer matches its digest."""
    from monkey.snapshot.blobs import BlobDamaged

    return BlobDamaged(digest, source.root)


# -- local trees ------------------------------------------------------------------------


def local_tree(root: Path) -> Tree:
    """The regular files and folders under ROOT (empty when ROOT is not a folder)."""
    tree: Tree = {}
    try:
        info = os.stat(root)
    except FileNotFoundError:
        return tree
    if not stat.S_ISDIR(info.st_mode):
        return tree
    tree[""] = (stat.S_IMODE(info.st_mode), -1, 0)
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        for name in dirs + files:
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISDIR(info.st_mode):
                tree[rel] = (stat.S_IMODE(info.st_mode), -1, 0)
            elif stat.S_ISREG(info.st_mode):
                tree[rel] = (stat.S_IMODE(info.st_mode), info.st_size, info.st_mtime_ns)
    return tree


def check_rel(rel: str, where: str) -> str:
    """A relative path read from storage, refused when it could leave its folder."""
    parts = rel.split("/")
    if rel.startswith("/") or "" in parts or "." in parts or ".." in parts or "\0" in rel:
        raise MonkeyError(f"refusing the unsafe path {rel!r} stored in {where}")
    return rel


def prune(local_dir: Path, tree: Tree) -> None:
    """Remove what LOCAL_DIR holds beyond TREE, and anything standing where TREE has a
    folder but LOCAL_DIR something else; then make TREE's folders with their modes
    (temporarily owner-writable, see :func:`fix_modes`)."""
    have = local_tree(local_dir)
    for rel in sorted(have, key=len, reverse=True):  # deepest first
        want = tree.get(rel)
        if rel and (want is None or (want[1] < 0) != (have[rel][1] < 0)):
            path = local_dir / rel
            if have[rel][1] < 0:
                _rmtree(path)
            else:
                path.unlink()
    for rel, (mode, size, _) in sorted(tree.items()):
        if size < 0:
            path = local_dir / rel if rel else local_dir
            if path.is_symlink() or path.is_file():
                path.unlink()
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode | 0o700)


def fix_modes(local_dir: Path, tree: Tree) -> None:
    """Give TREE's folders their final modes, deepest first (files already have theirs)."""
    for rel in sorted((r for r, e in tree.items() if e[1] < 0), key=len, reverse=True):
        os.chmod(local_dir / rel if rel else local_dir, tree[rel][0])


def _rmtree(path: Path) -> None:
    import shutil

    def onerror(func: Callable[..., object], target: str, _exc: object) -> None:
        os.chmod(os.path.dirname(target), 0o700)  # a read-only folder of the tree
        func(target)

    shutil.rmtree(path, onerror=onerror)
