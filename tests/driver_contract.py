"""One contract, every driver: what the core relies on of any provider kind, provisioning
(list, create, destroy, states) and transport (agent, blobs, results).

Each kind's test module subclasses :class:`DriverContract` (``TestLocalContract`` in
test_local.py, ``TestSSHContract`` in test_ssh.py, ``TestEC2Contract`` in test_ec2.py,
``TestGCEContract`` in test_gce.py, ``TestSlurmContract`` in test_slurm.py) and gives its
``target`` fixture: the driver of a provider set up against the kind's real test service
(this machine, a real sshd on loopback, moto's server or the fake compute API with their
instances reached over a real sshd, a single-node Slurm). Cloud kinds subclass
:class:`CloudContract`, which adds what every cloud shares (``max_instances``, an endpoint
out of reach). The scenarios then run against every kind."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from monkey.config import Home, ProviderConfig
from monkey.drivers import get_driver
from monkey.drivers.agent_link import AgentLink
from monkey.drivers.base import Driver, NoCapacity
from monkey.models import Instance, InstanceState, MonkeyError
from monkey.snapshot import BlobStore
from tests.conftest import wait_for


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
        wait_for(
            lambda: any(c.instance == wanted for c in drv.instances()),
            timeout=30,
            what=f"{wanted} to take jobs",
        )
        return wanted


def provider(home: Path, name: str, entry: dict[str, Any]) -> ProviderConfig:
    """A providers.yml holding the one provider NAME, and its config."""
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {name: entry}}))
    return ProviderConfig(name, entry["type"], entry)


def serve(config: ProviderConfig, home: Path, configured: list[str]) -> Iterator[Target]:
    """The body of a ``target`` fixture: the provider's driver, its machines made for the
    test destroyed and its connections closed afterwards."""
    drv = get_driver(config, Home(home).ensure())
    assert drv.kind == config.type
    target = Target(drv, configured)
    try:
        yield target
    finally:
        for instance in target.created:
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


@pytest.mark.system  # every kind against its real services (a core, sshd, moto, fake GCE, Slurm)
class DriverContract:
    """The scenarios every kind passes; a subclass gives the ``target`` fixture."""

    # The agents of its instances are armed to power their machine off once orphaned, and
    # the core pings them (cloud machines monkey created; never this machine, an SSH host
    # or a Slurm allocation, which ends with its job anyway).
    powers_off: ClassVar[bool] = False

    @pytest.fixture
    def target(self) -> Iterator[Target]:
        raise NotImplementedError("a kind's contract class gives its target fixture")

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
        assert made.provider == drv.name and made.state in (
            InstanceState.PENDING,
            InstanceState.RUNNING,
        )
        assert wait_for(lambda: states(drv).get(made.id) == InstanceState.RUNNING, what="running")
        drv.destroy_node(made.id)
        assert states(drv).get(made.id, InstanceState.TERMINATED) == InstanceState.TERMINATED
        drv.destroy_node(made.id)  # idempotent

    def test_only_machines_monkey_created_power_themselves_off(self, target: Target) -> None:
        """A cloud instance's agent is armed to power its machine off once orphaned (and the
        core pings it); this machine's, an SSH host's, a Slurm allocation's, never."""
        drv = target.driver
        orphan = drv.transport.sync_fields(
            target.configured[0] if target.configured else f"{drv.name}/i-0"
        )
        if self.powers_off:
            assert orphan["orphan"] == {"timeout": 1800.0} and drv.ping_every == 60.0
        else:
            assert "orphan" not in orphan and drv.ping_every is None

    def test_agent_blobs_and_results(self, target: Target, home: Path) -> None:
        drv = target.driver
        instance = target.usable()
        assert states(drv)[instance] == InstanceState.RUNNING
        digest, _ = BlobStore(Home(home).blobs).put_bytes(
            b"echo hello from the contract\necho 42 > result.txt\n"
        )
        link = drv.transport.connect(instance)
        try:
            assert link.request("hello")["cpus"] >= 1
            link.request("sync", attempts=[])  # pushes: the job's events

            fetch = drv.transport.prepare(
                instance, [digest]
            )  # the blob there, or fields that fetch it
            juid = "26-01-01-001"
            run_dir = drv.transport.run_dir(instance, juid, 1)
            link.request(
                "start",
                juid=juid,
                attempt=1,
                run_dir=run_dir,
                argv=["sh", "main.sh"],
                env={},
                files=[["main.sh", digest, 0o644]],
                blobs_dir=drv.transport.blobs_dir(instance),
                **fetch,
                **drv.transport.start_fields(instance, juid, 1, ["*.txt"]),
            )
            assert wait_exit(link, juid)["code"] == 0
            blob = Path(drv.transport.blobs_dir(instance)) / digest[:2] / digest[2:]
            assert blob.read_bytes().startswith(b"echo hello from the contract\n")
            drv.transport.finish(instance, juid, 1, ["*.txt"], True)
        finally:
            link.close()
        assert (
            Home(home).run_dir(juid, 1) / "stdout.log"
        ).read_text() == "hello from the contract\n"
        assert (Home(home).run_dir(juid, 1) / "work" / "result.txt").read_text() == "42\n"


class CloudContract(DriverContract):
    """What every cloud kind adds; its ``target`` provider has ``max_instances: 2``."""

    powers_off = True
    # How the one-line error of an endpoint out of reach ends after "check the network" (a
    # regular expression).
    unreachable_tail: ClassVar[str] = ""

    def test_max_instances_then_no_capacity(self, target: Target) -> None:
        drv = target.driver
        made = [drv.create_node(), drv.create_node()]
        target.created += [m.id for m in made]
        with pytest.raises(
            NoCapacity, match=rf"^{drv.name}: 2 instance\(s\) exist, max_instances is 2; "
        ):
            drv.create_node()
        live = {i for i, s in states(drv).items() if s != InstanceState.TERMINATED}
        assert live == {m.id for m in made}
        drv.destroy_node(made[-1].id)
        target.created.append(drv.create_node().id)  # a terminated one counts no more

    def test_unreachable_endpoint_is_one_line(self, target: Target, home: Path) -> None:
        config = target.driver.config
        drv = type(target.driver)(
            ProviderConfig(
                config.name, config.type, {**config.options, "endpoint": "http://127.0.0.1:9"}
            ),
            Home(home),
        )
        try:
            with pytest.raises(
                MonkeyError,
                match=rf"^{config.name}: cannot list instances: cannot reach "
                rf"http://127\.0\.0\.1:9 \(.*\); check the network"
                rf"{self.unreachable_tail}",
            ):
                drv.list_nodes()
        finally:
            drv.close()
