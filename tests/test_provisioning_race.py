"""The inventory pass and a creation under way (CI-equivalent run ci81: a Slurm allocation
listed by squeue before sbatch returned was terminated as an unrecorded orphan)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from monkey.core.provisioning import Elastic
from monkey.models import Instance, InstanceState


class Store:
    """The store of a provider with no machine recorded yet."""

    def instances(self, name: str) -> list[dict[str, Any]]:
        return []


def listed_while(creating: int) -> list[str]:
    """The machines an inventory pass terminates when the cloud lists one machine the store
    has no record of, with CREATING creations of the provider under way."""
    elastic = Elastic(SimpleNamespace(store=Store()))  # type: ignore[arg-type]
    destroyed: list[str] = []
    elastic._destroy = lambda name, drv, iid, why: destroyed.append(iid)  # type: ignore[method-assign]
    elastic.creating["cluster"] = creating
    node = Instance(
        id="cluster/4",
        provider="cluster",
        name="monkey-cluster",
        state=InstanceState.PENDING,
        address=None,
        size="c1",
        spot=False,
        launched_at=time.time(),
        extra={},
        price=None,
    )
    elastic._listed("cluster", SimpleNamespace(), [node])  # type: ignore[arg-type]
    assert "cluster" in elastic.inventoried
    return destroyed


def test_a_machine_listed_while_its_creation_is_under_way_is_not_taken_for_an_orphan():
    assert listed_while(creating=1) == []


def test_an_unrecorded_machine_with_no_creation_under_way_is_terminated():
    assert listed_while(creating=0) == ["cluster/4"]
