"""Content-addressed code snapshots, dataset digests and git provenance.

Every file is stored once as a read-only blob named by its blake3 digest at
``blobs/D[:2]/D[2:]`` (the worker agent reads this layout). A snapshot or dataset is a
manifest blob listing its files; the manifest's digest names the snapshot.

Manifest format (JSON, compact separators, sorted keys, UTF-8/ASCII)::

    {"files": [[path, digest, mode, size], ...]}    # sorted by path

``path`` is POSIX and relative to the snapshot root, ``mode`` is ``st_mode & 0o777``,
``size`` is in bytes. A symlink leading out of a code snapshot is an entry of mode
``LINK_MODE`` (``S_IFLNK | 0o777``) whose blob holds the link's target; it is never
followed. :func:`load_manifest` also accepts three-element entries (size 0).

Blob contents always match their digest: a file is hashed from the bytes that were
actually copied into the store, so an edit racing a snapshot can never corrupt a blob, and
an edit after a snapshot never changes what a queued job runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from monkey.models import MonkeyError, human_size
from monkey.store.db import Store
from monkey.store.errors import disk_full, is_no_space

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = [
    "BlobDamaged",
    "BlobStore",
    "Dataset",
    "FileEntry",
    "Folder",
    "LINK_MODE",
    "Snapshot",
    "dataset",
    "git_info",
    "hash_file",
    "load_manifest",
    "locate",
    "dataset_name",
    "parse_dataset_spec",
    "repository_root",
    "snapshot_dir",
]

_BIG = 1 << 20  # files at least this large are hashed via mmap on several threads
_CHUNK = 1 << 20
# The stat cache does not remember files modified this recently (the "racy git" problem):
# an edit landing in the same timestamp tick as our stat would otherwise go unnoticed.
_RACY_NS = 2_000_000_000
_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GIT_TIMEOUT = 60.0
# Blobs are read-only and private: the owner may read them (and run them, when the file
# they came from was executable), nobody else may do anything.
_BLOB_MODE = 0o400
# A blob being written: ``.tmp-<writer's pid>-<random>``, beside its final place or at the
# store's top (gc removes one whose writer is gone, see monkey.housekeeping).
TMP_PREFIX = ".tmp-"
DAMAGED = ".damaged"  # the folder of the store where `monkey verify` sets damaged blobs aside
LINK_MODE = stat.S_IFLNK | 0o777  # the mode of a manifest entry recording a symlink
_MAX_UNTRACKED = 100
# A folder past BIG bytes or files gets a progress bar (on a terminal) and a note naming its
# largest folders; past HUGE bytes it is stored only when the user says so (--yes, or asked).
_SIZE_LIMITS = {"MONKEY_BIG_BYTES": 100_000_000, "MONKEY_BIG_FILES": 10_000,
                "MONKEY_HUGE_BYTES": 2_000_000_000}


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

    def __init__(self, digest: str, root: Path, path: str | None = None, juid: str | None = None) -> None:
        self.digest, self.root, self.path, self.juid = digest, root, path, juid
        job = f"job {juid}: " if juid else ""
        what = f"{path}: " if path else ""
        super().__init__(
            f"{job}{what}blob {digest} in {root} does not match its digest (damaged on "
            "disk); `monkey verify` lists the jobs it affects and sets it aside, then submit "
            "the job again from its source")

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
            raise MonkeyError(f"{digest!r} is not a blob digest; expected 64 lowercase hex characters")
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
        if blake3.blake3(data, max_threads=blake3.blake3.AUTO if len(data) >= _BIG else 1
                         ).hexdigest() != digest:
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

    def stamped(self, blobs: Iterable[tuple[str, int]]) -> list[tuple[str, int, tuple[int, int, int] | None]]:
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
            out.append((digest, size, st[1:] if st is not None and _verified.get(path) == st else None))
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

    def unchecked(self, digests: Sequence[str], recorded: Callable[[list[str]], Mapping[
            str, tuple[int, int, int, int, int]]]) -> list[tuple[str, int]]:
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
            raise MonkeyError(f"blob {digest} is missing from {self.root}; submit the job "
                              "again from its source to store it")
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
            raise MonkeyError(f"blob {digest} is missing from {self.root}; submit the job "
                              "again from its source to store it") from None
        if hasher.hexdigest() != digest:
            _unlink(target)
            raise BlobDamaged(digest, self.root)

    @contextmanager
    def lease(self, exclusive: bool = False, waiting: str | None = None) -> Iterator[None]:
        """Hold the store's lease: shared by submitters from their first blob written or
        reused to their job rows committed; exclusive by gc while it decides and deletes.
        So gc never deletes a blob a submission counts on, and a submitter never reuses one
        gc is deleting. A flock: a process killed at any instant releases it. WAITING: what
        to call the caller in a note when it has to wait."""
        import fcntl

        try:
            os.makedirs(self._root, mode=0o700, exist_ok=True)
            fd = os.open(f"{self._root}/.lease", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if is_no_space(exc):
                raise disk_full(self.root) from None
            raise MonkeyError(f"cannot use the blob store {self.root} ({exc.strerror}); fix "
                              "its permissions") from None
        how = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting:
                    import logging

                    logging.getLogger("monkey").warning(
                        "monkey: %s waits for %s in progress to finish", waiting,
                        "submissions" if exclusive else "a gc")
                fcntl.flock(fd, how)
            yield
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
    shutil.copyfileobj(src, dst, _CHUNK)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- manifests --------------------------------------------------------------------------


@dataclass
class FileEntry:
    """One file of a snapshot or dataset; ``path`` is POSIX and relative."""

    path: str
    digest: str
    mode: int
    size: int


@dataclass
class Snapshot:
    """A stored code snapshot: ``digest`` names its manifest blob."""

    digest: str
    files: list[FileEntry]
    new_blobs: list[tuple[str, int]]  # (digest, size) written by this call; record with add_blobs
    size: int  # total bytes of the files


@dataclass
class Dataset:
    """A stored dataset (one file, or a folder's files): ``digest`` names its manifest blob."""

    name: str  # upper-case; exposed to jobs as MONKEY_DATASET_<NAME>
    digest: str
    single: bool  # a single file rather than a folder
    files: list[FileEntry]
    new_blobs: list[tuple[str, int]]
    size: int


def _manifest_bytes(files: list[FileEntry]) -> bytes:
    rows = [[f.path, f.digest, f.mode, f.size] for f in files]
    return json.dumps({"files": rows}, separators=(",", ":"), sort_keys=True).encode()


def load_manifest(blobs: BlobStore, digest: str) -> list[FileEntry]:
    """The files listed by the manifest blob ``digest`` (size 0 where a manifest omits it)."""
    data = blobs.read_bytes(digest)
    try:
        rows = json.loads(data)["files"]
        return [FileEntry(r[0], r[1], r[2], r[3] if len(r) > 3 else 0) for r in rows]
    except (ValueError, KeyError, TypeError, IndexError):
        raise MonkeyError(f"blob {digest} is not a snapshot manifest; check the digest") from None


# -- walking ----------------------------------------------------------------------------


class _Rules:
    """One ignore file's patterns, applied to paths relative to the folder holding it."""

    __slots__ = ("spec", "quick", "strip", "prefix")

    def __init__(self, spec: GitIgnoreSpec, strip: int, prefix: str) -> None:
        self.spec = spec
        self.strip = strip  # characters of the walk-relative path to drop ...
        self.prefix = prefix  # ... and what to put in front, giving the file-relative path
        self.quick = _prefilter(spec)

    def check(self, rel: str) -> bool | None:
        """True if ignored, False if re-included by a negation, None if no pattern matches."""
        path = self.prefix + rel[self.strip :] if (self.strip or self.prefix) else rel
        if self.quick is not None and self.quick.match(path) is None:
            return None
        return self.spec.check_file(path).include


_ANY_DIR = "^(?:.+/)?"


def _prefilter(spec: GitIgnoreSpec) -> re.Pattern[str] | None:
    """One regex matching whenever any pattern does, so most paths skip the per-pattern loop.

    Patterns that may match at any depth share a single ``^(?:.+/)?`` prefix, which keeps
    the backtracking to one pass per path."""
    anywhere, anchored = [], []
    for pattern in spec.patterns:
        regex = getattr(pattern, "regex", None)
        if getattr(pattern, "include", None) is None or regex is None:
            continue
        source = regex.pattern
        if not isinstance(source, str) or not source.startswith("^") or regex.flags & ~re.UNICODE:
            return None
        source = re.sub(r"\(\?P<\w+>", "(?:", source)
        if source.startswith(_ANY_DIR):
            anywhere.append(f"(?:{source[len(_ANY_DIR):]})")
        else:
            anchored.append(f"(?:{source})")
    if anywhere:
        anchored.append(f"(?:{_ANY_DIR}(?:{'|'.join(anywhere)}))")
    if not anchored:
        return re.compile(r"(?!)")
    try:
        return re.compile("|".join(anchored))
    except re.error:
        return None


# Ignore files parsed by this process: (path, strip, prefix, extra) -> (the file's size,
# mtime, ctime and inode when read, or None when missing; its rules). An entry is used
# only while the file's stat is the same, and never kept for a file changed in the racy
# window (ctime, which no tool can set back, is checked too).
_RulesKey = tuple[str, int, str, tuple[str, ...]]
_parsed: dict[_RulesKey, tuple[tuple[int, int, int, int] | None, _Rules | None]] = {}
_PARSED_MAX = 1024


def _load_rules(path: str, strip: int, prefix: str, extra: Sequence[str] = ()) -> _Rules | None:
    """The patterns of the ignore file PATH (if any) followed by EXTRA patterns."""
    try:
        st = os.stat(path)
        stamp: tuple[int, int, int, int] | None = (st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                                   st.st_ino)
    except OSError:
        if not extra:
            return None
        stamp = None
    key = (path, strip, prefix, tuple(extra))
    known = _parsed.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    text = ""
    if stamp is not None:
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "surrogateescape")
        except OSError:
            if not extra:
                return None
            stamp = None
    rules = _parse_rules(text, extra, strip, prefix)
    if stamp is None or max(stamp[1], stamp[2]) < time.time_ns() - _RACY_NS:
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[key] = (stamp, rules)
    return rules


