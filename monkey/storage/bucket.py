"""What an object-store bucket (S3, GCS) does the same whatever the cloud: blobs stored once
by digest, trees written file by file and then their listing, downloads into temporary
names renamed when complete. A cloud's storage supplies the calls below ``-- the cloud's
calls`` and its signed URLs.

A tree (``put_tree``) is its files under ``PREFIX/REL`` plus one object at ``PREFIX/`` (the
folder's own key) holding its listing as JSON, ``{"tree": {rel: [mode, size, mtime_ns]}}``
with size -1 for folders and "" for the root. The listing is written last and is what
``get_tree`` reads, so a tree whose upload was cut short is still the previous one.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

from blake3 import blake3

from monkey.models import MonkeyError
from monkey.snapshot.blobs import hash_file
from monkey.storage.base import (
    ProgressFn,
    Storage,
    Tree,
    blob_key,
    blob_mismatch,
    check_key,
    check_rel,
    fix_modes,
    local_tree,
    prune,
    source_size,
)
from monkey.storage.progress import upload_progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from monkey.snapshot.blobs import BlobStore

THREADS = 8  # concurrent transfers
# A worker lacking at least PACK_MIN blobs of at most PACK_BLOB_MAX bytes each gets them in
# packs (``put_pack``) of at most PACK_MAX bytes: one request per pack, not per blob.
PACK_BLOB_MAX = 1 << 20
PACK_MAX = 64 << 20
PACK_MIN = 2
_HEAD_AT_MOST = 64  # more unknown digests than this: list blobs/ instead of one HEAD each
_LIST_AT_MOST = 20_000  # ... unless the bucket holds more blobs than these


class BucketStorage(Storage):
    """Keys of the module docstring of ``monkey.storage.base``, in ``bucket``."""

    scheme: ClassVar[str] = ""  # of the bucket's URLs in messages: s3, gs
    label: ClassVar[str] = ""  # the bucket in messages: "S3 bucket", "GCS bucket"

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._lock = threading.Lock()
        self._known: set[str] = set()  # digests and pack keys seen stored (never changed)
        self._suspect: set[str] = set()  # digests a worker found damaged here: stored again
        self._pack_locks: dict[str, threading.Lock] = {}

    # -- blobs

    def has(self, digests: Iterable[str]) -> set[str]:
        """Known digests cost nothing; many unknown ones are looked up by listing blobs/
        (up to _LIST_AT_MOST keys), the rest with concurrent HEADs."""
        wanted = set(digests)
        unknown = wanted - self._known
        found: set[str] = set()
        with self._errors("checking which blobs are stored"):
            if len(unknown) > _HEAD_AT_MOST:
                listed, complete = self._list_blobs()
                found = unknown & listed
                unknown = set() if complete else unknown - found
            if unknown:
                with ThreadPoolExecutor(min(THREADS, len(unknown))) as pool:
                    ordered = list(unknown)
                    present = pool.map(self._exists, [blob_key(d) for d in ordered])
                    found |= {d for d, there in zip(ordered, present) if there}
        with self._lock:
            self._known |= found
        return wanted & self._known

    def put_blobs(
        self, digests: Iterable[str], source: BlobStore, progress: ProgressFn | None = None
    ) -> int:
        wanted = list(dict.fromkeys(digests))
        present = self.has(wanted) - self._suspect
        missing = [d for d in wanted if d not in present]
        sizes = {d: source_size(source, d) for d in missing}
        for digest in missing:
            if hash_file(source.path(digest)) != digest:
                raise blob_mismatch(source, digest)
        with upload_progress(sum(sizes.values()), progress) as advance:
            self._upload(
                [(source.path(d), blob_key(d)) for d in missing], advance, "uploading blobs"
            )
        with self._lock:
            self._known.update(missing)
            self._suspect.difference_update(missing)
        return sum(sizes.values())

    def distrust(self, digest: str) -> None:
        """A worker found blob DIGEST damaged as fetched from here: the next ``put_blobs``
        or ``put_pack`` naming it stores it again from the (checked) source."""
        with self._lock:
            self._suspect.add(digest)

    def put_packs(
        self, digests: Iterable[str], source: BlobStore
    ) -> list[tuple[str, list[list[Any]]]]:
        """``put_pack`` for DIGESTS in packs of at most PACK_MAX bytes (smallest blobs first)."""
        sizes = {d: source_size(source, d) for d in digests}
        packs: list[list[str]] = [[]]
        size = 0
        for digest in sorted(sizes, key=lambda d: (sizes[d], d)):
            blob = sizes[digest]
            if packs[-1] and size + blob > PACK_MAX:
                packs.append([])
                size = 0
            packs[-1].append(digest)
            size += blob
        return [self.put_pack(members, source) for members in packs if members]

    def put_pack(self, digests: Iterable[str], source: BlobStore) -> tuple[str, list[list[Any]]]:
        """Store the blobs DIGESTS end to end as one object, so that a worker lacking many
        small blobs (a project's code) fetches them with one request instead of one each.
        Returns its key and its index, ``[[digest, size], ...]`` in the order stored. The
        key names the sorted digests: a pack is uploaded once, whoever asks for it. Packs
        are built in memory: callers keep them to small blobs (see PACK_BLOB_MAX)."""
        members = sorted(set(digests))
        index: list[list[Any]] = [[d, source_size(source, d)] for d in members]
        key = f"packs/{hashlib.sha256(chr(10).join(members).encode()).hexdigest()}"
        with self._lock:
            lock = self._pack_locks.setdefault(key, threading.Lock())
        with lock:  # the same pack asked for twice at once is uploaded once
            suspect = self._suspect.intersection(members)
            if key in self._known and not suspect:
                return key, index
            with self._errors("uploading blobs"):
                if suspect or not self._exists(key):
                    body = []
                    for digest in members:
                        data = source.read_bytes(digest)
                        if blake3(data).hexdigest() != digest:
                            raise blob_mismatch(source, digest)
                        body.append(data)
                    self._put_bytes(key, b"".join(body))
            with self._lock:
                self._known.add(key)
                self._suspect.difference_update(suspect)
        return key, index

    def get_file(self, key: str, path: Path) -> bool:
        key, path = check_key(key), Path(path)
        with self._errors(f"downloading {key}"):
            if not self._exists(key):
                return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.monkey-{uuid.uuid4().hex[:8]}")
        try:
            self._download([(key, tmp)], f"downloading {key}")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return True

    # -- trees

    def put_tree(self, local_dir: Path, prefix: str) -> int:
        prefix = check_key(prefix)
        tree = local_tree(Path(local_dir)) or {"": (0o700, -1, 0)}
        old = self._read_tree(prefix) or {}
        with self._errors(f"uploading {prefix}"):
            stored = {k for k, _ in self._list(prefix + "/")}
        changed = [
            rel
            for rel, entry in tree.items()
            if entry[1] >= 0 and (old.get(rel) != entry or f"{prefix}/{rel}" not in stored)
        ]
        with upload_progress(sum(tree[rel][1] for rel in changed), None, prefix) as advance:
            self._upload(
                [(Path(local_dir) / rel, f"{prefix}/{rel}") for rel in changed],
                advance,
                f"uploading {prefix}",
            )
        body = json.dumps({"tree": {rel: list(e) for rel, e in sorted(tree.items())}}).encode()
        with self._errors(f"uploading {prefix}"):
            self._put_bytes(prefix + "/", body)
        keep = {f"{prefix}/{rel}" for rel, e in tree.items() if e[1] >= 0} | {prefix + "/"}
        self._delete_keys(sorted(stored - keep), prefix)
        return sum(tree[rel][1] for rel in changed)

    def get_tree(self, prefix: str, local_dir: Path) -> int:
        prefix, local_dir = check_key(prefix), Path(local_dir)
        tree = self._read_tree(prefix)
        if tree is None:
            return 0
        prune(local_dir, tree)
        have = local_tree(local_dir)
        changed = [rel for rel, e in tree.items() if e[1] >= 0 and have.get(rel) != e]
        temps = {rel: local_dir / f"{rel}.monkey-{uuid.uuid4().hex[:8]}" for rel in changed}
        try:
            self._download(
                [(f"{prefix}/{rel}", temps[rel]) for rel in changed], f"downloading {prefix}"
            )
            for rel in changed:
                mode, _size, mtime = tree[rel]
                os.chmod(temps[rel], mode)
                os.utime(temps[rel], ns=(mtime, mtime))
                os.replace(temps[rel], local_dir / rel)
        finally:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
        fix_modes(local_dir, tree)
        return sum(tree[rel][1] for rel in changed)

    def delete(self, prefix: str) -> None:
        prefix = check_key(prefix)
        with self._errors(f"deleting {prefix}"):
            keys = [k for k, _ in self._list(prefix) if k == prefix or k.startswith(prefix + "/")]
        self._delete_keys(keys, prefix)
        if prefix.startswith("blobs/"):
            with self._lock:
                self._known.discard(prefix[len("blobs/") :])

    # -- helpers

    def _list_blobs(self) -> tuple[set[str], bool]:
        """Digests stored, from the first _LIST_AT_MOST keys of blobs/; and whether that was all."""
        found: set[str] = set()
        for key, _ in self._list("blobs/"):
            if len(found) == _LIST_AT_MOST:
                return found, False
            found.add(key[len("blobs/") :])
        return found, True

    def _read_tree(self, prefix: str) -> Tree | None:
        """The listing stored at PREFIX/, or None when there is no tree."""
        with self._errors(f"reading {prefix}"):
            body = self._get_bytes(prefix + "/")
        if body is None:
            return None
        try:
            raw = json.loads(body)["tree"]
            tree = {rel: (int(e[0]), int(e[1]), int(e[2])) for rel, e in raw.items()}
        except (ValueError, KeyError, TypeError, IndexError):
            raise MonkeyError(
                f"{self.label} {self.bucket}: {prefix}/ is not a tree stored by "
                "monkey; delete it or use another bucket"
            ) from None
        for rel in tree:
            if rel:
                check_rel(rel, f"{self.scheme}://{self.bucket}/{prefix}/")
        return tree

    # -- the cloud's calls

    @abstractmethod
    def _errors(self, what: str) -> AbstractContextManager[None]:
        """A context turning the client's failures into one MonkeyError line naming the
        bucket, WHAT failed and the fix."""

    @abstractmethod
    def _exists(self, key: str) -> bool:
        """Whether an object is stored at KEY."""

    @abstractmethod
    def _list_dated(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        """(key, size, when last written) of every object whose key starts with PREFIX."""

    @abstractmethod
    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with PREFIX."""

    @abstractmethod
    def _upload(self, files: list[tuple[Path, str]], advance: ProgressFn, what: str) -> None:
        """Upload (path, key) pairs at once; ADVANCE gets byte counts as they are sent."""

    @abstractmethod
    def _download(self, pairs: list[tuple[str, Path]], what: str) -> None:
        """Download (key, path) pairs at once."""

    @abstractmethod
    def _put_bytes(self, key: str, body: bytes) -> None:
        """Store BODY at KEY."""

    @abstractmethod
    def _get_bytes(self, key: str) -> bytes | None:
        """The object at KEY, or None when there is none."""

    @abstractmethod
    def _delete_keys(self, keys: list[str], prefix: str) -> None:
        """Delete the objects at KEYS (under PREFIX, for messages)."""
