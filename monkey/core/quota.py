"""Quotas in a dispatch pass: whether starting a job would take its owner over a limit
(concurrent jobs, GPUs, estimated $/hour) on one provider, and the reason it waits if so;
and each owner's fair-share weight there."""

from __future__ import annotations

from monkey.models import Job
from monkey.store.cost import dollars
from monkey.store.quotas import limits_for, share_for

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_NONE = (0, 0, 0.0, 0)  # an owner's use with nothing live: [jobs, GPUs, $/hour, slots]


def usd(value: float) -> str:
    """A $/hour figure of a quota: as ``dollars`` shows money ($0.0084 under a dollar), none
    as $0.00."""
    return dollars(value) if value else "$0.00"


def who(owner: str | None) -> str:
    return owner if owner is not None else "jobs with no owner"


class QuotaPass:
    """One provider's quotas and each owner's use of it, counted on as jobs start."""

    def __init__(
        self,
        quotas: list[dict[str, Any]],
        use: dict[tuple[str | None, str], list[float]],
        provider: str,
    ) -> None:
        self.quotas, self.provider = quotas, provider
        self.use = {o: list(u) for (o, p), u in use.items() if p == provider}
        self._limits: dict[str | None, dict[str, float]] = {}
        self.held_owners: set[str | None] = set()  # at their jobs quota: none of theirs starts

    def limits(self, owner: str | None) -> dict[str, float]:
        if owner not in self._limits:
            self._limits[owner] = limits_for(self.quotas, owner, self.provider)
        return self._limits[owner]

    def share(self, owner: str | None) -> float:
        """OWNER's fair-share weight here (1 unless an entry sets it)."""
        return share_for(self.quotas, owner, self.provider)

    def spend_limited(self, owner: str | None) -> bool:
        return "spend" in self.limits(owner)

    def full(self, owner: str | None) -> str | None:
        """Why OWNER may start no job at all here now (its jobs quota is reached), or None."""
        limit = self.limits(owner).get("jobs")
        n = self.use.get(owner, _NONE)[0]
        if limit is not None and n + 1 > limit:
            return (
                f"over quota: {who(owner)} runs {int(n)} of {int(limit)} "
                f"job{'s' if limit != 1 else ''} on {self.provider}"
            )
        return None

    def over(self, owner: str | None, job: Job, rate: float = 0.0) -> str | None:
        """Why starting JOB (at RATE $/hour) would take OWNER over a quota here, or None."""
        why = self.full(owner)
        if why:
            return why
        limits = self.limits(owner)
        _, gpus, spend, _ = self.use.get(owner, _NONE)
        limit = limits.get("gpus")
        if limit is not None and job.resources.gpus and gpus + job.resources.gpus > limit:
            return (
                f"over quota: {who(owner)} uses {int(gpus)} of {int(limit)} GPUs on "
                f"{self.provider}; this job asks for {job.resources.gpus}"
            )
        limit = limits.get("spend")
        if limit is not None and rate and spend + rate > limit + 1e-9:
            return (
                f"over quota: {who(owner)} spends {usd(spend)} of {usd(limit)}/h on "
                f"{self.provider}; this job adds {usd(rate)}/h"
            )
        return None

    def took(self, owner: str | None, job: Job, rate: float = 0.0) -> None:
        """Count JOB, just started at RATE $/hour, in OWNER's use."""
        u = self.use.setdefault(owner, list(_NONE))
        u[0] += 1
        u[1] += job.resources.gpus
        u[2] += rate
        u[3] += max(1, job.resources.cpus)