def _parse_rules(text: str, extra: Sequence[str], strip: int, prefix: str) -> _Rules | None:
    # pathspec is imported only when there are rules: it loads asyncio (~16 ms) on import.
    from pathspec import GitIgnoreSpec

    spec = GitIgnoreSpec.from_lines([*text.splitlines(), *extra])
    if not any(getattr(p, "include", None) is not None for p in spec.patterns):
        return None
    return _Rules(spec, strip, prefix)


def _ancestor_rules(root: str, top: str | None) -> list[_Rules]:
    """.gitignore files (and .git/info/exclude) above ``root`` up to TOP, the top of its
    repository (None: outside one)."""
    if top is None:
        return []
    found: list[tuple[str, str]] = []
    rules = []
    exclude = os.path.join(top, ".git", "info", "exclude")
    rel_top = os.path.relpath(root, top).replace(os.sep, "/")
    prefix_top = "" if rel_top == "." else rel_top + "/"
    if os.path.isfile(exclude):
        found.append((exclude, prefix_top))
    here = top
    parts = [] if rel_top == "." else rel_top.split("/")
    for i in range(len(parts)):
        found.append((os.path.join(here, ".gitignore"), "/".join(parts[i:]) + "/"))
        here = os.path.join(here, parts[i])
    for path, prefix in found:
        r = _load_rules(path, 0, prefix)
        if r is not None:
            rules.append(r)
    return rules


