"""`--priority N` and `monkey job priority` (issue 29, part 2): higher first, first come first
served within a priority; and on a queue shared by several owners, free slots go by fair
share, so one owner's long queue cannot starve another's jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import wait_for

ENDED = ("succeeded", "failed", "cancelled", "lost", "preempted")


def _one_slot(home: Path, slots: int = 1) -> None:
    (home / "providers.yml").write_text(f"providers:\n  local: {{type: local, slots: {slots}}}\n")


def _ended(monkey, juids: list[str], timeout: float = 120) -> None:
    wait_for(
        lambda: all(monkey.store.get_job(j).state.value in ENDED for j in juids),
        timeout=timeout,
        what="the jobs to end",
    )


def test_higher_priority_starts_first_fifo_within_one(home: Path, monkey, cli, tmp_path: Path):
    _one_slot(home)
    order, gate = tmp_path / "order", tmp_path / "gate"
    blocker = monkey.run(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]).juid
    wait_for(lambda: monkey.store.get_job(blocker).state.value == "running", what="a blocker")

    def job(word: str, priority: int) -> str:
        return monkey.run(["sh", "-c", f"echo {word} >> {order}"], priority=priority).juid

    juids = [
        job("low1", 0),
        job("urgent", 10),
        job("low2", 0),
        job("last", -5),
        job("high1", 5),
        job("high2", 5),
    ]
    moved = cli("run", "--priority", "0", "--", "sh", "-c", f"echo moved >> {order}", check=True)
    moved_juid = moved.stdout.strip()
    assert cli("job", "priority", moved_juid, "7", check=True).stdout.strip() == (
        f"{moved_juid} priority 7"
    )
    table = cli("list", "jobs", check=True).stdout
    assert "queued (+7)" in table and "queued (-5)" in table
    listed = json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]
    assert {j["job"]: j["priority"] for j in listed}[juids[1]] == 10
    gate.touch()  # the blocker ends: the queue goes in its order
    _ended(monkey, [*juids, moved_juid])
    assert order.read_text().split() == [
        "urgent",
        "moved",
        "high1",
        "high2",
        "low1",
        "low2",
        "last",
    ]
    events = json.loads(cli("info", moved_juid, "--json", check=True).stdout)["events"]
    assert any(e["detail"] == "priority 7" for e in events)


def test_priority_of_a_job_that_is_not_queued_is_refused(monkey, cli):
    job = monkey.run(["true"])
    job.wait(timeout=60)
    done = cli("job", "priority", job.juid, "3")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"monkey: error: job {job.juid} is succeeded; only queued or paused jobs change priority"
    )
    bad = cli("run", "--priority", "high", "--", "true")
    assert bad.returncode == 2 and "--priority: invalid int value" in bad.stderr
    for argv in (
        ["run", "--priority", str(10**20), "--", "true"],
        ["job", "priority", "last", "-2000000"],
    ):
        huge = cli(*argv)
        assert huge.returncode == 1, huge.stderr
        assert huge.stderr.strip().splitlines() == [
            f"monkey: error: priority {int(argv[2 if argv[0] == 'run' else 3])}: give a whole "
            "number from -1,000,000 to 1,000,000, e.g. 10 or -5"
        ]
    assert len(monkey.store.list_jobs()) == 1


def test_two_owners_share_the_slots_fairly(home: Path, monkey, tmp_path: Path):
    """ana queues six jobs on two slots, then bob two: bob's start among the first slots
    freed, not after all of ana's (first come, first served would put them last)."""
    _one_slot(home, slots=2)
    gate = tmp_path / "gate"  # ana's first two hold their slots until bob's jobs are queued
    work = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; sleep 0.3"]
    as_user = monkey.acting_for("ana")
    anas = [as_user.run(work).juid for _ in range(6)]
    wait_for(
        lambda: sum(monkey.store.get_job(j).state.value == "running" for j in anas) == 2,
        what="two of ana's jobs to run",
    )
    as_user = monkey.acting_for("bob")
    bobs = [as_user.run(work).juid for _ in range(2)]
    gate.touch()
    _ended(monkey, anas + bobs)
    start = {j: monkey.store.attempts(j)[-1].started_at for j in anas + bobs}
    assert start[bobs[0]] < start[anas[3]]  # among the first two slots freed
    assert start[bobs[1]] < start[anas[5]]
    owners = monkey.store.job_owners(anas + bobs)
    assert {owners[j] for j in anas} == {"ana"} and {owners[j] for j in bobs} == {"bob"}


@pytest.mark.system  # starts a main node
def test_through_a_remote_only_its_owner_changes_a_jobs_priority(home: Path, tmp_path: Path):
    from mainnode import MainNode

    node = MainNode(home, tmp_path)
    home.mkdir(parents=True, exist_ok=True)
    _one_slot(home)
    node.start()
    try:
        node.add_remote(node.add_user("bob"), name="bob")
        node.add_remote(node.add_user("ana"), name="ana")
        blocker = node.laptop("--remote", "ana", "run", "--", "sleep", "60").stdout.strip()
        wait_for(  # else ana's job of a higher priority would take the slot first
            lambda: json.loads(node.server("info", blocker, "--json").stdout)["state"] == "running",
            what="the blocker to run",
        )
        anas = node.laptop("--remote", "ana", "run", "--priority", "2", "--", "true")
        assert anas.returncode == 0, anas.stderr
        ana = anas.stdout.strip()
        refused = node.laptop("--remote", "bob", "job", "priority", ana, "9")
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"monkey: error: job {ana} belongs to ana; only its owner or an admin may "
            "change the priority of it"
        ]
        done = node.laptop("--remote", "ana", "job", "priority", ana, "9")
        assert done.stdout.strip() == f"{ana} priority 9", done.stderr
        info = json.loads(node.server("info", ana, "--json").stdout)
        assert info["priority"] == 9
        assert [(e["detail"], e["actor"]) for e in info["events"] if e["kind"] == "user"] == [
            ("priority 9", "ana")
        ]
        node.server("cancel", blocker, ana)
    finally:
        node.close()
