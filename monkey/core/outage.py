"""The core while the store cannot be written (a full disk, a lock held too long): it waits
with back-off and retries, says why once in daemon.log and in a status file that
`monkey daemon status` reads; and why a job that ran out of space failed."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from monkey.client_agent import rundir
from monkey.store.errors import NEARLY_FULL, DiskFull, StoreUnavailable, free_bytes

log = logging.getLogger("monkey.core")

FIRST_DELAY, MAX_DELAY = 0.5, 5.0
# The status file keeps this size for good: on a full disk, rewriting allocated bytes in
# place works where creating or growing a file does not.
STATUS_SIZE = 1024
_NO_SPACE = (b"No space left on device", b"Disk quota exceeded")


class Outage:
    """Back-off and reporting of the core's failed writes; ``path`` is the status file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.since: float | None = None
        self.delay = FIRST_DELAY
        self.notes: dict[Path, str] = {}
        self._record("")

    def wait(self, exc: StoreUnavailable, stopping: Callable[[], bool]) -> None:
        """Record why the store cannot be written and sleep the back-off (less if stopping)."""
        if self.since is None:
            self.since = time.monotonic()
            self.delay = FIRST_DELAY
            log.error("cannot write the store, retrying until it works: %s", exc)
        else:
            self.delay = min(MAX_DELAY, self.delay * 2)
        self._record(f"cannot write: {exc}")
        deadline = time.monotonic() + self.delay
        # A full disk is watched rather than written to again and again: the retry, and
        # the complaints of every part it wakes, wait until there is room.
        while not stopping() and (time.monotonic() < deadline or _still_full(exc)):
            time.sleep(0.1)

    def over(self) -> None:
        """A pass of the loop went through: the outage, if any, has ended."""
        if self.since is None:
            return
        log.info(
            "the store is writable again after %.0fs; carrying on", time.monotonic() - self.since
        )
        self.since = None
        self._record("")

    def job_note(self, run_dir: Path) -> str:
        """The note "; disk full ..." for a failed job whose folder is on a (nearly) full disk
        or whose stderr ends by saying so; else "". A note found is kept: after an outage
        the exit is handled again, maybe once space is freed."""
        note = self.notes.get(run_dir)
        if note is None:
            note = _no_space_note(run_dir)
            if note:
                if len(self.notes) >= 1000:
                    self.notes.clear()
                self.notes[run_dir] = note
        return note

    def close(self) -> None:
        os.close(self.fd)

    def _record(self, text: str) -> None:
        data = text.encode()[:STATUS_SIZE].ljust(STATUS_SIZE)
        try:
            os.pwrite(self.fd, data, 0)
        except OSError as exc:  # the status is a courtesy; the core goes on without it
            log.error("cannot write %s: %s", self.path, exc)


def _still_full(exc: StoreUnavailable) -> bool:
    return isinstance(exc, DiskFull) and 0 <= free_bytes(exc.path) < NEARLY_FULL


def read_status(path: Path) -> str:
    """What the core's status file says ("" when it writes normally or never wrote one)."""
    try:
        return path.read_bytes().decode(errors="replace").strip()
    except FileNotFoundError:
        return ""


def _no_space_note(run_dir: Path) -> str:
    free = free_bytes(run_dir)
    if 0 <= free < NEARLY_FULL:
        return f"; disk full at {run_dir} ({free} bytes free)"
    try:
        with open(run_dir / rundir.STDERR, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 4096))
            tail = fh.read()
    except OSError:
        return ""
    for words in _NO_SPACE:
        if words in tail:
            return f"; disk full: its stderr says {words.decode()!r}"
    return ""
