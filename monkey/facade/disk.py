"""The disk half of the ``Monkey`` facade: ``rm``, ``gc``, ``du`` and ``verify`` over
MONKEY_HOME (see ``monkey.housekeeping``), each returning plain data that the shell prints,
so a command gives the same through a remote (the server's disk) as here."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.host_cleanup import HostsReport
    from monkey.housekeeping import Facade
    from monkey.models import Job


class Disk:
    """MONKEY_HOME's disk, through the facade M (its store, home and core: a ``Monkey``)."""

    def __init__(self, m: Facade) -> None:
        self._m = m

    def rm_select(
        self,
        refs: list[str] | None = None,
        sweep: str | None = None,
        older_than: str | None = None,
        failed: bool = False,
        owner: str | None = None,
    ) -> list[Job]:
        """The jobs `monkey rm` would delete: named by REFS, in SWEEP, ended longer than
        OLDER_THAN ago and/or failed (the filters narrow each other); with no REFS, only
        OWNER's when given (a user of a shared main node)."""
        from monkey.housekeeping import select_jobs

        jobs = select_jobs(self._m, refs or [], sweep, older_than, failed)
        if owner is None or refs:
            return jobs
        owners = self._m.store.job_owners([j.juid for j in jobs])
        return [j for j in jobs if owners.get(j.juid) == owner]

    def rm(self, refs: list[str]) -> dict[str, Any]:
        """Delete the ended jobs REFS with their logs, metrics and files (a job not ended is
        refused and nothing is deleted); then ask the core to delete their folders on SSH
        hosts and in buckets: {"jobs", "freed" (bytes), "hosts" (what each host freed)}."""
        from monkey.housekeeping import remove_jobs

        store = self._m.store
        jobs = [j for j in (store.get_job(store.resolve(r)) for r in dict.fromkeys(refs)) if j]
        since = time.time()
        count, freed = remove_jobs(self._m, jobs)
        juids = {j.juid for j in jobs}
        hosts = sorted({c["instance"] for c in store.host_chores() if c["job"] in juids})
        return {"jobs": count, "freed": freed, "hosts": self._ask(hosts, since)}

    def gc(self, grace: float = 3600.0, image_keep: float = 7 * 86400.0) -> dict[str, Any]:
        """Free what no job needs (see ``housekeeping.gc``; GRACE: seconds a blob is kept;
        IMAGE_KEEP: seconds an image no job used stays on this machine's worker), then on
        SSH hosts, in buckets and clusters' cache claims: the report's fields, "total" and "hosts"."""
        from dataclasses import asdict

        from monkey import housekeeping
        from monkey.drivers import BUCKET_FILES, HOST_FOLDERS, cache_claims

        report = housekeeping.gc(self._m, grace, image_keep)
        since = time.time()
        caches = cache_claims(self._m.home)
        hosts = self._m.store.owe_hosts("gc", grace, HOST_FOLDERS, BUCKET_FILES, caches)
        return {**asdict(report), "total": report.total, "hosts": self._ask(hosts, since)}

    def du(self) -> dict[str, Any]:
        """Disk used by MONKEY_HOME: {"home": its path, "parts": part -> bytes, files...,
        "users": on a main node, the bytes of blobs each user holds and their storage
        quota (see ``monkey.facade.storage.storage_rows``)}."""
        from monkey.facade.storage import storage_rows
        from monkey.housekeeping import usage

        return {
            "home": str(self._m.home.root),
            "parts": usage(self._m),
            "users": storage_rows(self._m.store, self._m._blobs()),
        }

    def du_hosts(self) -> dict[str, Any]:
        """What each SSH host (and cluster's cache claim) holds, measured now where reached: {"hosts": ids, "known":
        host -> its last measure, "asked": what the hosts asked reported}."""
        from monkey.drivers import BUCKET_FILES, HOST_FOLDERS, cache_claims

        since = time.time()
        caches = cache_claims(self._m.home)
        hosts = self._m.store.owe_hosts("du", None, HOST_FOLDERS, BUCKET_FILES, caches)
        asked = self._ask(hosts, since)
        return {"hosts": hosts, "known": self._m.store.host_usage(), "asked": asked}

    def verify(self, refs: list[str] | None = None) -> dict[str, Any]:
        """Check the blobs of REFS (default: every job) against their digests, setting
        damaged ones aside (see ``housekeeping.verify``): the report's fields."""
        from dataclasses import asdict

        from monkey.housekeeping import verify

        return asdict(verify(self._m, refs or []))

    def _ask(self, hosts: list[str], since: float) -> dict[str, Any]:
        from dataclasses import asdict

        from monkey.host_cleanup import ask

        return asdict(ask(self._m, hosts, since))


def hosts_report(data: dict[str, Any]) -> HostsReport:
    """The ``HostsReport`` a facade's DATA (as ``Disk`` returns it) holds."""
    from monkey.host_cleanup import HostsReport

    return HostsReport(**data)
