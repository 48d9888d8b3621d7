"""The content-addressed blob store: every file once, read-only, named by its blake3 digest
at ``blobs/D[:2]/D[2:]`` (the worker agent reads this layout); blob contents always match
their digest."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import blake3

from monkey.models import MonkeyError, whole_number
from monkey.store.errors import disk_full, is_no_space

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_BIG = 1 << 20  # files at least this large are hashed via mmap on several threads
_CHUNK = 1 << 20
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
# Blobs are read-only and private: the owner may read them (and run them, when the file
# they came from was executable), nobody else may do anything.
_BLOB_MODE = 0o400
# A blob being written: ``.tmp-<writer's pid>-<random>``, beside its final place or at the
# store's top (gc removes one whose writer is gone, see monkey.housekeeping).
TMP_PREFIX = ".tmp-"
DAMAGED = ".damaged"  # the folder of the store where `monkey verify` sets damaged blobs aside


def writer_gone(name: str, prefix: str = TMP_PREFIX) -> bool:
    """Whether the process that names the file or folder NAME (``PREFIX<pid>-...``) is gone
    from this machine: what it was writing is left over."""
    pid = whole_number(name[len(prefix) :].partition("-")[0])
    if not name.startswith(prefix) or pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # another user's: it exists
    return False


def hash_file(path: Path) -> str:
    """The blake3 hex digest (64 chars) of a file's current content."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < _BIG:
            return blake3.blake3(f.read()).hexdigest()
    return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).hexdigest()


def _hash_big(path: str) -> str:
    return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).hexdigest()


class BlobDamaged(MonkeyError):
    """A stored blob whose bytes no longer match its digest (flipped, truncated, replaced).
    ``path``: the file it holds for a job, when known; ``juid``: that job."""

    def __init__(
        self, digest: str, root: Path, path: str | None = None, juid: str | None = None
    ) -> None:
        self.digest, self.root, self.path, self.juid = digest, root, path, juid
        job = f"job {juid}: " if juid else ""
        what = f"{path}: " if path else ""
        super().__init__(
            f"{job}{what}blob {digest} in {root} does not match its digest (damaged on "
            "disk); `monkey verify` lists the jobs it affects and sets it aside, then submit "
            "the job again from its source"
        )

    def about(self, path: str | None = None, juid: str | None = None) -> BlobDamaged:
        """The same damage, naming the file PATH of job JUID (where not named yet)."""
        return BlobDamaged(self.digest, self.root, self.path or path, self.juid or juid)


# Blobs verified by this process: path -> (size, mtime_ns, ctime_ns, inode) when its bytes
# matched its digest. A blob is immutable (0400): any write to it, or a replacement, changes
# its ctime (which no tool can set back) or inode, so an unchanged stat means unchanged bytes.
_verified: dict[str, tuple[int, int, int, int]] = {}
_VERIFIED_MAX = 1 << 20
_sha256: dict[str, tuple[tuple[int, int, int, int], str]] = {}  # path -> (stamp, sha256)


# A stamp recorded by another process is trusted only when the blob's last change (its
# ctime, from the kernel's coarse clock: a tick is at most 10 ms) came this long before the
# stamp was recorded, so no change in the same tick can hide behind an equal ctime.
_RACY_CTIME_NS = 100_000_000


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


# -- blob store -------------------------------------------------------------------------


