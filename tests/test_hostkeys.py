"""Host keys of the instances monkey creates: pinned at first contact when they are among the
keys the instance printed on its console, refused (and the instance terminated) when they are
not, forgotten when the instance is terminated.

moto answers GetConsoleOutput with one fixed kernel log for every instance and has no API to
set it. The `consoles` fixture replaces that answer inside the test's in-process moto server:
each instance's console is a transcript shaped like a real Ubuntu boot's (cloud-init prints
its host keys between ``-----BEGIN SSH HOST KEY KEYS-----`` markers), carrying the real key of
the sshd at the instance's address, or whatever a test sets for that address. Everything else
(the API call through libcloud, SSH, the core) is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from monkey.config import Home
from monkey.drivers.ec2 import EC2Driver
from monkey.drivers.ssh_hosts import printed_host_keys
from monkey.store import Store
from tests import test_ec2
from tests.conftest import wait_for
from tests.sshd import Lab
from tests.test_ec2 import add_aws, info, reached, run_job

# test_ec2's fixtures: a fleet of sshds at the instances' addresses, provider `aws` on moto
aws, driver, fleet = test_ec2.aws, test_ec2.driver, test_ec2.fleet

CONSOLE = """\
[    0.000000] Linux version 6.8.0-1012-aws (buildd@lcy02-amd64-071) (x86_64-linux-gnu-gcc-13) #13-Ubuntu SMP
[    0.000000] Command line: BOOT_IMAGE=/vmlinuz-6.8.0-1012-aws root=PARTUUID=4e0d5e3c ro console=tty1 console=ttyS0
[    8.120331] cloud-init[512]: Cloud-init v. 24.1.3-0ubuntu3.3 running 'init' at Tue, 18 Jun 2024 09:12:29 +0000.
[   10.982003] cloud-init[512]: Generating public/private ed25519 key pair.
<14>Jun 18 09:12:33 cloud-init: #############################################################
<14>Jun 18 09:12:33 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----
<14>Jun 18 09:12:33 cloud-init: 256 SHA256:pDsbmZmzRnL1nOx1Q0e3dU9xv6fN5AaBbCcDdEeFfGg root@{host} (ED25519)
<14>Jun 18 09:12:33 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----
<14>Jun 18 09:12:33 cloud-init: #############################################################
-----BEGIN SSH HOST KEY KEYS-----
{keys}
-----END SSH HOST KEY KEYS-----
[   12.771245] cloud-init[701]: Cloud-init v. 24.1.3-0ubuntu3.3 finished at Tue, 18 Jun 2024 09:12:34 +0000. Up 12.70 seconds
"""


def console_text(keys: list[tuple[str, str]], host: str = "ip-10-77-0-4") -> str:
    """A boot's console output whose cloud-init block prints KEYS."""
    return CONSOLE.format(
        host=host, keys="\n".join(f"{kind} {b64} root@{host}" for kind, b64 in keys)
    )


class Consoles:
    """What each instance prints on its console, by its private address."""

    def __init__(self, fleet: Lab) -> None:
        self.fleet = fleet
        self.by_address: dict[str, str] = {}

    def output(self, address: str) -> str:
        if address in self.by_address:
            return self.by_address[address]
        host = next(h for h in self.fleet.hosts if h.address == address)
        extra = paramiko.ECDSAKey.generate()  # the image has an ECDSA host key too
        return console_text([tuple(host.host_key_pub), (extra.get_name(), extra.get_base64())])


@pytest.fixture
def consoles(moto: Any, fleet: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Consoles]:
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.responses.general import General
    from moto.ec2.utils import Base64EncodedString

    found = Consoles(fleet)

    def get_console_output(self: Any) -> Any:
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        text = found.output(instance.private_ip_address)
        return ActionResult(
            {
                "InstanceId": instance.id,
                "Timestamp": utcnow(),
                "Output": Base64EncodedString.from_raw_string(text),
            }
        )

    monkeypatch.setattr(General, "get_console_output", get_console_output)
    yield found


def stranger() -> tuple[str, str]:
    """A host key no instance has."""
    other = paramiko.ECDSAKey.generate()
    return other.get_name(), other.get_base64()


