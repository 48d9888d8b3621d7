"""One Monkey facade shared by the dashboard's worker threads, one call at a time."""

from __future__ import annotations

import os
import threading

from monkey.api import Home, Monkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class SharedMonkey:
    """Serialises calls into one Monkey (its SQLite connection is not for concurrent use)."""

    def __init__(self, home: str | os.PathLike[str] | Home | None = None) -> None:
        self.monkey = Monkey(home)
        self.home = self.monkey.home
        self._lock = threading.Lock()

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``Monkey.<method>(*args, **kwargs)`` while holding the lock."""
        with self._lock:
            return getattr(self.monkey, method)(*args, **kwargs)

    def get(self, name: str) -> Any:
        """Read ``Monkey.<name>`` (a property such as `providers`) while holding the lock."""
        with self._lock:
            return getattr(self.monkey, name)

    def fresh(self) -> Monkey:
        """A Monkey of its own, for a worker that runs for long (a log follower)."""
        return Monkey(self.home)