class BlobStore:
    """Immutable, content-addressed files under ``root``: digest D lives at ``root/D[:2]/D[2:]``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._root = os.fspath(self.root)
        self._shards: set[str] = set()
        self._home: str | None = None

    @property
    def home(self) -> str:
        """The real path of the folder holding the store (MONKEY_HOME), found once."""
        if self._home is None:
            self._home = os.path.dirname(os.path.realpath(self._root))
        return self._home

    def path(self, digest: str) -> Path:
        """Where the blob ``digest`` lives (whether or not it exists)."""
        if not _DIGEST_RE.fullmatch(digest):
            raise MonkeyError(
                f"{digest!r} is not a blob digest; expected 64 lowercase hex characters"
            )
        return Path(self._p(digest))

    def has(self, digest: str) -> bool:
        """Whether the blob is stored."""
        return os.path.exists(self._p(digest))

    def read_bytes(self, digest: str) -> bytes:
        """The content of a stored blob, checked against its digest (BlobDamaged if not)."""
        try:
            with open(self.path(digest), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise MonkeyError(
                f"blob {digest} is missing from {self.root}; resubmit the job to store it again"
            ) from None
        if (
            blake3.blake3(
                data, max_threads=blake3.blake3.AUTO if len(data) >= _BIG else 1
            ).hexdigest()
            != digest
        ):
            raise BlobDamaged(digest, self.root)
        return data

    def verify(self, digest: str) -> bool | None:
        """Whether blob DIGEST's bytes match its digest (None: it is not stored). Hashed
        once per process while its stat stays the same (see `_verified`)."""
        path = self._p(digest)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if _verified.get(path) == _stamp(st):
            return True
        try:
            good = hash_file(Path(path)) == digest
        except FileNotFoundError:
            return None
        if good:
            _remember(path, _stamp(st))
        return good

    def sha256(self, digest: str) -> str:
        """The sha256 of blob DIGEST's bytes, which a worker without blake3 checks what it
        fetched against (computed once per process while the blob's stat stays)."""
        import hashlib

        path = self._p(digest)
        st = os.stat(path)
        known = _sha256.get(path)
        if known is not None and known[0] == _stamp(st):
            return known[1]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        if len(_sha256) >= _VERIFIED_MAX:
            _sha256.clear()
        _sha256[path] = (_stamp(st), h.hexdigest())
        return h.hexdigest()

    def known_good(self, digest: str) -> bool:
        """Whether blob DIGEST was verified by this process and is unchanged since (a stat)."""
        path = self._p(digest)
        known = _verified.get(path)
        try:
            return known is not None and known == _stamp(os.stat(path))
        except OSError:
            return False

    def stamped(
        self, blobs: Iterable[tuple[str, int]]
    ) -> list[tuple[str, int, tuple[int, int, int] | None]]:
        """BLOBS (digest, size) with the stamp (mtime_ns, ctime_ns, ino) of those this
        process hashed and found right, unchanged since (None for the others): what a core
        started later may trust instead of hashing them again (see `trust`)."""
        out: list[tuple[str, int, tuple[int, int, int] | None]] = []
        for digest, size in blobs:
            path = self._p(digest)
            try:
                st = _stamp(os.stat(path))
            except OSError:
                st = None
            out.append(
                (digest, size, st[1:] if st is not None and _verified.get(path) == st else None)
            )
        return out

    def trust(self, stamps: Mapping[str, tuple[int, int, int, int, int]]) -> set[str]:
        """Count as verified the blobs whose stat still equals the stamp (size, mtime_ns,
        ctime_ns, ino, recorded_ns) a process recorded after hashing their bytes, when that
        record came well after the blob's last change (see `_RACY_CTIME_NS`); returns their
        digests."""
        trusted = set()
        for digest, (size, mtime, ctime, ino, recorded) in stamps.items():
            if ctime >= recorded - _RACY_CTIME_NS:
                continue
            path = self._p(digest)
            try:
                st = _stamp(os.stat(path))
            except OSError:
                continue
            if st == (size, mtime, ctime, ino):
                _remember(path, st)
                trusted.add(digest)
        return trusted

    def unchecked(
        self,
        digests: Sequence[str],
        recorded: Callable[[list[str]], Mapping[str, tuple[int, int, int, int, int]]],
    ) -> list[tuple[str, int]]:
        """(digest, size) of the blobs among DIGESTS a reader must hash before use: those
        neither checked by this process nor stamped by one that hashed them (RECORDED gives
        the stamps the store holds, see `trust`); size 0 for a missing one."""
        unknown = [d for d in digests if not self.known_good(d)]
        trusted = self.trust(recorded(unknown)) if unknown else set()
        out = []
        for digest in unknown:
            if digest not in trusted:
                try:
                    out.append((digest, os.path.getsize(self._p(digest))))
                except OSError:
                    out.append((digest, 0))
        return out

    def check(self, digest: str) -> None:
        """MonkeyError when blob DIGEST is missing, BlobDamaged when its bytes are wrong."""
        ok = self.verify(digest)
        if ok is None:
            raise MonkeyError(
                f"blob {digest} is missing from {self.root}; submit the job "
                "again from its source to store it"
            )
        if not ok:
            raise BlobDamaged(digest, self.root)

    def copy_out(self, digest: str, target: str) -> None:
        """Write blob DIGEST's bytes to the new file TARGET, hashing what is copied:
        BlobDamaged (TARGET removed) when they do not match the digest."""
        hasher = blake3.blake3()
        try:
            with open(self.path(digest), "rb") as src, open(target, "xb") as out:
                while chunk := src.read(_CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
        except FileNotFoundError as exc:
            if exc.filename == target:
                raise
            raise MonkeyError(
                f"blob {digest} is missing from {self.root}; submit the job "
                "again from its source to store it"
            ) from None
        if hasher.hexdigest() != digest:
            _unlink(target)
            raise BlobDamaged(digest, self.root)

    @contextmanager
    def lease(
        self, exclusive: bool = False, waiting: str | None = None, wait: bool = True
    ) -> Iterator[bool]:
        """Hold the store's lease: shared by submitters from their first blob written or
        reused to their job rows committed; exclusive by gc while it decides and deletes.
        So gc never deletes a blob a submission counts on, and a submitter never reuses one
        gc is deleting. A flock: a process killed at any instant releases it. WAITING: what
        to call the caller in a note when it has to wait. Yields whether it is held: with
        WAIT false, False at once when another holds it (the body runs without it)."""
        import fcntl

        try:
            os.makedirs(self._root, mode=0o700, exist_ok=True)
            fd = os.open(f"{self._root}/.lease", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if is_no_space(exc):
                raise disk_full(self.root) from None
            raise MonkeyError(
                f"cannot use the blob store {self.root} ({exc.strerror}); fix its permissions"
            ) from None
        how = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                if waiting:
                    import logging

                    logging.getLogger("monkey").warning(
                        "monkey: %s waits for %s in progress to finish",
                        waiting,
                        "submissions" if exclusive else "a gc",
                    )
                fcntl.flock(fd, how)
            yield True
        finally:
            os.close(fd)

    def put_bytes(self, data: bytes) -> tuple[str, bool]:
        """Store ``data``; returns (digest, newly stored)."""
        digest = blake3.blake3(data).hexdigest()
        if self.has(digest):
            return digest, False
        with self._writing():
            return digest, self._write(data, digest)

    def _write(self, data: bytes, digest: str, mode: int = _BLOB_MODE) -> bool:
        """Store DATA, whose digest is DIGEST, with MODE; True if newly stored."""
        fd, tmp = self._temp(digest)
        try:
            with open(fd, "wb", closefd=True) as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)
        except BaseException:
            _unlink(tmp)
            raise
        return self._commit(tmp, digest)

    def put_file(self, src: Path, digest: str) -> bool:
        """Copy ``src`` in as blob ``digest``; True if newly stored, False if already there.

        The copied bytes are hashed; if they no longer match ``digest`` (the file changed
        since it was hashed) nothing is stored and MonkeyError is raised."""
        if self.has(digest):
            return False
        with self._writing():
            return self._ingest(os.fspath(src), expect=digest)[2]

    def put_path(self, src: Path | str) -> tuple[str, int, bool]:
        """Copy ``src`` in under the digest of the bytes actually copied.

        Returns (digest, size, newly stored). Safe against concurrent edits of ``src``."""
        with self._writing():
            return self._ingest(os.fspath(src), expect=None)

    def receiver(self, digest: str) -> Receiver:
        """A blob DIGEST arriving in pieces (an upload): written to a temporary file in the
        store and hashed as it comes, put in place only when its bytes match DIGEST."""
        self.path(digest)  # refuses what is not a digest
        with self._writing():
            fd, tmp = self._temp(digest)
        return Receiver(self, digest, fd, tmp)

    # -- internals

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Report a full disk as DiskFull (the temporary file is removed already)."""
        try:
            yield
        except OSError as exc:
            if is_no_space(exc):
                raise disk_full(self.root) from None
            raise

    def _p(self, digest: str) -> str:
        return f"{self._root}/{digest[:2]}/{digest[2:]}"

    def _shard(self, digest: str) -> str:
        shard = f"{self._root}/{digest[:2]}"
        if shard not in self._shards:
            os.makedirs(shard, mode=0o700, exist_ok=True)
            self._shards.add(shard)
        return shard

    def _temp(self, digest: str | None) -> tuple[int, str]:
        """A temporary file on the store's filesystem (in the blob's folder when known)."""
        if digest is None:
            os.makedirs(self._root, mode=0o700, exist_ok=True)
            folder = self._root
        else:
            folder = self._shard(digest)
        import tempfile

        return tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=folder)

    def _commit(self, tmp: str, digest: str) -> bool:
        """Move a finished, read-only temp file into place; False if the blob already existed."""
        final = self._p(digest)
        self._shard(digest)
        try:
            os.link(tmp, final)  # never replaces: the first writer wins
        except FileExistsError:
            _unlink(tmp)
            return False
        except OSError:
            # Filesystems without hard links: an atomic rename (identical content anyway).
            try:
                if os.path.exists(final):
                    return False
                os.replace(tmp, final)
                return True
            finally:
                _unlink(tmp)
        _unlink(tmp)
        _remember(final, _stamp(os.stat(final)))  # its bytes are those just hashed
        return True

    def _ingest(self, src: str, expect: str | None) -> tuple[str, int, bool]:
        with open(src, "rb") as f:
            st = os.fstat(f.fileno())
            size, mode = st.st_size, _BLOB_MODE | (st.st_mode & 0o100)
            if size < _BIG:
                data = f.read()
                digest = blake3.blake3(data).hexdigest()
                _check(src, digest, expect)
                if self.has(digest):
                    return digest, len(data), False
                return digest, len(data), self._write(data, digest, mode)
            fd, tmp = self._temp(None)
            try:
                with open(fd, "wb", closefd=True) as out:
                    _copy(f, out)
                    os.fchmod(out.fileno(), mode)
                    size = os.fstat(out.fileno()).st_size
                digest = _hash_big(tmp)  # the bytes that were copied, not the source's
                _check(src, digest, expect)
            except BaseException:
                _unlink(tmp)
                raise
        if self.has(digest):
            _unlink(tmp)
            return digest, size, False
        return digest, size, self._commit(tmp, digest)


class Receiver:
    """One blob being received (see ``BlobStore.receiver``): ``write`` its pieces, then
    ``finish`` (MonkeyError when the bytes do not match the digest), or ``abort``."""

    def __init__(self, store: BlobStore, digest: str, fd: int, tmp: str) -> None:
        self.store, self.digest, self.tmp = store, digest, tmp
        self.file = open(fd, "wb", closefd=True)  # noqa: SIM115  # closed by finish or abort
        self.hasher = blake3.blake3()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        with self.store._writing():
            try:
                self.file.write(data)
            except BaseException:
                self.abort()
                raise
        self.hasher.update(data)
        self.size += len(data)

    def finish(self) -> bool:
        """Put the blob in place; True when newly stored (False: it was there already)."""
        try:
            with self.store._writing():
                os.fchmod(self.file.fileno(), _BLOB_MODE)
                self.file.close()
        except BaseException:
            self.abort()
            raise
        got = self.hasher.hexdigest()
        if got != self.digest:
            _unlink(self.tmp)
            raise MonkeyError(
                f"blob {self.digest}: the {self.size} bytes received hash to {got}; "
                "refused (the upload was damaged or the file changed while it was sent)"
            )
        return self.store._commit(self.tmp, self.digest)

    def abort(self) -> None:
        self.file.close()
        _unlink(self.tmp)


def _remember(path: str, stamp: tuple[int, int, int, int]) -> None:
    """Note that the blob at PATH, with the stat STAMP, holds the bytes of its digest."""
    if len(_verified) >= _VERIFIED_MAX:
        _verified.clear()
    _verified[path] = stamp


def _check(src: str, digest: str, expect: str | None) -> None:
    if expect is not None and digest != expect:
        raise MonkeyError(f"{src} changed while it was being stored; run the command again")


def _copy(src: Any, dst: Any) -> None:
    """Copy an open file to another, in the kernel when possible (reflinks on CoW filesystems)."""
    infd, outfd = src.fileno(), dst.fileno()
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        copied = 0
        try:
            while n := copy_range(infd, outfd, 1 << 30):
                copied += n
            return
        except OSError:
            if copied:
                raise
    import shutil

    shutil.copyfileobj(src, dst, _CHUNK)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
