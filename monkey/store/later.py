"""The Store's query mixins that a submission never calls, loaded on first use: `monkey run`
records a job with the queries of db.py, blobs.py and deps.py alone, and importing the
sixteen modules of the others cost it about 11 M instructions (a quarter of its own time).

``Later`` is a base of ``Store``; until a Store first looks up an attribute it lacks, its
own bases are a placeholder. That first miss imports PARTS and makes them its bases (in
this order), after which every method is found, ``super()`` and ``isinstance`` included,
exactly as if ``Store`` had named them. Type checkers see the mixins themselves (db.py).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# (module, class) of each mixin, in the order of Store's bases
PARTS = (
    ("monkey.store.queue", "QueueQueries"),
    ("monkey.store.notes", "NotesStore"),
    ("monkey.store.attempts", "AttemptStore"),
    ("monkey.store.web", "WebQueries"),
    ("monkey.store.instances", "InstanceStore"),
    ("monkey.store.dashboard", "DashboardQueries"),
    ("monkey.store.tracking", "TrackingStore"),
    ("monkey.store.jobspec", "JobSpecStore"),
    ("monkey.store.outputs", "OutputQueries"),
    ("monkey.store.rerun", "RerunStore"),
    ("monkey.store.housekeeping", "HousekeepingStore"),
    ("monkey.store.hosts", "HostChoresStore"),
    ("monkey.store.instance_requests", "InstanceRequestStore"),
    ("monkey.store.users", "UserStore"),
    ("monkey.store.quotas", "QuotaStore"),
    ("monkey.store.notify", "NotifyStore"),
)


class _Unloaded:
    """Later's base until PARTS are loaded (a class of its own: Python replaces the bases of
    a class whose bases are classes like the mixins, not ``object``)."""


class Later(_Unloaded):
    """PARTS as one base, imported when an instance first misses an attribute."""

    def __getattr__(self, name: str) -> Any:
        if Later.__bases__ == (_Unloaded,):
            load()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def load() -> None:
    """Make PARTS Later's bases (again harmless: every thread sets the same ones)."""
    import importlib

    Later.__bases__ = tuple(
        getattr(importlib.import_module(module), name) for module, name in PARTS
    )