def _ignored(chain: tuple[_Rules, ...], first: _Rules | None, rel: str) -> bool:
    if first is not None:
        verdict = first.check(rel)
        if verdict is not None:
            return verdict
    for rules in reversed(chain):  # deeper ignore files override shallower ones
        verdict = rules.check(rel)
        if verdict is not None:
            return verdict
    return False


def _matcher(chain: tuple[_Rules, ...], first: _Rules | None) -> Callable[[str], bool] | None:
    """A function telling whether a walk-relative path is ignored (None: nothing is)."""
    if first is None and not chain:
        return None
    if first is None and len(chain) == 1 and not chain[0].strip and not chain[0].prefix:
        only = chain[0]  # the common case: a single top-level .gitignore
        quick, spec = only.quick, only.spec
        if quick is not None:
            return lambda rel: quick.match(rel) is not None and spec.check_file(rel).include is True
    return lambda rel: _ignored(chain, first, rel)


def _walk(
    root: str, *, ignore: bool, follow_dirs: bool, skip: frozenset[str] = frozenset(),
    extra_ignore: Sequence[str] = (), links: list[tuple[str, str]] | None = None,
    top: str | None = None,
) -> list[tuple[str, str, os.stat_result]]:
    """Regular files under ``root`` as (relative POSIX path, absolute path, stat); folders
    whose absolute path is in ``skip`` are left out; ``extra_ignore`` patterns count as
    lines of the root .monkeyignore; with ``ignore``, the ignore files from ``top`` (the
    top of the repository holding ``root``) down apply. With a ``links`` list, symlinks
    leading out of ``root`` are not followed but appended to it as (relative path, link
    target)."""
    out: list[tuple[str, str, os.stat_result]] = []
    inside = root.rstrip("/") + "/"
    first: _Rules | None = None
    chain: tuple[_Rules, ...] = ()
    if ignore:
        first = _load_rules(os.path.join(root, ".monkeyignore"), 0, "", extra_ignore)
        chain = tuple(_ancestor_rules(root, top))
    seen: set[tuple[int, int]] = set()
    linked: list[str] = []  # symlinked folders left out of a code snapshot
    if follow_dirs:
        st = os.stat(root)
        seen.add((st.st_dev, st.st_ino))
    stack: list[tuple[str, str, tuple[_Rules, ...]]] = [(root, "", chain)]
    while stack:
        folder, prefix, chain = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise MonkeyError(
                f"cannot read folder {folder} ({exc.strerror}); fix its permissions "
                "or list it in .monkeyignore"
            ) from None
        if ignore:
            # A folder's .monkeyignore overrides its .gitignore; the root one is `first`.
            names = (".gitignore", ".monkeyignore") if prefix else (".gitignore",)
            found = {e.name: e.path for e in entries if e.name in names}
            for name in names:
                rules = _load_rules(found[name], len(prefix), "") if name in found else None
                if rules is not None:
                    chain = (*chain, rules)
        ignored = _matcher(chain, first) if ignore else None
        for entry in entries:
            name = entry.name
            if name == ".git":
                continue
            rel = prefix + name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if ignored is not None and ignored(rel + "/"):
                    continue
                if entry.path in skip:
                    continue
                if follow_dirs:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                stack.append((entry.path, rel + "/", chain))
                continue
            if ignored is not None and ignored(rel):
                continue
            if links is not None and entry.is_symlink():
                target = _outside_link(entry.path, inside)
                if target is not None:
                    if not (ignored is not None and os.path.isdir(entry.path)
                            and ignored(rel + "/")):
                        links.append((rel, target))
                    continue
            try:
                st = entry.stat()  # follows symlinks: a link to a file stores the target
            except OSError:
                continue  # broken symlink, or gone since listed
            if stat.S_ISREG(st.st_mode):
                out.append((rel, entry.path, st))
            elif follow_dirs and stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry.path, rel + "/", chain))
            elif stat.S_ISDIR(st.st_mode) and not (ignored is not None and ignored(rel + "/")):
                linked.append(rel)
            # other kinds (sockets, fifos, devices, links to folders in code) are skipped
    if linked:  # the job would miss them without a word: say so (once per run)
        import logging

        logging.getLogger("monkey").warning(
            "monkey: the job does not get symlinked folder(s) %s; pass data with --dataset "
            "PATH, or list them in .monkeyignore", ", ".join(sorted(linked)[:3])
            + (f" and {len(linked) - 3} more" if len(linked) > 3 else ""))
    return out


