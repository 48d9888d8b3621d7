"""The local storage: MONKEY_HOME itself (the local and SSH providers)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from monkey.config import Home
from monkey.models import MonkeyError
from monkey.snapshot.blobs import BlobStore, hash_file
from monkey.storage.base import (
    URL_EXPIRES,
    ProgressFn,
    Storage,
    blob_mismatch,
    check_key,
    fix_modes,
    local_tree,
    prune,
    source_size,
)
from monkey.storage.progress import upload_progress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class LocalStorage(Storage):
    """Keys are paths under MONKEY_HOME; blobs are its BlobStore. URLs are ``file://``
    URLs (they do not expire: the worker shares this machine's files)."""

    def __init__(self, home: Home) -> None:
        self.root = home.root
        self.blobs = BlobStore(home.blobs)

    def has(self, digests: Iterable[str]) -> set[str]:
        return {d for d in digests if self.blobs.has(d)}

    def put_blobs(
        self, digests: Iterable[str], source: BlobStore, progress: ProgressFn | None = None
    ) -> int:
        if source.root.resolve() == self.blobs.root.resolve():
            return 0
        wanted = [d for d in dict.fromkeys(digests) if not self.blobs.has(d)]
        sizes = {d: source_size(source, d) for d in wanted}
        sent = 0
        with upload_progress(sum(sizes.values()), progress) as advance:
            for digest in wanted:
                try:
                    if self.blobs.put_file(source.path(digest), digest):  # checks the digest
                        sent += sizes[digest]
                except MonkeyError:
                    if hash_file(source.path(digest)) != digest:
                        raise blob_mismatch(source, digest) from None
                    raise
                advance(sizes[digest])
        return sent

    def blob_url(self, digest: str, expires: int = URL_EXPIRES) -> str:
        return self.blobs.path(digest).as_uri()

    def put_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._path(key).as_uri()

    def get_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._path(key).as_uri()

    def upload_form(self, prefix: str, expires: int = URL_EXPIRES) -> dict[str, Any]:
        check_key(prefix)
        return {"url": self.root.as_uri(), "fields": {}}

    def get_file(self, key: str, path: Path) -> bool:
        src, path = self._path(key), Path(path)
        if not src.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        _copy(src, path)
        return True

    def get_tree(self, prefix: str, local_dir: Path) -> int:
        return _mirror(self._path(prefix), Path(local_dir))

    def put_tree(self, local_dir: Path, prefix: str) -> int:
        return _mirror(Path(local_dir), self._path(prefix), always=True)

    def delete(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()

    def _path(self, key: str) -> Path:
        key = check_key(key)
        if key.startswith("blobs/"):
            return self.blobs.path(key[len("blobs/") :])
        return self.root / key


def _mirror(src: Path, dst: Path, always: bool = False) -> int:
    """Make DST a copy of SRC; with ALWAYS an absent SRC counts as empty, else it leaves
    DST alone. Returns the bytes copied."""
    if src.resolve() == dst.resolve():
        return 0
    tree = local_tree(src)
    if not tree:
        if not always:
            return 0
        tree = {"": (0o700, -1, 0)}
    prune(dst, tree)
    have = local_tree(dst)
    copied = 0
    for rel, (mode, size, mtime) in tree.items():
        if size < 0 or have.get(rel) == (mode, size, mtime):
            continue
        _copy(src / rel, dst / rel, mode, mtime)
        copied += size
    fix_modes(dst, tree)
    return copied


def _copy(src: Path, dst: Path, mode: int | None = None, mtime: int | None = None) -> None:
    """Copy SRC to DST through a temporary name, with MODE and MTIME (ns) when given."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dst.parent)
    try:
        with open(src, "rb") as f, open(fd, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        if mode is not None:
            os.chmod(tmp, mode)
        if mtime is not None:
            os.utime(tmp, ns=(mtime, mtime))
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
