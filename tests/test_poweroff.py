"""An instance whose agent powers it off while the core is away (issue 46 item 1).

The core is SIGKILLed while three jobs run on an EC2 instance (moto, the instance a loopback
sshd host, see tests/test_ec2.py); the jobs finish while no core runs; the agent, orphaned,
powers the machine off (here its shutdown command leaves a mark and kills the agent, as a
power-off would; the test then terminates the instance as EC2 does). With a bucket, the
agent leaves in it what the core would have fetched, and the core that comes back ends
each job as it ended, with every line, once. Without one, the agent does not power off
while a finished attempt is unfetched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from monkey.config import Home
from monkey.store import Store
from tests.conftest import kill_core, start_core, wait_for
from tests.fake_gce import FakeGCE
from tests.sshd import Lab
from tests.test_ec2 import add_aws, fleet, info
from tests.test_gce import ZONE, add_gcp, gce, gcs_server

__all__ = ["fleet", "gce", "gcs_server"]  # fixtures, used by name

FIRST = 5  # lines each job prints before the core dies
JOBS = {"a": (20, 0), "b": (100, 0), "c": (30, 5)}  # lines printed, exit code


@pytest.fixture
def marks() -> Iterator[Path]:
    """A folder the instance's user writes its marks in (it may not see the test's)."""
    folder = Path(tempfile.mkdtemp(prefix="monkey-poweroff-"))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def script(marks: Path, name: str) -> str:
    lines, code = JOBS[name]
    metric = f'echo \'{{"experiment": {{"{name}_lines": {lines}}}}}\'; ' if name == "c" else ""
    return (
        f"echo run >> {marks}/{name}.runs; i=1; "
        f'while [ $i -le {FIRST} ]; do echo "line $i"; i=$((i+1)); done; '
        f"while [ ! -e {marks}/gate ]; do sleep 0.05; done; "
        f'while [ $i -le {lines} ]; do echo "line $i"; i=$((i+1)); done; '
        f"{metric}exit {code}"
    )


def configure(home: Path, marks: Path, bucket: bool, provider: str = "aws") -> None:
    """Two instances at most (two jobs fit on one), orphaned after 4 s, whose power-off
    leaves a mark and ends its agent."""
    entry = yaml.safe_load((home / "providers.yml").read_text())
    aws = entry["providers"][provider]
    aws.update(
        orphan_timeout=4,
        shutdown_command=f"echo bye >> {marks}/powered-off; kill -9 $PPID",
    )
    if not bucket:
        aws.pop("bucket", None)
    (home / "providers.yml").write_text(yaml.safe_dump(entry))


def start_jobs(cli: Any, marks: Path, provider: str = "aws") -> dict[str, str]:
    juids = {}
    for name in JOBS:
        retries = ["--retries", "2"] if name == "a" else []
        argv = ["run", "--json", "-p", provider, *retries, "--", "sh", "-c", script(marks, name)]
        juids[name] = json.loads(cli(*argv, check=True).stdout)["job"]
    for juid in juids.values():
        wait_for(
            lambda j=juid: cli("logs", j).stdout.count("\n") == FIRST,
            timeout=60,
            what="the jobs to start",
        )
    return juids


def agent_logs(fleet: Lab) -> list[str]:
    """The agent logs of the instances used."""
    paths = [h.home / ".monkey-agent" / "agent.log" for h in fleet.hosts]
    return [p.read_text() for p in paths if p.exists()]


def powered_off(marks: Path) -> int:
    """How many instances powered themselves off."""
    path = marks / "powered-off"
    return path.read_text().count("bye") if path.exists() else 0


def check_ended_as_they_ended(cli: Any, juids: dict[str, str], marks: Path) -> None:
    for name, juid in juids.items():
        lines, code = JOBS[name]
        wait_for(
            lambda j=juid: info(cli, j)["state"] in ("succeeded", "failed", "lost"),
            timeout=60,
            what=f"job {name} to end",
        )
        shown = info(cli, juid)
        assert shown["state"] == ("succeeded" if code == 0 else "failed"), shown
        [attempt] = shown["attempts_detail"]  # ran once, never again
        assert attempt["exit_code"] == code, attempt
        expected = "".join(f"line {i}\n" for i in range(1, lines + 1))
        if name == "c":
            expected += f'{{"experiment": {{"c_lines": {lines}}}}}\n'
        assert cli("logs", juid, check=True).stdout == expected
        assert (marks / f"{name}.runs").read_text() == "run\n"
    assert info(cli, juids["c"])["metrics"]["c_lines"]["last"] == 30


def test_an_instance_powered_off_by_its_agent_leaves_its_jobs_ends_in_the_bucket(
    cli, home: Path, moto: Any, fleet: Lab, marks: Path
) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "2")
    configure(home, marks, bucket=True)
    try:
        juids = start_jobs(cli, marks)
        instances = {info(cli, juid)["instance"] for juid in juids.values()}
        assert len(instances) == 2
        kill_core(home)
        (marks / "gate").touch()  # the jobs end while no core runs
        wait_for(lambda: powered_off(marks) == 2, timeout=60, what="the agents to power off")
        # what EC2 does to an instance that powers off (shutdown behaviour `terminate`)
        nodes = [i.split("/", 1)[1] for i in instances]
        moto.boto3("ec2").terminate_instances(InstanceIds=nodes)
        start_core(home)
        check_ended_as_they_ended(cli, juids, marks)
        store = Store(Home(home).db)
        try:
            for instance in instances:
                [ended] = [e for e in store.instance_events(instance) if e["new"] == "terminated"]
                why = ended["detail"]
                assert why.startswith("its agent powered it off: no job for "), why
                assert "no word from the core for " in why and why.endswith("(orphan_timeout 4s)")
        finally:
            store.close()
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_without_a_bucket_the_agent_waits_for_the_core_to_fetch_its_jobs(
    cli, home: Path, moto: Any, fleet: Lab, marks: Path
) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "2")
    configure(home, marks, bucket=False)
    try:
        juids = start_jobs(cli, marks)
        kill_core(home)
        (marks / "gate").touch()
        held = "not powering the machine off: finished attempts not fetched by the core"
        wait_for(
            lambda: sum(held in said for said in agent_logs(fleet)) == 2 or powered_off(marks),
            timeout=60,
            what="the orphaned agents to decide",
        )
        assert not powered_off(marks), agent_logs(fleet)
        start_core(home)
        check_ended_as_they_ended(cli, juids, marks)
        # fetched: the machine, idle and orphaned once more, powers itself off
        cli("daemon", "stop")
        wait_for(lambda: powered_off(marks) == 2, timeout=60, what="the agents to power off")
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_a_gce_instance_powered_off_by_its_agent_leaves_its_jobs_ends_in_the_bucket(
    cli, home: Path, gce: FakeGCE, fleet: Lab, marks: Path
) -> None:
    """The same on GCE, which stops a machine whose OS powers off: the core reads the bucket,
    then deletes the machine, saying why it was powered off."""
    add_gcp(cli, gce, fleet, home, "--max-instances", "2")
    configure(home, marks, bucket=True, provider="gcp")
    try:
        juids = start_jobs(cli, marks, "gcp")
        instances = {info(cli, juid)["instance"] for juid in juids.values()}
        kill_core(home)
        (marks / "gate").touch()
        wait_for(lambda: powered_off(marks) == 2, timeout=60, what="the agents to power off")
        for instance in instances:
            gce.guest_shutdown(ZONE, instance.split("/", 1)[1])
        start_core(home)
        check_ended_as_they_ended(cli, juids, marks)
        wait_for(lambda: gce.listed() == [], timeout=60, what="the stopped instances deleted")

        def reasons() -> list[str]:
            store = Store(Home(home).db)
            try:
                return [
                    e["detail"]
                    for i in instances
                    for e in store.instance_events(i)
                    if e["new"] == "terminated"
                ]
            finally:
                store.close()

        wait_for(lambda: len(reasons()) == 2, timeout=30, what="the deletions recorded")
        for why in reasons():
            assert why.startswith("destroyed: its agent powered it off: no job for "), why
            assert why.endswith("(orphan_timeout 4s)"), why
    finally:
        cli("daemon", "stop")
