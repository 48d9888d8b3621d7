"""Time elapsed since stored wall-clock times, measured on the monotonic clock: a step of the
wall clock (NTP, a VM resumed) fires no time-out early and holds none back."""

from __future__ import annotations

import time
from collections.abc import Hashable

from monkey.models import wall_span


class Elapsed:
    """Seconds since each stored wall time the core judges by (an instance idle since, out of
    reach since, launched at): counted on the monotonic clock from the moment this process
    first saw the stamp, plus what the wall clock said had passed by then when that is sane
    (``wall_span``; unknown counts as none)."""

    def __init__(self) -> None:
        self._first: dict[tuple[Hashable, float], float] = {}
        self._used: set[tuple[Hashable, float]] = set()

    def since(self, key: Hashable, stamp: float) -> float:
        """Seconds since STAMP, the stored wall time of KEY (a new stamp starts anew)."""
        now = time.monotonic()
        seen = (key, stamp)
        first = self._first.get(seen)
        if first is None:
            first = self._first[seen] = now - (wall_span(stamp, time.time()) or 0.0)
        self._used.add(seen)
        return now - first

    def prune(self) -> None:
        """Forget the stamps not asked about since the last prune."""
        self._first = {k: v for k, v in self._first.items() if k in self._used}
        self._used = set()