def _outside_link(path: str, inside: str) -> str | None:
    """The target of the symlink PATH when it resolves outside the folder INSIDE ("/"
    ended), else None (also when it cannot be read)."""
    real = os.path.realpath(path)
    if (real + "/").startswith(inside):
        return None
    try:
        return os.readlink(path)
    except OSError:
        return None


# -- storing ----------------------------------------------------------------------------


# The stat cache rows of this process's last snapshot or dataset, by absolute path: a
# snapshot of an unchanged folder asks the store only for the files it did not see. Rows
# are trusted exactly as the store's are (same size, mtime and inode, never racy).
_last_digests: dict[str, tuple[int, int, int, str]] = {}


def _cached(store: Store, keys: list[str]) -> dict[str, tuple[int, int, int, str]]:
    known = _last_digests
    out = {k: known[k] for k in keys if k in known}
    keys = [k for k in keys if k not in out]
    if keys:
        try:
            out.update(store.cached_digests(keys))
        except UnicodeEncodeError:  # undecodable file names cannot be stored in SQLite
            out.update(store.cached_digests([k for k in keys if _encodable(k)]))
    return out


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _names(exc: OSError, path: str) -> bool:
    return exc.filename is not None and os.fsdecode(exc.filename) == path


def _io_error(exc: OSError, path: str, blobs: BlobStore) -> MonkeyError:
    if _names(exc, path):
        return MonkeyError(
            f"cannot read {path} ({exc.strerror}); fix its permissions or list it in .monkeyignore"
        )
    return MonkeyError(
        f"cannot store blobs in {blobs.root} ({exc.strerror}); free disk space or fix its permissions"
    )


