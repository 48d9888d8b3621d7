"""Manifests, and storing a code snapshot: digest and store walked files, write their manifest.

Manifest format (JSON, compact separators, sorted keys, UTF-8/ASCII)::

    {"files": [[path, digest, mode, size], ...]}    # sorted by path

``path`` is POSIX and relative to the snapshot root, ``mode`` is ``st_mode & 0o777``,
``size`` is in bytes. A symlink leading out of a code snapshot is an entry of mode
``LINK_MODE`` (``S_IFLNK | 0o777``) whose blob holds the link's target; it is never
followed. :func:`load_manifest` also accepts three-element entries (size 0).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from monkey.models import MonkeyError, Record, human_size
from monkey.snapshot.blobs import BlobStore, hash_file
from monkey.snapshot.git import Folder, locate
from monkey.snapshot.walk import _RACY_NS, WalkMemo, _walk
from monkey.store.db import Store

LINK_MODE = stat.S_IFLNK | 0o777  # the mode of a manifest entry recording a symlink
# A folder past BIG bytes or files gets a progress bar (on a terminal) and a note naming its
# largest folders; past HUGE bytes it is stored only when the user says so (--yes, or asked).
_SIZE_LIMITS = {
    "MONKEY_BIG_BYTES": 100_000_000,
    "MONKEY_BIG_FILES": 10_000,
    "MONKEY_HUGE_BYTES": 2_000_000_000,
}
_MANIFEST_MAX = 1 << 30  # a file list larger than this would be a data file


class FileEntry(Record):
    """One file of a snapshot or dataset; ``path`` is POSIX and relative."""

    __slots__ = ("path", "digest", "mode", "size")

    def __init__(self, path: str, digest: str, mode: int, size: int) -> None:
        self.path = path
        self.digest = digest
        self.mode = mode
        self.size = size


class Snapshot(Record):
    """A stored code snapshot: ``digest`` names its manifest blob."""

    __slots__ = ("digest", "files", "new_blobs", "size")

    def __init__(
        self, digest: str, files: list[FileEntry], new_blobs: list[tuple[str, int]], size: int
    ) -> None:
        self.digest = digest
        self.files = files
        self.new_blobs = new_blobs  # (digest, size) written by this call; record with add_blobs
        self.size = size  # total bytes of the files


class Dataset(Record):
    """A stored dataset (one file, or a folder's files): ``digest`` names its manifest blob."""

    __slots__ = ("name", "digest", "single", "files", "new_blobs", "size")

    def __init__(
        self,
        name: str,
        digest: str,
        single: bool,
        files: list[FileEntry],
        new_blobs: list[tuple[str, int]],
        size: int,
    ) -> None:
        self.name = name  # upper-case; exposed to jobs as MONKEY_DATASET_<NAME>
        self.digest = digest
        self.single = single  # a single file rather than a folder
        self.files = files
        self.new_blobs = new_blobs
        self.size = size


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


def needed_blobs(store: Store, blobs: BlobStore) -> set[str]:
    """Every blob an existing job needs: the digests in its records and, for each that is a
    file list (code, dataset, data folder), the digests it lists."""
    return with_listed(blobs, store.referenced_digests())


def with_listed(
    blobs: BlobStore, digests: set[str], known: dict[str, list[str]] | None = None
) -> set[str]:
    """DIGESTS and, for each that is a file list (code, dataset, data folder), the digests
    it lists; KNOWN: file list -> what it lists, filled and reused (lists never change)."""
    known = {} if known is None else known
    out = set(digests)
    for digest in digests:
        if digest not in known:
            known[digest] = _listed(blobs, digest)
        out.update(known[digest])
    return out


def _listed(blobs: BlobStore, digest: str) -> list[str]:
    try:
        with open(blobs.path(digest), "rb") as f:
            if f.read(9) != b'{"files":' or os.fstat(f.fileno()).st_size > _MANIFEST_MAX:
                return []  # not a file list (a data file, a diff)
    except (OSError, MonkeyError):
        return []
    try:
        return [f.digest for f in load_manifest(blobs, digest)]
    except (MonkeyError, ValueError, TypeError, KeyError, UnicodeDecodeError):
        return []  # not a file list


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


def _remembered(store: Store, root: str) -> str | None:
    """The WalkMemo kept for the folder ROOT, if any."""
    try:
        return store.walk_memo(root)
    except UnicodeEncodeError:
        return None


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
    found: list[tuple[str, str, os.stat_result]],
    blobs: BlobStore,
    store: Store,
    since_ns: int,
    given: Sequence[tuple[FileEntry, bytes]] = (),
    tick: Callable[[int], None] | None = None,
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


def snapshot_dir(
    workdir: Path | Folder,
    blobs: BlobStore,
    store: Store,
    ignore: Sequence[str] = (),
    replace: Mapping[str, bytes] | None = None,
    yes: bool = False,
) -> Snapshot:
    """Store every file of ``workdir`` not ignored by .gitignore or .monkeyignore files (the
    root .monkeyignore overrides all) or the gitignore-style ``ignore`` patterns (job.yml's
    ``code.ignore``); a file whose relative path is a key of ``replace`` is stored with
    that content instead of its own.

    ``.git`` is always skipped, and so is what ``monkey.log`` writes outside a job
    (``walk.MONKEY_FILES``; ``checkpoint_dir()`` ignores itself). Symlinks leading out of ``workdir`` are never followed:
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
    memo = WalkMemo(_remembered(store, root))
    found = _walk(
        root,
        ignore=True,
        follow_dirs=False,
        skip=frozenset({blobs.home}),
        extra_ignore=ignore,
        links=links,
        top=folder.top,
        memo=memo,
    )
    if memo.changed:
        with suppress(UnicodeEncodeError):  # a folder's name SQLite cannot hold
            store.keep_walk_memo(root, memo.dumps())
    given = [
        (FileEntry(rel, "", LINK_MODE, len(os.fsencode(target))), os.fsencode(target))
        for rel, target in links
    ]
    if replace:
        given += [
            (FileEntry(rel, "", st.st_mode & 0o777, len(replace[rel])), replace[rel])
            for rel, _, st in found
            if rel in replace
        ]
        found = [f for f in found if f[0] not in replace]
    with _size_check(found, "working folder", root, yes) as tick:
        files, new, digest, size = _store_files(found, blobs, store, since, given, tick)
    if links:
        import logging

        shown = ", ".join(f"{rel} -> {target}" for rel, target in sorted(links)[:3])
        logging.getLogger("monkey").warning(
            "monkey: note: %d symlink(s) leave the project and were recorded as links: %s%s",
            len(links),
            shown,
            f" and {len(links) - 3} more" if len(links) > 3 else "",
        )
    return Snapshot(digest=digest, files=files, new_blobs=new, size=size)


def _size_limit(name: str) -> int:
    try:
        return int(os.environ.get(name, _SIZE_LIMITS[name]))
    except ValueError:
        raise MonkeyError(f"{name} must be a whole number, got {os.environ[name]!r}") from None


@contextmanager
def _size_check(
    found: list[tuple[str, str, os.stat_result]], what: str, root: str, yes: bool
) -> Iterator[Callable[[int], None] | None]:
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
    how = (
        f"leave them out with .monkeyignore (e.g. {largest[0][0]}) or ship data with --dataset"
        if what != "dataset"
        else "pass a smaller folder"
    )
    amount = f"{human_size(total)} in {len(found):,} files"
    logging.getLogger("monkey").warning(
        "monkey: note: the %s %s holds %s; largest: %s; %s", what, root, amount, named, how
    )
    terminal = sys.stdin.isatty() and sys.stderr.isatty()
    if total > _size_limit("MONKEY_HUGE_BYTES") and not yes:
        if not terminal:
            raise MonkeyError(
                f"the {what} {root} holds {amount}; {how}, or pass --yes to store it all"
            )
        sys.stderr.write(f"Store all {human_size(total)} of {root}? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise MonkeyError(f"not stored: the {what} {root} holds {amount}; {how}")
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(f"storing {what}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)
        yield lambda size: bar.advance(task, size)
