"""A laptop's blob cache of each remote (``$XDG_CACHE_HOME/monkey/remotes/NAME``, default
``~/.cache``), bounded.

It holds the blobs of what was submitted to the remote or fetched from it, and the
digests of the files read (the stat cache of its store), so that submitting an unchanged
project reads and sends nothing but the file list. The main node keeps every blob its jobs
need: any blob here may go, at the cost of reading its file again and uploading it only if
the server lacks it.

Bounded: after each command that used it, when its blobs pass ``MONKEY_REMOTE_CACHE_MAX``
(default 5G), the least recently used are removed until they fill 80% of it (as ccache
does), with the stat cache rows naming them. A blob is used when a command writes or reads
it, or when a file list naming it is used: touching the few file lists of a submission
stands for their thousands of files.

Several commands at once: each holds the cache's lease (``BlobStore.lease``, shared) while
it writes, reads or uploads blobs; a trim takes it exclusive without waiting, so it never
removes a blob another command counts on, and when another command holds the lease, that
one trims as it ends. Each trim knows the cache's size from the folders changed since the
last one (``.sizes``), not by listing every blob.

`monkey remote remove NAME` deletes a remote's cache, `monkey remote prune [NAME]` empties
caches now (the shell's history kept there stays); both are refused while a command holds
the lease, and move what they delete aside first, so an interruption leaves no half cache."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from monkey.models import MonkeyError, parse_size
from monkey.sizes import file_size, tree_size, unlink_size
from monkey.snapshot.blobs import TMP_PREFIX, BlobStore, writer_gone
from monkey.store.errors import StoreUnavailable, is_no_space

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from monkey.store import Store

ENV = "MONKEY_REMOTE_CACHE_MAX"
DEFAULT_MAX = 5 << 30
KEEP = 0.8  # a trim leaves the blobs at this share of the limit
SHELL_HISTORY = "history"  # the monkey> shell's history through the remote, kept by prune
_SIZES = ".sizes"  # in the blob folder: {shard: [its folder's mtime_ns or None, bytes]}
# A folder's mtime recorded this close to the scan may hide a later change with the same
# timestamp (the coarsest filesystems keep 2 s); such a folder is scanned again next time.
_RACY_NS = 2_000_000_000
_LIST_HEAD = b'{"files":'  # how a file list (manifest) blob begins
_LIST_MAX = 1 << 30


class CacheBusy(MonkeyError):
    """A command uses the cache: it cannot be emptied now."""


def base_folder() -> Path:
    """The folder holding every remote's cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "monkey" / "remotes"


def cache_folder(name: str) -> Path:
    """The blob cache of remote NAME."""
    return base_folder() / name


