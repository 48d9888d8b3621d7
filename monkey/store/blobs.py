"""Store queries of blobs and the stat cache: which blobs are stored (with the stamps of
those a process hashed) and the known digests of files by path."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# A blob to record: (digest, size), or (digest, size, stamp) where the stamp is the stat
# (mtime_ns, ctime_ns, ino) of a blob whose bytes the recording process hashed, or None.
BlobRow = tuple[str, int] | tuple[str, int, "tuple[int, int, int] | None"]


class BlobRecords:
    """Mixin of Store: the rows of ``blobs``, ``stat_cache`` and ``walk_memo``."""

    db: sqlite3.Connection

    tx: Any  # Store.tx

    @staticmethod
    def _add_blobs(db: sqlite3.Connection, blobs: Iterable[BlobRow], now: float) -> None:
        """Record BLOBS: (digest, size) or (digest, size, stamp), a stamp being the stat
        (mtime_ns, ctime_ns, ino) of a blob whose bytes this process hashed (or None)."""
        rows = [
            (
                b[0],
                b[1],
                now,
                *(b[2] if len(b) > 2 and b[2] else (None, None, None)),
                int(now * 1e9),
            )
            for b in blobs
        ]
        db.executemany(
            "INSERT INTO blobs(digest, size, created_at, mtime_ns, ctime_ns, ino, checked_ns) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(digest) DO UPDATE SET "
            "mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, ino = excluded.ino, "
            "checked_ns = excluded.checked_ns WHERE excluded.ino IS NOT NULL",
            rows,
        )

    def add_blobs(self, blobs: Iterable[BlobRow]) -> None:
        """Record BLOBS (see `_add_blobs`)."""
        with self.tx() as db:
            self._add_blobs(db, blobs, time.time())

    def record_uploads(self, user: str, digests: Iterable[str], at: float) -> None:
        """USER uploaded DIGESTS (stored now) at AT: they count against USER's storage for
        the gc grace (see ``monkey.facade.storage``)."""
        with self.tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO blob_uploads(user, digest, at) VALUES (?, ?, ?)",
                [(user, d, at) for d in digests],
            )

    def uploads_since(self, since: float, user: str | None = None) -> dict[str, set[str]]:
        """user -> the digests they uploaded since SINCE (USER's only when given)."""
        sql = "SELECT user, digest FROM blob_uploads WHERE at >= ?"
        args: tuple[float | str, ...] = (since,)
        if user is not None:
            sql, args = sql + " AND user = ?", (since, user)
        found: dict[str, set[str]] = {}
        for who, digest in self.db.execute(sql, args):
            found.setdefault(who, set()).add(digest)
        return found

    def forget_uploads(self, before: float) -> None:
        """Forget the uploads made before BEFORE (past the gc grace: only jobs hold them)."""
        with self.tx() as db:
            db.execute("DELETE FROM blob_uploads WHERE at < ?", (before,))

    def blob_sizes(self, digests: Iterable[str]) -> dict[str, int]:
        """digest -> size of those of DIGESTS that are stored."""
        return dict(
            self.db.execute(
                "SELECT digest, size FROM blobs WHERE digest IN (SELECT value FROM json_each(?))",
                (json.dumps(sorted(set(digests))),),
            ).fetchall()
        )

    def blob_stamps(self, digests: Sequence[str]) -> dict[str, tuple[int, int, int, int, int]]:
        """The recorded stamps of DIGESTS that have one: digest -> (size, mtime_ns, ctime_ns,
        ino, checked_ns), checked_ns being when it was recorded."""
        out: dict[str, tuple[int, int, int, int, int]] = {}
        for start in range(0, len(digests), 500):
            chunk = digests[start : start + 500]
            for d, *stamp in self.db.execute(
                "SELECT digest, size, mtime_ns, ctime_ns, ino, checked_ns FROM blobs "
                f"WHERE ino IS NOT NULL AND digest IN ({', '.join('?' * len(chunk))})",
                chunk,
            ):
                out[d] = tuple(stamp)
        return out

    def blob_count(self) -> tuple[int, int]:
        """Number of blobs and their total size."""
        count, size = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blobs"
        ).fetchone()
        return count, size

    def cached_digests(self, paths: list[str]) -> dict[str, tuple[int, int, int, str]]:
        """Known (size, mtime_ns, ino, digest) of files, by absolute path."""
        out: dict[str, tuple[int, int, int, str]] = {}
        for start in range(0, len(paths), 500):
            chunk = paths[start : start + 500]
            rows = self.db.execute(
                "SELECT path, size, mtime_ns, ino, digest FROM stat_cache "
                f"WHERE path IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            for path, size, mtime_ns, ino, digest in rows:
                out[path] = (size, mtime_ns, ino, digest)
        return out

    def cache_digests(self, entries: Iterable[tuple[str, int, int, int, str]]) -> None:
        entries = list(entries)
        if not entries:
            return
        with self.tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO stat_cache(path, size, mtime_ns, ino, digest) "
                "VALUES (?, ?, ?, ?, ?)",
                entries,
            )

    def walk_memo(self, root: str) -> str | None:
        """What the ignore files under the folder ROOT decided last time (WalkMemo's JSON)."""
        row = self.db.execute("SELECT memo FROM walk_memo WHERE root = ?", (root,)).fetchone()
        return row[0] if row else None

    def keep_walk_memo(self, root: str, memo: str) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO walk_memo(root, memo) VALUES (?, ?)", (root, memo))

    def cached_paths(self) -> tuple[list[str], list[str]]:
        """The files the stat cache knows and the folders a walk memo is kept for."""
        files = [r[0] for r in self.db.execute("SELECT path FROM stat_cache")]
        return files, [r[0] for r in self.db.execute("SELECT root FROM walk_memo")]

    def forget_paths(self, files: Sequence[str], roots: Sequence[str]) -> None:
        """Remove the stat cache rows of FILES and the walk memos of the folders ROOTS (gone
        from the disk: nothing will be snapshotted there again)."""
        with self.tx() as db:
            db.execute(
                "DELETE FROM stat_cache WHERE path IN (SELECT value FROM json_each(?))",
                (json.dumps(list(files)),),
            )
            db.execute(
                "DELETE FROM walk_memo WHERE root IN (SELECT value FROM json_each(?))",
                (json.dumps(list(roots)),),
            )

    def forget_file_digests(self, digests: Iterable[str]) -> None:
        """Remove the stat cache rows giving one of DIGESTS (their blobs are gone from a
        cache): the next snapshot reads those files again."""
        with self.tx() as db:
            db.execute(
                "DELETE FROM stat_cache WHERE digest IN (SELECT value FROM json_each(?))",
                (json.dumps(sorted(set(digests))),),
            )
