"""One contract, every driver: local (this machine), ssh (a real sshd on loopback), ec2 (moto's
server, its instance reached over a real sshd), gce (the fake compute API and fake-gcs-server,
likewise). What the core relies on of any provider kind:
provisioning (list, create, destroy, states) and transport (agent, blobs, results)."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import test_ec2
import test_gce
import test_ssh
import yaml

from monkey.config import Home, ProviderConfig
from monkey.drivers import get_driver
from monkey.drivers.agent_link import AgentLink
from monkey.drivers.base import Driver, NoCapacity
from monkey.models import Instance, InstanceState
from monkey.snapshot import BlobStore
from tests.conftest import wait_for

pytestmark = pytest.mark.system  # every kind's driver against its real services (a core, sshd, moto, fake GCE)

# The fixtures of the ssh and ec2 tests, used here as they are.
lab = test_ssh.lab
fleet, aws = test_ec2.fleet, test_ec2.aws
gce, gcp, gcs_server = test_gce.gce, test_gce.gcp, test_gce.gcs_server


@dataclass
class Target:
    """A driver under test and the instance ids its provider was configured with."""

    driver: Driver
    configured: list[str]
    created: list[str] = field(default_factory=list)

    def usable(self) -> str:
        """An instance that can take jobs now: a configured one, else one created for the test."""
        drv = self.driver
        if drv.elastic:
            self.created.append(drv.create_node().id)
        wanted = self.created[-1] if self.created else self.configured[0]
        wait_for(lambda: any(c.instance == wanted for c in drv.instances()), timeout=30,
                 what=f"{wanted} to take jobs")  # fmt: skip
        return wanted


def configure(home: Path, name: str, entry: dict[str, Any]) -> ProviderConfig:
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {name: entry}}))
    return ProviderConfig(name, entry["type"], entry)


@pytest.fixture(params=["local", "ssh", "ec2", "gce"])
def target(request: pytest.FixtureRequest, home: Path) -> Iterator[Target]:
    kind = request.param
    if kind == "local":
        config, configured = configure(home, "local", {"type": "local", "slots": 2}), ["local"]
    elif kind == "ssh":
        hosts = request.getfixturevalue("lab")
        host = hosts.add("h1")
        config = configure(home, "lab", {"type": "ssh", "hosts": [host.entry(key=hosts.key)]})
        configured = ["lab/h1"]
    else:
        config, configured = request.getfixturevalue({"ec2": "aws", "gce": "gcp"}[kind]), []
    drv = get_driver(config, Home(home).ensure())
    assert drv.kind == kind
    t = Target(drv, configured)
    try:
        yield t
    finally:
        for instance in t.created:
            drv.destroy_node(instance)
        drv.close()


def states(drv: Driver) -> dict[str, InstanceState]:
    nodes = drv.list_nodes()
    assert all(isinstance(n, Instance) and isinstance(n.state, InstanceState) for n in nodes)
    assert all(n.provider == drv.name for n in nodes)
    return {n.id: n.state for n in nodes}


def wait_exit(link: AgentLink, juid: str, timeout: float = 30) -> dict[str, Any]:
    """The agent's exit event of JUID (pushed to a link that synced)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for push in link.poll():
            event = push.get("event") or {}
            if push.get("juid") == juid and event.get("type") == "exit":
                return event
        select.select([link.fileno()], [], [], 0.2)
    raise AssertionError(f"no exit of {juid} within {timeout}s")


class TestContract:
    def test_list_create_destroy(self, target: Target) -> None:
        drv = target.driver
        if not drv.elastic:
            assert set(states(drv)) == set(target.configured)
            try:
                claimed = drv.create_node()
                assert claimed.id in target.configured
            except NoCapacity as exc:
                assert str(exc) and "\n" not in str(exc)
            for _ in range(2):  # releasing is idempotent
                drv.destroy_node(target.configured[0])
            return
        assert states(drv) == {}
        made = drv.create_node()
        target.created.append(made.id)
        assert made.provider == drv.name and made.state in (InstanceState.PENDING, InstanceState.RUNNING)
        assert wait_for(lambda: states(drv).get(made.id) == InstanceState.RUNNING, what="running")
        drv.destroy_node(made.id)
        assert states(drv).get(made.id, InstanceState.TERMINATED) == InstanceState.TERMINATED
        drv.destroy_node(made.id)  # idempotent

    def test_only_machines_monkey_created_power_themselves_off(self, target: Target) -> None:
        """A cloud instance's agent is armed to power its machine off once orphaned (and the
        core pings it); this machine's, an SSH host's, never."""
        drv = target.driver
        orphan = drv.sync_fields(target.configured[0] if target.configured else f"{drv.name}/i-0")
        if drv.elastic:
            assert orphan["orphan"] == {"timeout": 1800.0} and drv.ping_every == 60.0
        else:
            assert "orphan" not in orphan and drv.ping_every is None

    def test_agent_blobs_and_results(self, target: Target, home: Path) -> None:
        drv = target.driver
        instance = target.usable()
        assert states(drv)[instance] == InstanceState.RUNNING
        digest, _ = BlobStore(Home(home).blobs).put_bytes(b"echo hello from the contract\necho 42 > result.txt\n")
        link = drv.connect(instance)
        try:
            assert link.request("hello")["cpus"] >= 1
            link.request("sync", attempts=[])  # pushes: the job's events

            fetch = drv.prepare(instance, [digest])  # the blob there, or fields that fetch it
            juid = "26-01-01-001"
            run_dir = drv.run_dir(instance, juid, 1)
            link.request("start", juid=juid, attempt=1, run_dir=run_dir, argv=["sh", "main.sh"],
                         env={}, files=[["main.sh", digest, 0o644]],
                         blobs_dir=drv.blobs_dir(instance), **fetch,
                         **drv.start_fields(instance, juid, 1, ["*.txt"]))  # fmt: skip
            assert wait_exit(link, juid)["code"] == 0
            blob = Path(drv.blobs_dir(instance)) / digest[:2] / digest[2:]
            assert blob.read_bytes().startswith(b"echo hello from the contract\n")
            drv.finish(instance, juid, 1, ["*.txt"], True)
        finally:
            link.close()
        assert (Home(home).run_dir(juid, 1) / "stdout.log").read_text() == "hello from the contract\n"
        assert (Home(home).run_dir(juid, 1) / "work" / "result.txt").read_text() == "42\n"
