"""What a job's record holds beyond ``Monkey.get_job``, the owners of a sweep, the users of
a main node and what they upload: for Monkey Web's pages and the server's own calls
(monkey.server), which go through the facade and never open the store themselves. Each
job or sweep is named as everywhere (an id, a unique prefix, `last`)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from monkey.models import Attempt
    from monkey.snapshot.blobs import BlobStore
    from monkey.store import Store
    from monkey.store.blobs import BlobRow
    from monkey.tracking.series import SeriesCache


class Records:
    """Reads of one MONKEY_HOME's store (see the module)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def job_spec(self, ref: str) -> dict[str, Any] | None:
        """Job REF's job.yml as gathered at submission (None: it had none)."""
        return self.store.job_spec(self.store.resolve(ref))

    def job_outputs(self, ref: str) -> list[str]:
        """The globs of job REF's `run --outputs`."""
        return self.store.outputs(self.store.resolve(ref))

    def job_packages(self, ref: str) -> str | None:
        """The digest of the packages listing job REF was submitted with."""
        return self.store.job_packages(self.store.resolve(ref))

    def attempts(self, ref: str) -> list[Attempt]:
        """Job REF's attempts, first first."""
        return self.store.attempts(self.store.resolve(ref))

    def carries_secrets(self, ref: str) -> bool:
        """Whether job REF was given secret `--env` values (their owner alone may reuse them)."""
        return self.store.secrets_ref(self.store.resolve(ref)) is not None

    def runtimes(self, juids: Sequence[str], now: float) -> dict[str, float]:
        """juid -> seconds its attempts ran until NOW, for the jobs of JUIDS (full ids)."""
        return self.store.runtimes(juids, now)

    def last_job_change(self) -> tuple[float, int]:
        """(the latest change of any job, how many jobs): moves when a job is added,
        changes state or is removed."""
        return self.store.last_job_change()

    def metric_series(
        self,
        ref: str,
        cache: SeriesCache,
        width: int = 1000,
        by: str = "step",
        window: tuple[float, float] | None = None,
        since: int | None = None,
        names: list[str] | None = None,
    ) -> dict[str, Any]:
        """Job REF's metric series as its charts draw them, through CACHE (a
        ``monkey.tracking.series.SeriesCache`` its caller keeps): see
        ``monkey.tracking.series.job_series``."""
        from monkey.tracking.series import job_series

        juid = self.store.resolve(ref)
        return job_series(self.store, cache, juid, width, by, window, since, names)

    def sweep_id(self, ref: str) -> str:
        """The id of sweep REF (an id, its name, a unique prefix, `last`)."""
        return self.store.resolve_sweep(ref)

    def jobs_table(
        self, where: dict[str, Any], *, now: float, stats: bool, **page: Any
    ) -> dict[str, Any]:
        """A page of the jobs list as Monkey Web shows it: the jobs WHERE selects (state,
        provider, owner, sweep id, name, juids, tag), PAGE (before, limit, sort, descending,
        offset: as ``Store.job_page``), with what each row shows: {"jobs", "total",
        "runtimes", "owners", "tags", "metrics" (latest values), "sweeps" (id -> record),
        "stats" (each metric's last, min and max, when STATS), "users"}."""
        store = self.store
        with store.reading():  # one state of the store for the page and its counts
            jobs = store.job_page(**where, now=now, **page)
            ids = [j.juid for j in jobs]
            return {
                "jobs": jobs,
                "total": store.count_page(**where),
                "runtimes": store.runtimes(ids, now),
                "owners": store.job_owners(ids),
                "tags": store.tags_of("job", ids),
                "metrics": store.latest_metric_values(ids),
                "sweeps": {s: store.get_sweep(s) for s in {j.sweep for j in jobs if j.sweep}},
                "stats": store.metric_stats(ids) if stats else {},
                "users": store.count_users(),
            }

    def sweep_jobs(self, ref: str) -> tuple[str, list[str]]:
        """(sweep REF's id, the ids of its jobs)."""
        sid = self.store.resolve_sweep(ref)
        return sid, [j.juid for j in self.store.list_jobs(sweep=sid, newest_first=False)]

    def sweep_owners(self, ref: str) -> tuple[str, set[str | None]]:
        """(sweep REF's id, who submitted its jobs: None where not recorded)."""
        sid = self.store.resolve_sweep(ref)
        return sid, self.store.sweep_owners(sid)

    def users(self) -> list[dict[str, Any]]:
        """The users of this main node (name, digest, admin, created_at, last_used)."""
        return self.store.users()

    def user(self, name: str) -> dict[str, Any] | None:
        """User NAME of this main node, or None."""
        return next((u for u in self.store.users() if u["name"] == name), None)

    def touch_user(self, name: str, now: float) -> None:
        """Record that user NAME's token was used at NOW."""
        self.store.touch_user(name, now)

    def record_uploads(self, user: str, stamped: Sequence[BlobRow], now: float) -> None:
        """Blobs USER uploaded (``BlobStore.stamped`` pieces), counted as theirs from NOW."""
        self.store.add_blobs(stamped)
        self.store.record_uploads(user, [s[0] for s in stamped], now)

    def storage_room(self, user: str, blobs: BlobStore) -> tuple[int, int] | None:
        """(bytes USER holds in BLOBS, their storage quota), or None when they have none."""
        from monkey.facade.storage import held
        from monkey.store.quotas import storage_limit

        limit = storage_limit(self.store.quotas(), user)
        if limit is None:
            return None
        return held(self.store, blobs, user).get(user, 0), limit

    def user_count(self) -> int:
        """How many users this main node has."""
        return self.store.count_users()
