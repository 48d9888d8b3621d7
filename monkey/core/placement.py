"""Placement: pure functions that choose an instance (and GPUs) for a job."""

from __future__ import annotations

from dataclasses import dataclass, field

from monkey.drivers.base import Capacity
from monkey.models import Resources, parse_size


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
