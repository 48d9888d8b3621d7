"""One Monkey facade shared by the dashboard's worker threads, one call at a time: this
machine's (``monkey.api.Monkey``) or a main node's (``monkey.remote.facade.RemoteMonkey``)."""

from __future__ import annotations

import os
import threading

from monkey.api import Home, Monkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class SharedMonkey:
    """Serialises calls into one facade (a SQLite connection, or a remote's HTTPS connection,
    is not for concurrent use). ``facade``: a home (this machine) or a facade."""

    def __init__(self, facade: Any = None) -> None:  # a home, a Monkey or a RemoteMonkey
        local = facade is None or isinstance(facade, (str, os.PathLike, Home))
        self.monkey = Monkey(facade) if local else facade
        # a main node's name (Monkey() itself gives one's facade under MONKEY_REMOTE)
        self.remote: str | None = None if isinstance(self.monkey, Monkey) else self.monkey.name
        self.home = None if self.remote else self.monkey.home
        self._lock = threading.Lock()

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``Monkey.<method>(*args, **kwargs)`` while holding the lock."""
        with self._lock:
            return getattr(self.monkey, method)(*args, **kwargs)

    def get(self, name: str) -> Any:
        """Read ``Monkey.<name>`` (a property such as `providers`) while holding the lock."""
        with self._lock:
            return getattr(self.monkey, name)

    def fresh(self) -> Any:
        """A facade of its own, for a worker that runs for long (a log follower); close it
        with ``close``."""
        if self.remote:
            return type(self.monkey)(self.remote)
        return Monkey(self.home)

    @staticmethod
    def close(monkey: Any) -> None:
        """Close a facade ``fresh`` gave."""
        if isinstance(monkey, Monkey):
            monkey.store.close()
        else:
            monkey.close()
