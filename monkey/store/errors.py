"""Why the store (or a file beside it) cannot be written now: a full disk, a lock held too long.

Both are MonkeyErrors (one line for the user) and ``StoreUnavailable``: the core waits and
retries them instead of stopping.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from monkey.models import MonkeyError

# Below this many free bytes, a failed write or an SQLite I/O error means "disk full".
NEARLY_FULL = 1 << 20
_SQLITE_BUSY, _SQLITE_IOERR, _SQLITE_FULL = 5, 10, 13
_SQLITE_MESSAGES = {  # Python < 3.11 gives no error codes, only these texts
    "database is locked": _SQLITE_BUSY,
    "disk I/O error": _SQLITE_IOERR,
    "database or disk is full": _SQLITE_FULL,
}


class IllegalTransition(MonkeyError):
    """A state change the job model does not allow."""


class StoreUnavailable(MonkeyError):
    """The store cannot be written for now; the same write may succeed later."""


class DiskFull(StoreUnavailable):
    """A write failed for want of space on the filesystem holding ``path``."""

    def __init__(self, path: str | os.PathLike[str], free: int) -> None:
        super().__init__(
            f"disk full at {path} ({free} bytes free); free some space there and try again"
        )
        self.path, self.free = os.fspath(path), free


class StoreBusy(StoreUnavailable):
    """Another process held the database's write lock for longer than a writer waits."""


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an ordinary user may still write on the filesystem holding PATH (or its
    nearest existing folder); -1 when that cannot be told."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def disk_full(path: str | os.PathLike[str]) -> DiskFull:
    """The error for a write under PATH that ran out of space."""
    return DiskFull(path, max(0, free_bytes(path)))


def is_no_space(exc: OSError) -> bool:
    """Whether an OSError says the disk (or the user's quota) is full."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def sqlite_failure(exc: sqlite3.Error, path: Path) -> StoreUnavailable | None:
    """The StoreUnavailable an SQLite error of the database PATH stands for, if any.

    An I/O error counts as a full disk when the disk is (nearly) full: SQLite reports a
    shared-memory file it cannot grow that way."""
    code = getattr(exc, "sqlite_errorcode", None)
    code = _SQLITE_MESSAGES.get(str(exc)) if code is None else code & 0xFF
    if code == _SQLITE_FULL or (
        code == _SQLITE_IOERR and 0 <= free_bytes(path.parent) < NEARLY_FULL
    ):
        return disk_full(path.parent)
    if code == _SQLITE_BUSY:
        return StoreBusy(
            f"{path} stayed locked by another process for too long; try again when it is done"
        )
    return None
