"""The clean-up SSH hosts, cloud buckets and clusters' cache claims are owed: `rm` and `gc`
record it (the store's ``host_chores``), the core carries it out on each host once linked
to it, in the host's transport lane (after the starts sent there before, so a blob is never
taken from under a start), in each bucket (instance ``<provider> bucket``) and each cluster's cache claim
(``<provider> cache``: no run folders there, only blobs) in a lane of its own.

- ``run``: a deleted job's folder on the host (this home's ``runs/<tag>/<juid>``), unless a
  job of that id exists (an `rm` killed before it deleted the job's rows).
- ``gc``: blobs no job of this home needs (any job that exists, queued and live included,
  as `gc` keeps locally) nor another home's gc named, unused for the grace, and partial
  uploads.
- ``du``: a measure of what the host holds, for `du --hosts`.

A host out of reach keeps its chores until it is back; each host's usage is measured again
after its chores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from monkey.models import MonkeyError
from monkey.store.hosts import BUCKET, CACHE

if TYPE_CHECKING:
    from monkey.config import Home
    from monkey.core.provisioning import CoreView
    from monkey.drivers.base import Driver

    class ChoresCore(CoreView, Protocol):
        """What the clean-up uses of the core (``monkey.core.scheduler.Core`` is one):
        provisioning's view, its home, and its way of running a transport call."""

        home: Home

        def _transport(
            self,
            key: tuple[str, str],
            drv: Driver,
            call: Callable[[], Any],
            then: Callable[[Any], None],
            failed: Callable[[BaseException], None],
            lane: tuple[str, ...] | None = None,
            slow: bool = False,
        ) -> None: ...


log = logging.getLogger("monkey.core")
_RETRY = 10.0  # seconds before a host whose clean-up failed is tried again


class HostChores:
    """Carries out the chores the store says are owed to SSH hosts."""

    def __init__(self, core: ChoresCore) -> None:
        self.core = core
        self.busy: set[tuple[str, str]] = set()  # hosts with chores under way
        self.retry_at: dict[tuple[str, str], float] = {}  # after a failure: not before (monotonic)
        self.said: dict[tuple[str, str], str] = {}  # the last failure logged, per host

    def tick(self) -> None:
        """Hand each linked host its owed chores (one batch per host at a time)."""
        owed: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for chore in self.core.store.host_chores():
            owed.setdefault((chore["provider"], chore["instance"]), []).append(chore)
        for key, chores in owed.items():
            if key not in self.busy and time.monotonic() >= self.retry_at.get(key, 0.0):
                self._carry_out(key, chores)

    def _carry_out(self, key: tuple[str, str], chores: list[dict[str, Any]]) -> None:
        core = self.core
        if key[0] not in core.providers:  # the provider is gone, and its hosts' folders with it
            core.store.chores_done(c["id"] for c in chores)
            return
        try:
            drv = core.driver(key[0])
        except MonkeyError:
            return
        bucket, cache = key[1].endswith(BUCKET), key[1].endswith(CACHE)
        transport = drv.transport  # its hosts' clean-up: the SSH transport's
        method = "clean_bucket" if bucket else "clean_cache" if cache else "clean"
        if not callable(getattr(drv if bucket or cache else transport, method, None)):
            core.store.chores_done(c["id"] for c in chores)
            return
        if not bucket and not cache:  # an SSH host (a cache claim: through the API server)
            if key[1] not in getattr(transport, "hosts", {}):
                core.store.chores_done(c["id"] for c in chores)  # no longer configured
                return
            if key not in core.links:
                core.connect(key)  # done once linked (a host out of reach: once it is back)
                return
        existing = core.store.job_ids()
        runs = sorted({c["job"] for c in chores if c["what"] == "run" and c["job"] not in existing})
        gcs = [c for c in chores if c["what"] == "gc"]
        grace = min((c["grace"] or 0.0 for c in gcs), default=0.0)
        keep = sorted(self._needed()) if gcs else None
        ids = [c["id"] for c in chores]

        def call() -> tuple[dict[str, int] | None, dict[str, Any]]:
            if bucket:
                return drv.clean_bucket(runs, keep, grace), {}  # type: ignore[attr-defined]
            if cache:
                return drv.clean_cache(keep, grace), drv.cache_usage()  # type: ignore[attr-defined]
            freed = transport.clean(key[1], runs, keep, grace) if runs or keep is not None else None  # type: ignore[attr-defined]
            return freed, transport.host_usage(key[1])  # type: ignore[attr-defined]

        def then(result: tuple[dict[str, int] | None, dict[str, Any]]) -> None:
            self.busy.discard(key)
            self.said.pop(key, None)
            freed, usage = result
            core.store.record_host_usage(
                key[0], key[1], {**usage, "freed": freed} if freed else usage
            )
            core.store.chores_done(ids)
            if freed:
                log.info(
                    "%s: freed %d job folders (%d bytes), %d blobs (%d bytes), %d partial "
                    "uploads (%d bytes)",
                    key[1],
                    freed["runs"],
                    freed["run_bytes"],
                    freed["blobs"],
                    freed["blob_bytes"],
                    freed["partial"],
                    freed["partial_bytes"],
                )

        def failed(exc: BaseException) -> None:
            self.busy.discard(key)
            self.retry_at[key] = time.monotonic() + _RETRY
            if self.said.get(key) != str(exc):  # once per cause, not every retry
                self.said[key] = str(exc)
                log.warning("%s: clean-up postponed: %s", key[1], exc)

        self.busy.add(key)
        core._transport(key, drv, call, then, failed, slow=cache)  # (a pod to start, maybe)

    def _needed(self) -> set[str]:
        """Every blob a job of this home needs (as local `gc` keeps them)."""
        from monkey.snapshot.blobs import BlobStore
        from monkey.snapshot.manifest import needed_blobs

        return needed_blobs(self.core.store, BlobStore(self.core.home.blobs))
