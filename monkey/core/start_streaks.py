"""Providers that start nothing (issue 42 item 14).

Each start of a provider's job that comes to nothing — the instance's agent could not be
reached or started, the attempt came back never started — adds to the provider's streak; the
first job that starts there ends it. FLAG_AFTER in a row flag the provider: its jobs stay
queued, saying why (``info``, ``list jobs``, ``list providers``), and no start is tried
there until a back-off has passed (BACKOFF, doubling up to BACKOFF_MAX), instead of a try
every second or two for ever. Pure bookkeeping: the core records what it says."""

from __future__ import annotations

import time

from monkey.models import env_seconds

FLAG_AFTER = 5  # starts in a row that came to nothing before the provider is flagged
BACKOFF = env_seconds("MONKEY_START_BACKOFF", 15.0)  # the first wait once flagged
BACKOFF_MAX = 600.0


class _Streak:
    __slots__ = ("count", "flags", "retry_at")

    def __init__(self) -> None:
        self.count = 0  # starts in a row that came to nothing
        self.flags = 0  # back-offs in a row (the exponent of the next one)
        self.retry_at = 0.0  # no start before this (the monotonic clock), while flagged


class StartStreaks:
    """Per provider: the starts in a row that came to nothing, and its back-off."""

    def __init__(self) -> None:
        self._streaks: dict[str, _Streak] = {}

    def failed(self, provider: str, why: str) -> str | None:
        """Count a start of PROVIDER that came to nothing because of WHY; the reason to
        record when the provider is (again) flagged, else None."""
        now = time.monotonic()  # a step of the wall clock neither ends nor lengthens a rest
        streak = self._streaks.setdefault(provider, _Streak())
        streak.count += 1
        if streak.count < FLAG_AFTER or now < streak.retry_at:
            return None  # a start already on its way when it was flagged: counted only
        wait = min(BACKOFF_MAX, BACKOFF * 2**streak.flags)
        streak.flags += 1
        streak.retry_at = now + wait
        at = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
        return (
            f"cannot start jobs: {streak.count} starts in a row came to nothing, the last: "
            f"{why}; jobs wait; next try at {at}"
        )

    def started(self, provider: str) -> bool:
        """A job started on PROVIDER: its streak ends; whether it had been flagged."""
        streak = self._streaks.pop(provider, None)
        return streak is not None and streak.flags > 0

    def forget(self, provider: str) -> bool:
        """PROVIDER's entry changed: a fresh start, at once; whether it had been flagged."""
        return self.started(provider)

    def flagged(self, provider: str) -> bool:
        streak = self._streaks.get(provider)
        return streak is not None and streak.flags > 0

    def resting(self, provider: str) -> bool:
        """Whether PROVIDER is flagged and its back-off has not passed yet."""
        streak = self._streaks.get(provider)
        return streak is not None and time.monotonic() < streak.retry_at
