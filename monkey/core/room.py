"""Room on this machine's disk for the jobs of a `local` provider: their starts wait while
MONKEY_HOME's filesystem is (nearly) full, or after a start ran out of space there, and go
on by themselves once there is room again. A job is never failed for it: the disk is not
its fault."""

from __future__ import annotations

from pathlib import Path

from monkey.models import DISK_WAIT
from monkey.store.errors import NEARLY_FULL, free_bytes

# Why the provider's jobs wait, as `info job` and `list jobs` show it.
_WAIT = DISK_WAIT + ": {path} has {free} bytes free; free some space there and they start"


class Room:
    """Whether starts under ``runs`` (the local run folders) must wait for disk."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs
        self.need = NEARLY_FULL  # free bytes a start needs there, more after one ran out
        # The reason, as of when the wait began: kept while it lasts (the bytes free move
        # with every write; the reason is recorded and logged once, not at every pass).
        self.reason: str | None = None

    def wait(self) -> str | None:
        """Why starts here wait for disk now (None: there is room)."""
        free = free_bytes(self.runs)
        if free < 0 or free >= self.need:
            self.need, self.reason = NEARLY_FULL, None
        elif self.reason is None:
            self.reason = _WAIT.format(path=self.runs, free=free)
        return self.reason

    def ran_out(self) -> str:
        """A start ran out of space here: wait until more than it had is free; the reason."""
        free = max(0, free_bytes(self.runs))
        self.need = free + NEARLY_FULL
        self.reason = _WAIT.format(path=self.runs, free=free)
        return self.reason