def _store_files(
    found: list[tuple[str, str, os.stat_result]], blobs: BlobStore, store: Store, since_ns: int,
    given: Sequence[tuple[FileEntry, bytes]] = (), tick: Callable[[int], None] | None = None,
) -> tuple[list[FileEntry], list[tuple[str, int]], str, int]:
    """Digest and store walked files and the GIVEN entries (with the content to store for
    them), write their manifest; returns (files, new, digest, size). TICK gets the bytes
    of each walked file once it is stored."""
    cached = _cached(store, [ap for _, ap, _ in found])
    racy_after = since_ns - _RACY_NS
    files: list[FileEntry] = []
    trusted: list[tuple[FileEntry, str]] = []  # digests taken from the cache, blob unchecked
    new: list[tuple[str, int]] = []
    updates: list[tuple[str, int, int, int, str]] = []
    kept: dict[str, tuple[int, int, int, str]] = {}  # the stat cache rows of these files
    for entry, data in given:
        try:
            entry.digest, fresh = blobs.put_bytes(data)
        except OSError as exc:
            raise _io_error(exc, entry.path, blobs) from None
        if fresh:
            new.append((entry.digest, len(data)))
        files.append(entry)
    for rel, ap, st in found:
        size, mtime, ino = st.st_size, st.st_mtime_ns, st.st_ino
        if tick is not None:
            tick(size)
        hit = cached.get(ap)
        if hit is not None and hit[0] == size and hit[1] == mtime and hit[2] == ino:
            entry = FileEntry(rel, hit[3], st.st_mode & 0o777, size)
            trusted.append((entry, ap))
            kept[ap] = hit
            files.append(entry)
            continue
        try:
            digest = hash_file(Path(ap))
            stable = True
            if not blobs.has(digest):
                stored, size, fresh = blobs.put_path(ap)
                stable = stored == digest  # otherwise the file changed under us
                digest = stored
                if fresh:
                    new.append((digest, size))
        except FileNotFoundError as exc:
            if _names(exc, ap):
                continue  # deleted since the walk
            raise _io_error(exc, ap, blobs) from None
        except OSError as exc:
            raise _io_error(exc, ap, blobs) from None
        if stable and mtime < racy_after:
            updates.append((ap, st.st_size, mtime, ino, digest))
            kept[ap] = (st.st_size, mtime, ino, digest)
        files.append(FileEntry(rel, digest, st.st_mode & 0o777, size))
    # A cached digest says what the file holds, not that its blob is still stored (a gc,
    # even one killed midway, or `monkey verify` setting a damaged one aside): check each.
    for entry, ap in trusted:
        if not blobs.has(entry.digest):
            try:
                entry.digest, entry.size, fresh = blobs.put_path(ap)
            except OSError as exc:
                raise _io_error(exc, ap, blobs) from None
            if fresh:
                new.append((entry.digest, entry.size))
    files.sort(key=lambda f: f.path)
    data = _manifest_bytes(files)
    digest, fresh = blobs.put_bytes(data)
    if fresh:
        new.append((digest, len(data)))
    if updates:
        try:
            store.cache_digests(updates)
        except UnicodeEncodeError:
            store.cache_digests([u for u in updates if _encodable(u[0])])
    global _last_digests
    _last_digests = kept
    return files, new, digest, sum(f.size for f in files)


