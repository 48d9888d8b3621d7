"""Instances in the store: compare-and-set moves with an event each, and the upgrade of
rows recorded by an older monkey."""

from __future__ import annotations

import copy
import pickle
import sqlite3
import time

import pytest

from monkey.models import Instance, InstanceState, Resources
from monkey.store import Store
from monkey.store.migrations import MIGRATIONS


def test_moves_are_compare_and_set_with_events(tmp_path):
    store = Store(tmp_path / "monkey.db")
    booting = Instance(
        "aws/i-1",
        "aws",
        "i-1",
        InstanceState.PENDING,
        size="t3.small",
        spot=True,
        launched_at=100.0,
        extra={"kind": "ec2"},
    )
    assert store.record_instance(booting)
    up = Instance(
        "aws/i-1", "aws", "i-1", InstanceState.RUNNING, address="127.0.0.4", extra={"kind": "ec2"}
    )
    assert store.record_instance(up, reach="up")
    assert store.record_instance(up, reach="up")  # no change: no event
    gone = Instance("aws/i-1", "aws", "i-1", InstanceState.TERMINATED, extra={"kind": "ec2"})
    assert store.record_instance(gone)
    # A terminated machine never comes back: the move is refused and nothing is written.
    assert not store.record_instance(up)
    [row] = store.instances("aws")
    assert (row["state"], row["reach"], row["address"], row["size"], row["spot"]) == (
        "terminated",
        "up",
        None,
        "t3.small",
        True,
    )
    assert row["launched_at"] == 100.0 and row["terminated_at"] is not None
    assert store.instances("aws", live=True) == []
    moves = [(e["old"], e["new"]) for e in store.instance_events("aws/i-1")]
    assert moves == [(None, "pending"), ("pending", "running"), ("running", "terminated")]
    store.close()


def test_rows_of_an_older_monkey_are_upgraded(tmp_path):
    path = tmp_path / "monkey.db"
    db = sqlite3.connect(path)
    for index, (name, script) in enumerate(MIGRATIONS[:4], start=1):
        db.executescript(script)
        db.execute("INSERT INTO migrations(name, applied_at) VALUES (?, ?)", (name, time.time()))
        db.execute(f"PRAGMA user_version = {index}")
    now = time.time()
    db.executemany(
        "INSERT INTO instances(id, provider, kind, host, state, extra, created_at, updated_at) "
        "VALUES (?, 'lab', 'ssh', ?, ?, '{}', ?, ?)",
        [("lab/a", "me@a:22", "up", now, now), ("lab/b", "me@b:22", "unreachable", now, now)],
    )
    db.commit()
    db.close()
    store = Store(path)
    rows = {r["id"]: (r["state"], r["reach"]) for r in store.instances()}
    assert rows == {"lab/a": ("running", "up"), "lab/b": ("unknown", "unreachable")}
    store.close()


def test_machines_needed_for_waiting_jobs():
    from monkey.core.provisioning import machines_needed

    jobs = [Resources(cpus=1)] * 40
    # 2-CPU machines, 4 at most: 4, however many jobs wait
    assert machines_needed(jobs, per_machine=2, booting=0, live=0, limit=4) == 4
    # machines still booting take their share; a full quota creates nothing
    assert machines_needed(jobs[:5], per_machine=2, booting=2, live=2, limit=4) == 1
    assert machines_needed(jobs, per_machine=2, booting=0, live=4, limit=4) == 0
    # a job asking 8 CPUs counts 8; no limit of monkey's
    assert machines_needed([Resources(cpus=8)], per_machine=4, booting=0, live=0, limit=None) == 2
    assert machines_needed([], per_machine=2, booting=0, live=0, limit=None) == 0


def test_an_instance_is_an_immutable_value():
    inst = Instance("aws/i-1", "aws", "i-1", InstanceState.RUNNING, extra={"zone": "a"})
    with pytest.raises(AttributeError, match="immutable"):
        inst.spot = True  # type: ignore[misc]
    spot = inst.replace(spot=True)
    assert (spot.spot, inst.spot, spot.extra) == (True, False, {"zone": "a"})
    assert spot != inst and spot.replace(spot=False) == inst
    with pytest.raises(TypeError, match="no field 'zone'"):
        inst.replace(zone="b")
    for twin in (copy.copy(inst), copy.deepcopy(inst), pickle.loads(pickle.dumps(inst))):
        assert twin == inst and type(twin) is Instance
    assert copy.deepcopy(inst).extra is not inst.extra
    assert "Instance(id='aws/i-1'" in repr(inst)
