"""Placement: pure functions that choose an instance (and GPUs) for a job, and which
owner's job goes next (fair share)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from monkey.drivers.base import Capacity
from monkey.models import Job, Resources, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@dataclass
class Usage:
    """What live attempts hold on one instance."""

    slots: int = 0
    gpus: set[str] = field(default_factory=set)
    memory: int = 0


@dataclass
class Placement:
    instance: str
    gpus: list[str]


def slots_needed(resources: Resources, capacity: Capacity) -> int:
    """Slots a job takes: its CPUs, at least one, at most the whole instance."""
    return max(1, min(resources.cpus, capacity.slots))


def memory_needed(resources: Resources) -> int:
    """Bytes the job asked for (0 when it did not say)."""
    return parse_size(resources.memory) if resources.memory else 0


def place(
    resources: Resources,
    capacities: list[Capacity],
    usage: dict[str, Usage],
    pinned: str | None = None,
) -> Placement | None:
    """The least loaded instance that has room for the job now, or None."""
    best: tuple[float, Capacity] | None = None
    memory = memory_needed(resources)
    for cap in capacities:
        if pinned and pinned not in (cap.instance, cap.instance.rsplit("/", 1)[-1]):
            continue
        used = usage.get(cap.instance, Usage())
        if used.slots + slots_needed(resources, cap) > cap.slots:
            continue
        if memory and cap.memory is not None and used.memory + memory > cap.memory:
            continue
        free_gpus = [g for g in cap.gpus if g not in used.gpus]
        if resources.gpus > len(free_gpus):
            continue
        load = used.slots / cap.slots
        if best is None or load < best[0]:
            best = (load, cap)
    if best is None:
        return None
    cap = best[1]
    used = usage.setdefault(cap.instance, Usage())
    gpus = [g for g in cap.gpus if g not in used.gpus][: resources.gpus]
    used.slots += slots_needed(resources, cap)
    used.gpus.update(gpus)
    used.memory += memory
    return Placement(cap.instance, gpus)


def fair_order(
    heads: dict[Any, Iterator[Job]],
    running: dict[Any, int],
    shares: dict[Any, float] | None = None,
) -> Iterator[Job]:
    """The jobs of several owners in the order they should get free slots. HEADS: each
    owner's ready jobs in the store's order; RUNNING: the slots each owner's jobs take now;
    SHARES: owners' weights (1 when not given). A higher priority goes first whoever owns
    it; among jobs of the same priority, the next goes to the owner taking the fewest slots
    for their share so far (counting the jobs handed out here), the oldest job on a tie: one
    owner's long queue cannot starve another's single job."""
    taken = dict(running)
    weight = shares or {}
    peeked = {o: j for o, it in heads.items() if (j := next(it, None)) is not None}
    while peeked:
        owner = min(
            peeked,
            key=lambda o: (
                -peeked[o].priority,
                taken.get(o, 0) / weight.get(o, 1.0),
                peeked[o].created_at,
            ),
        )
        job = peeked[owner]
        following = next(heads[owner], None)
        if following is None:
            del peeked[owner]
        else:
            peeked[owner] = following
        taken[owner] = taken.get(owner, 0) + max(1, job.resources.cpus)
        yield job