def snapshot_dir(workdir: Path | Folder, blobs: BlobStore, store: Store, ignore: Sequence[str] = (),
                 replace: Mapping[str, bytes] | None = None, yes: bool = False) -> Snapshot:
    """Store every file of ``workdir`` not ignored by .gitignore or .monkeyignore files (the
    root .monkeyignore overrides all) or the gitignore-style ``ignore`` patterns (job.yml's
    ``code.ignore``); a file whose relative path is a key of ``replace`` is stored with
    that content instead of its own.

    ``.git`` is always skipped. Symlinks leading out of ``workdir`` are never followed:
    they are recorded as links (mode ``S_IFLNK | 0o777``, the blob holds the target) and
    named in a warning. Inside it, symlinks to files store their target; symlinked
    folders, broken links, sockets and fifos are skipped, and so is MONKEY_HOME (the
    folder holding ``blobs``) when it lies inside ``workdir``. Unchanged files (same
    size, mtime, inode) reuse their cached digest; only new content is copied into
    ``blobs``. A big folder is announced, and a huge one needs ``yes`` (see `_size_check`)."""
    since = time.time_ns()
    folder = workdir if isinstance(workdir, Folder) else locate(workdir)
    root = folder.path
    links: list[tuple[str, str]] = []
    found = _walk(root, ignore=True, follow_dirs=False, skip=frozenset({blobs.home}),
                  extra_ignore=ignore, links=links, top=folder.top)
    given = [(FileEntry(rel, "", LINK_MODE, len(os.fsencode(target))), os.fsencode(target))
             for rel, target in links]
    if replace:
        given += [(FileEntry(rel, "", st.st_mode & 0o777, len(replace[rel])), replace[rel])
                  for rel, _, st in found if rel in replace]
        found = [f for f in found if f[0] not in replace]
    with _size_check(found, "working folder", root, yes) as tick:
        files, new, digest, size = _store_files(found, blobs, store, since, given, tick)
    if links:
        import logging

        shown = ", ".join(f"{rel} -> {target}" for rel, target in sorted(links)[:3])
        logging.getLogger("monkey").warning(
            "monkey: note: %d symlink(s) leave the project and were recorded as links: %s%s",
            len(links), shown, f" and {len(links) - 3} more" if len(links) > 3 else "")
    return Snapshot(digest=digest, files=files, new_blobs=new, size=size)


def _size_limit(name: str) -> int:
    try:
        return int(os.environ.get(name, _SIZE_LIMITS[name]))
    except ValueError:
        raise MonkeyError(f"{name} must be a whole number, got {os.environ[name]!r}") from None