def max_bytes() -> int:
    """The limit of each cache's blobs: MONKEY_REMOTE_CACHE_MAX, else DEFAULT_MAX."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return DEFAULT_MAX
    try:
        return parse_size(text)
    except MonkeyError:
        raise MonkeyError(
            f"{ENV}={text!r} is not a size; write e.g. {ENV}=2G or 500M (0 keeps no blob "
            "between commands)"
        ) from None


def names() -> list[str]:
    """The remotes that have a cache on this machine (removed ones' included)."""
    try:
        return sorted(e.name for e in os.scandir(base_folder()) if e.is_dir() and e.name[0] != ".")
    except OSError:
        return []


def clear_leftovers() -> None:
    """Delete what a removal cut short left (``.removed-PID-...`` of a process gone)."""
    try:
        entries = [e for e in os.scandir(base_folder()) if e.name.startswith(".removed-")]
    except OSError:
        return
    for entry in entries:
        if writer_gone(entry.name, ".removed-"):
            shutil.rmtree(entry.path, ignore_errors=True)


class Cache:
    """The blob cache of remote NAME."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.root = cache_folder(name)
        self.blobs = BlobStore(self.root / "blobs")

    def full(self) -> MonkeyError:
        """A full disk under the cache, as one line naming it and the fix."""
        return MonkeyError(
            f"the cache of remote {self.name} ({self.root}) is on a full disk; free space "
            "there, or set XDG_CACHE_HOME to a folder on a disk with room"
        )

    def unwritable(self, exc: OSError) -> MonkeyError:
        """EXC (writing in the cache) as one line naming the cache and the fix."""
        if is_no_space(exc):
            return self.full()
        return MonkeyError(
            f"the cache of remote {self.name} ({self.root}) cannot be written "
            f"({exc.strerror}); fix its permissions, or set XDG_CACHE_HOME to a writable folder"
        )

    def check(self) -> None:
        """Make the cache's folders; MonkeyError (one line) when the limit is not a size or
        the cache cannot be written, before any work."""
        from monkey.config import Home

        max_bytes()
        home = Home(self.root)
        try:
            for folder in (home.root, home.blobs, home.runs, home.secrets, home.private):
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            # opened for writing, as the lease will be: a folder may exist on a read-only disk
            os.close(os.open(self.blobs.root / ".lease", os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise self.unwritable(exc) from None

    def touch(self, digests: Iterable[str]) -> None:
        """Mark DIGESTS used now (those stored; a file list's use stands for its files)."""
        now = time.time_ns()
        for digest in digests:
            try:
                os.utime(self.blobs.path(digest), ns=(now, now))
            except OSError:
                continue

    def trim(self, store: Store) -> int:
        """When the blobs pass the limit, remove the least recently used until they fill
        KEEP of it; the bytes freed. Nothing when another command holds the lease (it trims
        as it ends)."""
        with self.blobs.lease(exclusive=True, wait=False) as held:
            if not held:
                return 0
            freed = _clear_partials(self.blobs.root)
            limit = max_bytes()
            if self.usage(save=True) <= limit:
                return freed
            return freed + self._evict(store, int(limit * KEEP))

    def usage(self, save: bool = False) -> int:
        """The bytes of the blobs (those being written in their folders included): the
        shards whose folder changed since the last count are listed again, the others taken
        from it (saved with SAVE: the caller holds the lease exclusive)."""
        root = self.blobs.root
        known = self._load_sizes()
        counted: dict[str, list[int | None]] = {}
        start = time.time_ns()
        total = 0
        try:
            entries = list(os.scandir(root))
        except OSError:
            return 0
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not entry.is_dir(follow_symlinks=False) or len(entry.name) != 2:
                continue  # the lease, this count, a big file being stored (a moment)
            seen = known.get(entry.name)
            if isinstance(seen, list) and len(seen) == 2 and seen[0] == st.st_mtime_ns:
                size = int(seen[1] or 0)
            else:
                size = tree_size(Path(entry.path))[0]
            settled = st.st_mtime_ns < start - _RACY_NS
            counted[entry.name] = [st.st_mtime_ns if settled else None, size]
            total += size
        if save and counted != known:
            self._save_sizes(counted)
        return total

    def size(self) -> int:
        """The bytes the whole cache holds on disk (its blobs and its store)."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:  # none, or unreadable
            return 0
        total = self.usage()
        for entry in entries:
            path = Path(entry.path)
            if path != self.blobs.root:
                total += (
                    tree_size(path)[0] if entry.is_dir(follow_symlinks=False) else file_size(path)
                )
        return total

    def remove(self, keep: tuple[str, ...] = ()) -> int:
        """Delete the cache when no command uses it (CacheBusy otherwise), all but the
        entries named in KEEP (e.g. SHELL_HISTORY when it is only emptied); the bytes freed."""
        if not self.root.is_dir():
            return 0
        with self.blobs.lease(exclusive=True, wait=False) as held:
            if not held:
                raise CacheBusy(
                    f"a command is using the cache of remote {self.name} (a submission or a "
                    "clone in progress); run this again once it ends"
                )
            try:  # moved aside first: gone at once, whatever stops the deletion
                aside = Path(tempfile.mkdtemp(prefix=f".removed-{os.getpid()}-", dir=base_folder()))
                if not keep:
                    os.rename(self.root, aside / self.name)
                for entry in os.scandir(self.root) if keep else ():
                    if entry.name not in keep:
                        os.rename(entry.path, aside / entry.name)
            except OSError as exc:
                raise self.unwritable(exc) from None
        if keep:
            with contextlib.suppress(OSError):  # it keeps something
                self.root.rmdir()
        freed = tree_size(aside)[0]
        shutil.rmtree(aside, ignore_errors=True)
        return freed

    # -- internals

    def _evict(self, store: Store, target: int) -> int:
        """Remove blobs, least recently used first, until TARGET bytes are left (partial
        files of writers that died first); called under the exclusive lease."""
        blobs: list[tuple[int, str, Path, int]] = []  # (used at, digest, path, size)
        total = 0
        for shard in _shards(self.blobs.root):
            for entry in os.scandir(shard):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.startswith(TMP_PREFIX):
                    if writer_gone(entry.name):
                        unlink_size(Path(entry.path))
                    continue
                total += st.st_size
                blobs.append(
                    (st.st_mtime_ns, shard.name + entry.name, Path(entry.path), st.st_size)
                )
        used = _used_at(self.blobs, blobs)
        blobs.sort(key=lambda b: used.get(b[1], b[0]))
        doomed = []
        for _at, digest, path, size in blobs:
            if total <= target:
                break
            doomed.append((digest, path))
            total -= size
        try:
            store.forget_file_digests(d for d, _ in doomed)  # the rows first, then the files
        except StoreUnavailable:
            pass  # a snapshot checks that a cached digest's blob is there before trusting it
        freed = 0
        for _digest, path in doomed:
            freed += unlink_size(path)
        return freed

    def _load_sizes(self) -> dict[str, list[int | None]]:
        try:
            data = json.loads((self.blobs.root / _SIZES).read_bytes())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_sizes(self, sizes: dict[str, list[int | None]]) -> None:
        staged = self.blobs.root / f"{_SIZES}.{os.getpid()}"
        try:
            staged.write_text(json.dumps(sizes, separators=(",", ":")))
            os.replace(staged, self.blobs.root / _SIZES)
        except OSError:  # a count to redo next time, no harm
            unlink_size(staged)


def _used_at(store: BlobStore, blobs: list[tuple[int, str, Path, int]]) -> dict[str, int]:
    """When each of BLOBS (in STORE) was last used: its own mtime, or that of a newer file
    list naming it."""
    from monkey.snapshot.manifest import load_manifest

    used: dict[str, int] = {}
    for at, digest, path, size in blobs:
        used[digest] = max(used.get(digest, 0), at)
        if not len(_LIST_HEAD) < size < _LIST_MAX:
            continue
        try:
            with open(path, "rb") as f:
                if f.read(len(_LIST_HEAD)) != _LIST_HEAD:
                    continue
        except OSError:
            continue
        try:
            listed = load_manifest(store, digest)
        except (MonkeyError, ValueError, TypeError, KeyError, UnicodeDecodeError):
            continue  # a data file that looks like one
        for entry in listed:
            if isinstance(entry.digest, str) and used.get(entry.digest, 0) < at:
                used[entry.digest] = at
    return used


def _clear_partials(root: Path) -> int:
    """Delete the big files being stored at the top of ROOT whose writer is gone; the
    bytes freed."""
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(TMP_PREFIX)]
    except OSError:
        return 0
    return sum(unlink_size(Path(e.path)) for e in entries if writer_gone(e.name))


def _shards(root: Path) -> Iterator[Path]:
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if len(entry.name) == 2 and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)
