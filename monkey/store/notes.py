"""Store queries of notes and tags on jobs and sweeps (tables ``job_notes``, ``job_tags``,
``sweep_notes``, ``sweep_tags``). The values are checked by the caller (monkey.notes)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What each kind of thing is keyed by in its tables.
_KEYS = {"job": "juid", "sweep": "sweep"}


class NotesStore:
    """Mixin of Store: the notes and tags of jobs and sweeps."""

    db: sqlite3.Connection

    tx: Any  # Store.tx

    def note_of(self, kind: str, key: str) -> dict[str, object] | None:
        """{"text", "at", "by"} of the note on job or sweep KEY (KIND), or None."""
        row = self.db.execute(
            f"SELECT note, at, by FROM {kind}_notes WHERE {_KEYS[kind]} = ?", (key,)
        ).fetchone()
        return None if row is None else {"text": row[0], "at": row[1], "by": row[2]}

    def set_note(self, kind: str, key: str, text: str | None, by: str | None) -> None:
        """Write TEXT as the note of job or sweep KEY (KIND); None removes it."""
        with self.tx() as db:
            if text is None:
                db.execute(f"DELETE FROM {kind}_notes WHERE {_KEYS[kind]} = ?", (key,))
            else:
                db.execute(
                    f"INSERT OR REPLACE INTO {kind}_notes({_KEYS[kind]}, note, at, by) "
                    "VALUES (?, ?, ?, ?)",
                    (key, text, time.time(), by),
                )

    def tags_of(self, kind: str, keys: Iterable[str]) -> dict[str, list[str]]:
        """KEY -> its tags, sorted, for the jobs or sweeps KEYS (KIND) that have any."""
        out: dict[str, list[str]] = {}
        for part in _chunks(list(keys)):
            rows = self.db.execute(
                f"SELECT {_KEYS[kind]}, tag FROM {kind}_tags WHERE {_KEYS[kind]} IN "
                f"({', '.join('?' * len(part))}) ORDER BY tag",
                part,
            )
            for key, tag in rows:
                out.setdefault(key, []).append(tag)
        return out

    def change_tags(
        self, kind: str, key: str, add: Iterable[str], remove: Iterable[str], most: int
    ) -> list[str]:
        """Add tags ADD to job or sweep KEY (KIND) and remove REMOVE, in one transaction;
        its tags now. TooManyTags (nothing changed) when it would have more than MOST."""
        column = _KEYS[kind]
        with self.tx() as db:
            db.executemany(
                f"DELETE FROM {kind}_tags WHERE {column} = ? AND tag = ?",
                [(key, t) for t in remove],
            )
            db.executemany(
                f"INSERT OR IGNORE INTO {kind}_tags({column}, tag) VALUES (?, ?)",
                [(key, t) for t in add],
            )
            tags = [
                r[0]
                for r in db.execute(
                    f"SELECT tag FROM {kind}_tags WHERE {column} = ? ORDER BY tag", (key,)
                )
            ]
            if len(tags) > most:
                raise TooManyTags(tags)
        return tags

    def forget_sweep_notes(self, db: sqlite3.Connection) -> None:
        """Inside a unit of work: remove the notes and tags of sweeps that are gone."""
        for table in ("sweep_notes", "sweep_tags"):
            db.execute(f"DELETE FROM {table} WHERE sweep NOT IN (SELECT id FROM sweeps)")


class TooManyTags(Exception):
    """A change of tags that would leave more than allowed (the transaction rolled back)."""

    def __init__(self, tags: list[str]) -> None:
        super().__init__(f"{len(tags)} tags")
        self.tags = tags


def _chunks(keys: list[str], size: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(keys), size):
        yield keys[i : i + size]