@contextmanager
def _size_check(found: list[tuple[str, str, os.stat_result]], what: str, root: str,
                yes: bool) -> Iterator[Callable[[int], None] | None]:
    """Around storing FOUND: past MONKEY_BIG_BYTES (100 MB) or MONKEY_BIG_FILES (10,000) a
    one-line note names the largest folders and how to leave them out, and a progress bar
    runs on a terminal; past MONKEY_HUGE_BYTES (2 GB) the user is asked on a terminal,
    elsewhere YES is needed, or MonkeyError before anything is stored. Yields the
    progress callback for `_store_files` (None: no bar)."""
    total = sum(st.st_size for _, _, st in found)
    if total <= _size_limit("MONKEY_BIG_BYTES") and len(found) <= _size_limit("MONKEY_BIG_FILES"):
        yield None
        return
    import logging
    import sys

    tops: dict[str, int] = {}  # top-level folders ("data/") and files ("big.bin")
    for rel, _, st in found:
        top, sep, _rest = rel.partition("/")
        tops[top + sep] = tops.get(top + sep, 0) + st.st_size
    largest = sorted(tops.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{name} {human_size(size)}" for name, size in largest)
    how = (f"leave them out with .monkeyignore (e.g. {largest[0][0]}) or ship data with --dataset"
           if what != "dataset" else "pass a smaller folder")
    amount = f"{human_size(total)} in {len(found):,} files"
    logging.getLogger("monkey").warning("monkey: note: the %s %s holds %s; largest: %s; %s",
                                        what, root, amount, named, how)
    terminal = sys.stdin.isatty() and sys.stderr.isatty()
    if total > _size_limit("MONKEY_HUGE_BYTES") and not yes:
        if not terminal:
            raise MonkeyError(f"the {what} {root} holds {amount}; {how}, or pass --yes to store it all")
        sys.stderr.write(f"Store all {human_size(total)} of {root}? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise MonkeyError(f"not stored: the {what} {root} holds {amount}; {how}")
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(f"storing {what}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda size: bar.advance(task, size)


def _existing(path: Path | str, what: str, hint: str) -> str:
    """The real path of PATH; MonkeyError saying WHAT it is and the HINT when it does not
    exist (a symlink loop does not either)."""
    resolved = os.path.realpath(os.path.expanduser(path))
    try:
        os.stat(resolved)
    except OSError:
        raise MonkeyError(f"{what} {path} does not exist; {hint}") from None
    return resolved


# -- datasets ---------------------------------------------------------------------------


def parse_dataset_spec(spec: str, base: Path | None = None) -> tuple[str, str | None]:
    """Split ``PATH[:NAME]`` into (path, upper-cased name or None).

    The split happens at the last colon only when what follows is a valid name
    (``[A-Za-z_][A-Za-z0-9_]*``), so ``a:b/c.csv`` is a path. A path that exists as written
    (colon and all) while the part before the colon does not is kept whole."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and _NAME_RE.fullmatch(tail):
        if not (os.path.lexists(_join(base, spec)) and not os.path.lexists(_join(base, head))):
            return head, tail.upper()
    return spec, None


def _join(base: Path | None, path: str) -> str:
    path = os.path.expanduser(path)
    return os.path.join(base, path) if base is not None else path


def dataset_name(path: str, is_file: bool) -> str:
    """The default dataset name: the basename (stem for a file), upper-cased, with every
    non-alphanumeric character replaced by ``_``."""
    base = os.path.basename(os.path.abspath(path))
    if is_file:
        base = Path(base).stem
    return re.sub(r"[^A-Za-z0-9]", "_", base).upper() or "DATA"


def dataset(spec: str, blobs: BlobStore, store: Store, base: Path | None = None,
            yes: bool = False) -> Dataset:
    """Store a dataset given as ``PATH[:NAME]`` (a file, or every file of a folder).

    Relative paths are taken from ``base`` (default: the current folder). A folder dataset
    takes all files recursively (``.git`` skipped, no ignore rules; symlinked folders are
    followed, each folder once). A single file's manifest entry is named by its basename.
    The digest is the manifest's, so identical data gets the same digest wherever it
    lives; blobs are stored once."""
    raw, name = parse_dataset_spec(spec, base)
    target = _join(base, raw)
    head, sep, tail = spec.rpartition(":")
    if name is None and sep and not os.path.lexists(target) and os.path.lexists(_join(base, head)):
        raise MonkeyError(f"dataset {spec}: name {tail!r} is not valid; use letters, digits "
                          f"and _, not starting with a digit, e.g. {head}:train")
    since = time.time_ns()
    root = _existing(target, "dataset", "check the path given to --dataset")
    st = os.stat(root)
    single = not stat.S_ISDIR(st.st_mode)
    if single:
        if not stat.S_ISREG(st.st_mode):
            raise MonkeyError(f"dataset {target} is not a regular file or folder; "
                              "check the path given to --dataset")
        found = [(os.path.basename(os.path.abspath(target)), root, st)]
    else:
        found = _walk(root, ignore=False, follow_dirs=True)
    with _size_check(found, "dataset", root, yes) as tick:
        files, new, digest, size = _store_files(found, blobs, store, since, tick=tick)
    return Dataset(
        name=name or dataset_name(target, single),
        digest=digest,
        single=single,
        files=files,
        new_blobs=new,
        size=size,
    )


# -- git --------------------------------------------------------------------------------


def _git_top(start: str) -> str | None:
    """The nearest folder from START (a real path) up holding a ``.git``, or None."""
    here = start
    while True:
        try:
            os.lstat(here + "/.git" if here != "/" else "/.git")
            return here
        except OSError:
            pass
        if here == "/":
            return None
        here = here[: here.rindex("/")] or "/"


@dataclass(frozen=True)
class Folder:
    """A folder's real path and the top of the git work tree holding it (None: outside
    one), found once for `repository_root`, `snapshot_dir` and `git_info`."""

    path: str
    top: str | None


def locate(folder: Path | str | None = None) -> Folder:
    """FOLDER's real path (default: the current folder's, which `os.getcwd` gives free of
    symlinks already) and git top; MonkeyError when it is not an existing folder."""
    if folder is None:
        path = os.getcwd()
    else:
        path = _existing(folder, "workdir", "pass an existing folder with --workdir")
        if not os.path.isdir(path):
            raise MonkeyError(f"workdir {folder} is not a folder; pass an existing folder with --workdir")
    return Folder(path, _git_top(path))


def repository_root(folder: Folder) -> tuple[Folder, str]:
    """(the top of the git work tree holding FOLDER, FOLDER's POSIX path relative to it);
    (FOLDER, "") outside a repository or at its top."""
    top = None if "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ else folder.top
    if top is None or top == folder.path:
        return folder, ""
    return Folder(top, top), os.path.relpath(folder.path, top).replace(os.sep, "/")


def git_info(workdir: Path | Folder, blobs: BlobStore,
             exclude: Sequence[str] = ()) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """Git provenance of ``workdir``, and the blobs newly stored for it.

    Inside a work tree: ``{"commit", "branch", "dirty", "diff", "root", "untracked"}`` where
    ``dirty`` means tracked files differ from HEAD, ``diff`` is the digest of a blob holding
    ``git diff HEAD --binary`` (None when clean or without commits; the absolute paths
    ``exclude`` are left out of it, e.g. a job.yml holding secrets) and ``untracked`` lists
    up to 100 untracked, non-ignored paths (relative to ``root``; folders end in ``/``).
    ``({}, [])`` outside a repository or without git. Never raises on git problems; runs
    two git processes concurrently (three when GIT_DIR/GIT_WORK_TREE are set), none
    outside a repository."""
    if isinstance(workdir, Folder):
        wd, top = workdir.path, workdir.top
    else:
        wd = os.path.realpath(workdir)
        top = _git_top(wd)
    custom = "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ
    if custom:
        top = None
    if top is None and not custom:
        return {}, []
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    base = ["git", "-C", wd]
    commands = [
        [*base, "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=normal",
         "--no-renames"],
        [*base, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
         "--src-prefix=a/", "--dst-prefix=b/"],
    ]
    # Paths outside the work tree make git fail: then there is no diff, never a leak.
    left_out = [p for p in exclude if top is None or (p + "/").startswith(top.rstrip("/") + "/")]
    if left_out:
        commands[1] += ["--", *(f":(exclude,literal){p}" for p in left_out)]
    if top is None:
        commands.append([*base, "rev-parse", "--show-toplevel"])
    outputs = _run_all(commands, env)
    if outputs is None or outputs[0] is None:
        return {}, []
    if top is None:
        if outputs[2] is None:
            return {}, []
        top = os.fsdecode(outputs[2].strip())
    info: dict[str, Any] = {"commit": None, "branch": None, "dirty": False, "diff": None,
                            "root": top, "untracked": []}
    fields = outputs[0].split(b"\0")
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if field.startswith(b"# branch.oid "):
            oid = field[13:].decode(errors="replace")
            info["commit"] = None if oid == "(initial)" else oid
        elif field.startswith(b"# branch.head "):
            head = os.fsdecode(field[14:])
            info["branch"] = None if head == "(detached)" else head
        elif field[:2] == b"? ":
            if len(info["untracked"]) < _MAX_UNTRACKED:
                info["untracked"].append(os.fsdecode(field[2:]))
        elif field[:2] in (b"1 ", b"u "):
            info["dirty"] = True
        elif field[:2] == b"2 ":
            info["dirty"] = True
            i += 1  # a rename record is followed by its original path
    new: list[tuple[str, int]] = []
    diff = outputs[1]
    if info["commit"] and diff:
        try:
            digest, fresh = blobs.put_bytes(diff)
        except OSError:
            digest, fresh = None, False
        info["diff"] = digest
        if fresh:
            new.append((digest, len(diff)))
    return info, new


def _run_all(commands: list[list[str]], env: dict[str, str]) -> list[bytes | None] | None:
    """Run commands concurrently; each one's stdout, or None where it failed."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in commands:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, env=env))
    except OSError:  # git is not installed
        for proc in procs:
            proc.kill()
            proc.wait()
        return None
    deadline = time.monotonic() + _GIT_TIMEOUT
    outputs: list[bytes | None] = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out = None
        outputs.append(out if proc.returncode == 0 else None)
    return outputs