def test_printed_host_keys_reads_cloud_init_blocks() -> None:
    text = console_text(
        [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIB"), ("ssh-rsa", "AAAAB3NzaC1yc2E=")]
    )
    assert printed_host_keys(text) == {
        ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIB"),
        ("ssh-rsa", "AAAAB3NzaC1yc2E="),
    }
    prefixed = (
        "ec2: -----BEGIN SSH HOST KEY KEYS-----\nec2: ecdsa-sha2-nistp256 AAAAE2Vj= root@x\n"
        "ec2: -----END SSH HOST KEY KEYS-----\n"
    )
    assert printed_host_keys(prefixed) == {("ecdsa-sha2-nistp256", "AAAAE2Vj=")}
    assert printed_host_keys("[ 0.0] Linux version 2.6.16-xenU\n") == set()
    assert printed_host_keys(None) == set()


def test_keys_recorded_while_others_are_forgotten_are_all_kept(tmp_path: Path) -> None:
    """One thread trusts new machines' keys while another forgets gone machines' (the
    core's connections and its provisioning): no recorded key is lost from the file."""
    import threading

    from monkey.drivers.ssh_hosts import HostKeys

    keys = [paramiko.ECDSAKey.generate() for _ in range(4)]
    recorder, forgetter = HostKeys(Home(tmp_path), True), HostKeys(Home(tmp_path), True)
    for n in range(100):
        recorder.check(f"gone-{n}", keys[n % 4])

    def forget() -> None:
        for n in range(100):
            forgetter.forget(f"gone-{n}")

    thread = threading.Thread(target=forget)
    thread.start()
    for n in range(100):
        recorder.check(f"new-{n}", keys[n % 4])
    thread.join()
    names = [line.split()[0] for line in (tmp_path / "known_hosts").read_text().splitlines()]
    assert names == [f"new-{n}" for n in range(100)]


def test_key_printed_on_the_console_is_pinned(
    driver: EC2Driver, consoles: Consoles, fleet: Lab, home: Path
) -> None:
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        assert (home / "known_hosts").read_text().splitlines() == [
            f"{inst.id} {' '.join(fleet.hosts[0].host_key_pub)}"
        ]
        assert driver.distrusted() == {}
    finally:
        driver.destroy_node(inst.id)
    assert (home / "known_hosts").read_text() == ""  # forgotten with the instance


def test_key_not_on_the_console_is_refused_in_one_line(
    driver: EC2Driver, consoles: Consoles, home: Path, moto: Any
) -> None:
    kind, _ = stranger()
    consoles.by_address["127.0.0.4"] = console_text([stranger()])
    inst = driver.create_node()
    try:
        wait_for(
            lambda: driver.instances() == [] and driver.distrusted(), what="the key to be refused"
        )
        why = driver.distrusted()[inst.id]
        assert why.startswith(f"host key of {inst.id} (ssh-ed25519 SHA256:")
        assert why.endswith(
            f"is not among the keys its console printed ({kind}); refusing to "
            "connect: another machine answers at its address"
        )
        assert "\n" not in why
        assert not reached(driver, inst.id)
        assert (
            not (home / "known_hosts").exists() or inst.id not in (home / "known_hosts").read_text()
        )
    finally:
        driver.destroy_node(inst.id)
    assert driver.distrusted() == {} and moto.instances() == []


def test_an_image_that_prints_no_keys_is_trusted_on_first_use(
    driver: EC2Driver, fleet: Lab, home: Path
) -> None:
    """moto's own console (a kernel log, no cloud-init block): the key is pinned as offered."""
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        assert inst.id in (home / "known_hosts").read_text()
    finally:
        driver.destroy_node(inst.id)


def test_a_refused_instance_is_terminated_and_the_job_runs_on_a_trusted_one(
    cli, home: Path, moto: Any, fleet: Lab, consoles: Consoles
) -> None:
    """The first instance answers with a key its console never printed: monkey sends it
    nothing, terminates it, the job keeps waiting (saying why) and runs on the next one; the
    pinned key is forgotten once that one is terminated too."""
    consoles.by_address["127.0.0.4"] = console_text([stranger()])
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    try:
        juid = run_job(cli, "echo", "hi")
        wait_for(
            lambda: (
                "is not among the keys its console printed"
                in (info(cli, juid).get("waiting") or "")
            ),
            timeout=60,
            what="the job to say why it waits",
        )
        waiting = info(cli, juid)["waiting"]
        assert waiting.startswith("host key of aws/i-") and waiting.endswith(
            "; monkey terminated it"
        )
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=90, what="the job to run")
        assert cli("logs", juid, check=True).stdout == "hi\n"
        store = Store(Home(home).db)
        try:
            # by where each was reached (`host` keeps it; a terminated one has no address)
            first, second = sorted(store.instances("aws"), key=lambda r: r["host"])
            events = [e["detail"] for e in store.instance_events(first["id"])]
        finally:
            store.close()
        assert (first["host"], second["host"]) == ("127.0.0.4", "127.0.0.5")
        assert first["state"] == "terminated" and "destroyed: host key refused" in events
        assert info(cli, juid)["instance"] == second["id"]
        assert len(info(cli, juid)["attempts_detail"]) == 1  # nothing was ever sent to the first
        assert not (fleet.hosts[0].home / ".monkey-agent").exists()
        assert (home / "known_hosts").read_text().split()[0] == second["id"]
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
        wait_for(
            lambda: (home / "known_hosts").read_text() == "",
            timeout=30,
            what="the key to be forgotten",
        )
        shown = json.loads(cli("list", "providers", "--json", check=True).stdout)
        assert [p for p in shown["providers"] if p["name"] == "aws"]
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
