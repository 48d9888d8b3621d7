"""The `ec2` provider against moto's server on 127.0.0.1, each instance reached over real SSH.

moto gives instances private addresses from the subnet's range in order: with the subnet
127.0.0.0/24 and `address: private`, instance N of a test is 127.0.0.(N+3). The `fleet`
fixture runs one sshd on each of those addresses, each with its own host key and its own
home folder (the SFTP login folder and $HOME of its sessions; all log in the same local
user), and maps each address to its sshd's port in the client's ~/.ssh/config, which monkey
reads for instances as for SSH hosts. Everything above the address is real.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from monkey.config import Home, ProviderConfig
from monkey.drivers import ec2_setup
from monkey.drivers.base import NoCapacity
from monkey.drivers.ec2 import SIZES, USER_DATA, EC2Driver
from monkey.models import Instance, InstanceState, MonkeyError, Resources
from monkey.snapshot import BlobStore
from monkey.storage.bucket import PACK_BLOB_MAX
from monkey.store import Store
from tests.conftest import kill_core, start_core, wait_for
from tests.driver_contract import CloudContract, Target, serve
from tests.in_job import SCRIPT, check_tracked
from tests.sshd import Lab

FLEET = 3  # instances a test may create: 127.0.0.4 .. 127.0.0.6


@pytest.fixture
def fleet(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """One sshd per address moto gives the first instances, none of their keys known."""
    client_home = tmp_path / "client"
    monkeypatch.setenv("HOME", str(client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("MONKEY_HEARTBEAT_TIMEOUT", "4")
    lab = Lab(client_home)
    try:
        config = ""
        for n in range(1, FLEET + 1):
            host = lab.add(f"i{n}", trusted=False, address=f"127.0.0.{n + 3}", own_home=True)
            config += f"Host {host.address}\n    Port {host.port}\n"
        (lab.ssh_dir / "config").write_text(config)
        yield lab
    finally:
        lab.close()


def setup_aws(home: Path, moto: Any, fleet: Lab, **options: Any) -> ProviderConfig:
    """Provider `aws` made as `monkey provider add aws` makes it (VPC, subnet 127.0.0.0/24,
    key pair...), recorded in providers.yml; the fleet lets its key in."""
    h = Home(home).ensure()
    wanted = {
        "region": moto.region,
        "size": "t3.micro",
        "image": moto.image,
        "endpoint": moto.endpoint,
        "address": "private",
        "user": fleet.user,
        **options,
    }
    entry = ec2_setup.setup(
        h, "aws", ec2_setup.entry_from(wanted, {}), subnet_cidr="127.0.0.0/24", say=lambda _: None
    )
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"aws": entry}}))
    authorize(h, fleet)
    return ProviderConfig("aws", "ec2", entry)


def authorize(home: Home, fleet: Lab, name: str = "aws") -> None:
    public = (home.keys / f"{name}.pub").read_text()
    for host in fleet.hosts:
        host.authorize(public)


@pytest.fixture
def aws(home: Path, moto: Any, fleet: Lab) -> ProviderConfig:
    return setup_aws(home, moto, fleet, max_instances=2)


@pytest.fixture
def driver(aws: ProviderConfig, home: Path) -> Iterator[EC2Driver]:
    drv = EC2Driver(aws, Home(home))
    yield drv
    drv.close()


class TestEC2Contract(CloudContract):
    """The driver contract against moto's server, its instances reached over a real sshd."""

    unreachable_tail = r" or `endpoint:`$"

    @pytest.fixture
    def target(self, aws: ProviderConfig, home: Path) -> Iterator[Target]:
        yield from serve(aws, home, [])


def described(moto: Any, instance: Instance) -> dict[str, Any]:
    [res] = moto.boto3("ec2").describe_instances(InstanceIds=[instance.extra["node"]])[
        "Reservations"
    ]
    return res["Instances"][0]


def listed(drv: EC2Driver, instance: str) -> Instance | None:
    return next((i for i in drv.list_nodes() if i.id == instance), None)


def reached(drv: EC2Driver, instance: str) -> bool:
    return any(c.instance == instance for c in drv.instances())


def test_create_list_destroy(driver: EC2Driver, moto: Any, home: Path, aws: ProviderConfig) -> None:
    inst = driver.create_node()
    assert inst.id.startswith("aws/i-") and inst.provider == "aws"
    assert inst.state == InstanceState.PENDING
    assert (inst.size, inst.spot, inst.address) == ("t3.micro", False, "127.0.0.4")
    raw = described(moto, inst)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["monkey-home"] == Home(home).home_id() and tags["monkey-provider"] == "aws"
    assert raw["SubnetId"] == aws.options["subnet"] and raw["KeyName"] == aws.options["key_name"]
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [aws.options["security_group"]]
    data = moto.boto3("ec2").describe_instance_attribute(
        InstanceId=raw["InstanceId"], Attribute="userData"
    )
    script = base64.b64decode(data["UserData"]["Value"]).decode()
    assert script == USER_DATA and "command -v python3" in script and "apt-get install" in script

    found = listed(driver, inst.id)
    assert found is not None and found.state == InstanceState.RUNNING
    assert (found.address, found.size, found.spot) == ("127.0.0.4", "t3.micro", False)
    assert found.launched_at and abs(found.launched_at - time.time()) < 3600

    driver.destroy_node(inst.id)
    after = listed(driver, inst.id)
    assert after is None or after.state == InstanceState.TERMINATED
    driver.destroy_node(inst.id)  # idempotent
    driver.destroy_node("aws/i-0123456789abcdef0")  # never existed: nothing to do
    assert moto.instances() == []


def test_a_listing_overtaken_by_a_create_is_not_trusted(driver: EC2Driver) -> None:
    # A listing taken before a create and applied after it lacks the new instance. It
    # must neither drop the host a newer listing made of it (and forget its pinned key)
    # nor put the next listing off for half a minute, as a listing that saw nothing
    # booting does.
    taken, release = threading.Event(), threading.Event()
    real = driver._list

    def slow_listing() -> list[Instance]:
        found = real()
        taken.set()
        release.wait(10)
        return found

    driver._list = slow_listing  # type: ignore[method-assign]
    stale = threading.Thread(target=driver.list_nodes)
    stale.start()
    assert taken.wait(10)
    driver._list = real  # type: ignore[method-assign]
    inst = driver.create_node()
    try:
        found = listed(driver, inst.id)
        assert found is not None and found.state == InstanceState.RUNNING
        assert inst.id in driver.pool.hosts
        release.set()
        stale.join()
        assert inst.id in driver.pool.hosts
        assert driver._next_refresh - time.monotonic() < 1.0  # soon, not _REFRESH_IDLE
    finally:
        release.set()
        driver.destroy_node(inst.id)


def test_another_home_sees_none_of_them(
    driver: EC2Driver, aws: ProviderConfig, tmp_path: Path
) -> None:
    inst = driver.create_node()
    other = EC2Driver(aws, Home(tmp_path / "other-home").ensure())
    try:
        assert other.list_nodes() == []
        assert [i.id for i in driver.list_nodes()] == [inst.id]
    finally:
        other.close()
        driver.destroy_node(inst.id)


def test_spot_and_the_jobs_options(driver: EC2Driver, moto: Any) -> None:
    inst = driver.create_node("t3.large", options={"spot": True, "size": "t3.small", "disk": "20G"})
    try:
        assert (inst.size, inst.spot) == ("t3.small", True)
        found = listed(driver, inst.id)
        assert found is not None and found.spot and found.size == "t3.small"
        raw = described(moto, inst)
        assert raw["InstanceLifecycle"] == "spot"
        [volume] = raw["BlockDeviceMappings"]
        size = moto.boto3("ec2").describe_volumes(VolumeIds=[volume["Ebs"]["VolumeId"]])["Volumes"][
            0
        ]["Size"]
        assert size == 20
    finally:
        driver.destroy_node(inst.id)


def test_size_for_and_never_fits(aws: ProviderConfig, driver: EC2Driver) -> None:
    assert driver.size_for(Resources()) == "t3.micro"  # the entry's size, since it holds the job
    assert driver.size_for(Resources(cpus=2)) == "t3.micro"
    assert driver.size_for(Resources(cpus=4)) == "t3.xlarge"
    assert driver.size_for(Resources(cpus=2, memory="6G")) == "t3.large"
    assert driver.size_for(Resources(gpus=1)) == "g4dn.xlarge"
    assert driver.size_for(Resources(cpus=64, gpus=4)) == "g5.48xlarge"
    assert driver.size_for(Resources(cpus=1000)) == "t3.micro"  # nothing holds it: the default
    assert (
        driver.size_slots(None),
        driver.size_slots("c5.4xlarge"),
        driver.size_slots("x9.odd"),
    ) == (2, 16, 1)
    odd = EC2Driver(ProviderConfig("o", "ec2", {**aws.options, "size": "x9.odd"}), driver.home)
    try:
        assert odd.size_for(Resources()) == "x9.odd"  # not in the table: the default all the same
        assert odd.size_for(Resources(cpus=2)) == "t3.nano"
    finally:
        odd.close()
    g5 = ProviderConfig("g", "ec2", {**aws.options, "size": "g5.xlarge"})
    assert EC2Driver.never_fits(g5, Resources(cpus=1000)) == (
        "no instance size of provider 'g' holds --cpus 1000 --gpus 0; the largest, g5.48xlarge, "
        "has 192 cpus, 8 gpus, 768G"
    )
    assert EC2Driver.never_fits(g5, Resources(cpus=8, gpus=1)) is None
    assert EC2Driver.never_fits(aws, Resources(cpus=1000)).startswith(
        "no instance size of provider 'aws'"
    )
    odd = ProviderConfig("o", "ec2", {**aws.options, "size": "x9.odd"})
    assert EC2Driver.never_fits(odd, Resources(cpus=1000)) is None  # its size may be large: unknown
    assert "--host is for ssh providers" in EC2Driver.never_fits(g5, Resources(host="x"))
    assert all(s.name.count(".") == 1 for s in SIZES)


@pytest.mark.parametrize(
    "key, value, expected",
    [
        (
            "image",
            "ami-123",
            r"^aws: cannot create a t3\.micro: InvalidAMIID\.NotFound: The image id "
            r"'\[ami-123\]' does not exist; fix `image:` in providers\.yml \(an AMI id of us-east-1\)$",
        ),
        (
            "size",
            "t9.huge",
            r"^aws: cannot create a t9\.huge: InvalidInstanceType\.NotFound: The instance "
            r"type 't9\.huge' does not exist; fix `size:` in providers\.yml ",
        ),
    ],
)
def test_unknown_image_or_size_is_one_line_and_leaks_nothing(
    aws: ProviderConfig, home: Path, moto: Any, key: str, value: str, expected: str
) -> None:
    drv = EC2Driver(ProviderConfig("aws", "ec2", {**aws.options, key: value}), Home(home))
    try:
        with pytest.raises(MonkeyError, match=expected) as caught:
            drv.create_node()
        assert "\n" not in str(caught.value) and not isinstance(caught.value, NoCapacity)
        assert moto.instances() == []
    finally:
        drv.close()


class FaultyEndpoint:
    """An HTTP relay in front of moto that answers RunInstances with an error of EC2's (what
    moto cannot produce: quotas, capacity); every other call reaches moto unchanged."""

    def __init__(self, target: str, code: str, message: str) -> None:
        error = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}'
            f"</Code><Message>{message}</Message></Error></Errors><RequestID>r1</RequestID>"
            "</Response>"
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if b"Action=RunInstances" in body + self.path.encode():
                    status, headers, reply = 400, {"Content-Type": "text/xml"}, error
                else:
                    request = urllib.request.Request(
                        target + self.path,
                        data=body or None,
                        method=self.command,
                        headers=dict(self.headers),
                    )
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status, headers, reply = answer.status, dict(answer.headers), answer.read()
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "server",
                        "date",
                    ):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_POST = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("code", ["InstanceLimitExceeded", "InsufficientInstanceCapacity"])
def test_quota_or_capacity_is_no_capacity(
    aws: ProviderConfig, home: Path, moto: Any, code: str
) -> None:
    faulty = FaultyEndpoint(moto.endpoint, code, "You have requested more instances than allowed.")
    drv = EC2Driver(
        ProviderConfig("aws", "ec2", {**aws.options, "endpoint": faulty.endpoint}), Home(home)
    )
    try:
        with pytest.raises(
            NoCapacity,
            match=rf"^aws: cannot create a t3\.micro: {code}: You have "
            r"requested more instances than allowed\.; monkey tries again later",
        ):
            drv.create_node()
        assert moto.instances() == []
    finally:
        drv.close()
        faulty.close()


def test_instance_reached_over_ssh_with_its_key_pinned_then_forgotten(
    driver: EC2Driver, fleet: Lab, home: Path
) -> None:
    inst = driver.create_node()
    try:
        assert driver.instances() == []  # never waits: the listing and the contact run in threads
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        link = driver.transport.connect(inst.id)
        try:
            assert link.request("hello")["cpus"] >= 1
        finally:
            link.close()
        host = fleet.hosts[0]
        # its own home: the agent lives there, not in the other instances' folders
        assert (host.home / ".monkey-agent" / "agent").is_dir()
        assert driver.transport.blobs_dir(inst.id) == f"{host.home}/.monkey-agent/blobs"
        pinned = (home / "known_hosts").read_text().splitlines()
        assert pinned == [f"{inst.id} {' '.join(host.host_key_pub)}"]
        assert oct((home / "known_hosts").stat().st_mode & 0o777) == "0o600"
    finally:
        driver.destroy_node(inst.id)
    assert (home / "known_hosts").read_text() == ""
    assert inst.id not in driver.pool.hosts


def test_a_created_instance_is_reached_without_waiting_for_the_core(driver: EC2Driver) -> None:
    # The core asks for instances on its passes, which may be a second apart or more while
    # nothing else happens: the driver follows the boot and makes the first contact on its
    # own, then wakes the core.
    woken = threading.Event()
    driver.wake = woken.set
    inst = driver.create_node()
    try:

        def contacted() -> bool:  # asks nothing of the driver: reached() would contact it
            host = driver.pool.hosts.get(inst.id)
            return host is not None and host.up and host.capacity is not None

        wait_for(contacted, what="the instance to be reached with no call from the core")
        assert woken.is_set()
        assert [c.instance for c in driver.pool.reached()] == [inst.id]
    finally:
        driver.destroy_node(inst.id)


def test_changed_host_key_on_a_live_instance_is_refused(
    driver: EC2Driver, fleet: Lab, home: Path, aws: ProviderConfig
) -> None:
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        host = fleet.hosts[0]
        key = host.dir / "host_key"
        for path in (key, Path(f"{key}.pub")):
            path.unlink()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        if os.getuid() == 0:
            shutil.chown(key, host.user, host.user)
        host.restart_sshd()
        again = EC2Driver(aws, Home(home))
        try:
            with pytest.raises(
                MonkeyError,
                match=rf"^{re.escape(inst.id)} is down \(host key of {re.escape(inst.id)} has CHANGED",
            ):
                again.transport.connect(inst.id)
            assert [c.instance for c in again.instances()] == []
        finally:
            again.close()
        assert inst.id in (home / "known_hosts").read_text()  # the pin stays
    finally:
        driver.destroy_node(inst.id)


def test_describe_lists_live_instances(driver: EC2Driver, aws: ProviderConfig, home: Path) -> None:
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        store = Store(Home(home).db)
        try:
            # as the core records what the transport learnt, and each listing (which keeps it)
            for changed, reach, extra in driver.changes():
                store.record_instance(changed, reach=reach, extra=extra)
            assert store.record_instance(listed(driver, inst.id))
            recorded = store.instances("aws")
        finally:
            store.close()
        info = EC2Driver.describe(aws, recorded)
        [row] = info["hosts"]
        assert (row["instance"], row["state"], row["size"], row["spot"]) == (
            inst.id,
            "up",
            "t3.micro",
            False,
        )
        assert "127.0.0.4" in row["host"] and row["slots"] >= 1 and row["age"] is not None
        assert info["slots"] == row["slots"]
    finally:
        driver.destroy_node(inst.id)


# -- blobs: through the bucket, or over SSH without one ----------------------------------


def bucket_blobs(moto: Any, bucket: str, prefix: str = "blobs/") -> dict[str, int]:
    """Name -> number of versions stored, of every blob (or pack) in BUCKET (versioning on)."""
    pages = (
        moto.boto3("s3")
        .get_paginator("list_object_versions")
        .paginate(Bucket=bucket, Prefix=prefix)
    )
    found: dict[str, int] = {}
    for page in pages:
        for version in page.get("Versions", []):
            name = version["Key"].removeprefix(prefix)
            found[name] = found.get(name, 0) + 1
    return found


def versioned(moto: Any, bucket: str) -> None:
    """Keep every upload as a version, so that an upload of a blob stored already shows."""
    moto.boto3("s3").put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
    )


def test_blobs_reach_the_instance_through_the_bucket(
    driver: EC2Driver, aws: ProviderConfig, home: Path, moto: Any
) -> None:
    bucket = aws.options["bucket"]
    versioned(moto, bucket)
    local = BlobStore(Home(home).blobs)
    # A project's small files travel in one pack; a large file (a dataset) alone, by digest.
    code, _ = local.put_bytes(
        b"from helper import count\nprint(count(open('data.bin', 'rb').read()))\n"
    )
    helper, _ = local.put_bytes(b"def count(data):\n    return data.count(7)\n")
    payload = os.urandom(PACK_BLOB_MAX + 300_000)
    data, _ = local.put_bytes(payload)
    files = [["main.py", code, 0o644], ["helper.py", helper, 0o644], ["data.bin", data, 0o644]]
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        fields = driver.transport.prepare(inst.id, [code, data, helper, code])
        assert bucket_blobs(moto, bucket) == {data: 1}
        [pack] = bucket_blobs(moto, bucket, "packs/").values()
        assert pack == 1
        urls = fields["blob_urls"]
        assert list(urls) == [data] and urls[data][1] == len(payload)
        assert "X-Amz-Signature=" in urls[data][0]
        [[pack_url, index]] = fields["blob_packs"]
        assert "X-Amz-Signature=" in pack_url
        # each with the sha256 of the checked local copy, which the agent checks
        assert sorted(index) == sorted(
            [
                [code, local.path(code).stat().st_size, local.sha256(code)],
                [helper, local.path(helper).stat().st_size, local.sha256(helper)],
            ]
        )
        assert urls[data][2] == hashlib.sha256(payload).hexdigest()

        link = driver.transport.connect(inst.id)
        run_dir = driver.transport.run_dir(inst.id, "26-01-01-001", 1)
        try:
            link.request(
                "start",
                juid="26-01-01-001",
                attempt=1,
                run_dir=run_dir,
                env={},
                argv=["python3", "main.py"],
                blobs_dir=driver.transport.blobs_dir(inst.id),
                files=files,
                **fields,
            )
            out = Path(run_dir, "stdout.log")
            wait_for(lambda: out.exists() and out.read_text().strip(), what="the job's output")
        finally:
            link.close()
        assert out.read_text() == f"{payload.count(7)}\n"
        for digest in (code, helper, data):
            fetched = Path(driver.transport.blobs_dir(inst.id), digest[:2], digest[2:])
            assert fetched.read_bytes() == local.read_bytes(digest)
        assert driver.pool.bytes_sent() == 0  # nothing went over SSH

        # The instance has them now. Another one lacking them gets the same pack, which is
        # not uploaded again, even by a driver that never saw it.
        assert driver.transport.prepare(inst.id, [code, data, helper]) == {}
        other = driver.create_node()
        fresh = EC2Driver(aws, Home(home))
        try:
            wait_for(lambda: reached(fresh, other.id), what="the second instance to be reached")
            again = fresh.transport.prepare(other.id, [code, data, helper])
        finally:
            fresh.close()
            driver.destroy_node(other.id)
        assert [idx for _url, idx in again["blob_packs"]] == [index] and list(
            again["blob_urls"]
        ) == [data]
        assert bucket_blobs(moto, bucket) == {data: 1}
        assert list(bucket_blobs(moto, bucket, "packs/").values()) == [1]
    finally:
        driver.destroy_node(inst.id)


def test_without_a_bucket_blobs_go_over_ssh(aws: ProviderConfig, home: Path) -> None:
    entry = {k: v for k, v in aws.options.items() if k != "bucket"}
    drv = EC2Driver(ProviderConfig("aws", "ec2", entry), Home(home))
    digest, _ = BlobStore(Home(home).blobs).put_bytes(b"over ssh\n")
    inst = drv.create_node()
    try:
        wait_for(lambda: reached(drv, inst.id), what="the instance to be reached")
        assert drv.transport.prepare(inst.id, [digest]) == {}  # nothing for the agent to fetch
        assert (
            Path(drv.transport.blobs_dir(inst.id), digest[:2], digest[2:]).read_bytes()
            == b"over ssh\n"
        )
        assert drv.pool.bytes_sent() > 0
    finally:
        drv.destroy_node(inst.id)
        drv.close()


# -- end to end, through the real CLI -----------------------------------------------------


def add_aws(cli: Any, moto: Any, fleet: Lab, home: Path, *extra: str) -> None:
    proc = cli(
        "provider",
        "add",
        "aws",
        "aws",
        "--endpoint",
        moto.endpoint,
        "--region",
        moto.region,
        "--size",
        "t3.micro",
        "--image",
        moto.image,
        "--subnet-cidr",
        "127.0.0.0/24",
        "--address",
        "private",
        "--user",
        fleet.user,
        *extra,
    )
    assert proc.returncode == 0, proc.stderr
    authorize(Home(home), fleet)


def run_job(cli: Any, *argv: str) -> str:
    return json.loads(cli("run", "--json", "-p", "aws", "--", *argv, check=True).stdout)["job"]


def info(cli: Any, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def test_job_runs_on_an_instance_through_the_cli(cli, home: Path, moto: Any, fleet: Lab) -> None:
    add_aws(cli, moto, fleet, home)
    config = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]
    creator = EC2Driver(ProviderConfig("aws", "ec2", config), Home(home))
    inst = creator.create_node()  # what the core's provisioning does (tested below) ...
    store = Store(Home(home).db)
    try:
        store.record_instance(inst, detail="created")  # ... and records, so the core keeps it
    finally:
        store.close()
    try:
        juid = run_job(cli, "sh", "-c", "echo hi from $(hostname -I 2>/dev/null || echo ec2)")
        wait_for(
            lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the job to end",
        )
        assert info(cli, juid)["state"] == "succeeded", info(cli, juid)
        assert info(cli, juid)["instance"] == inst.id
        assert cli("logs", juid, check=True).stdout.startswith("hi from ")
        listing = json.loads(cli("list", "providers", "--json", check=True).stdout)
        [aws] = [p for p in listing["providers"] if p["name"] == "aws"]
        [row] = aws["hosts"]
        assert (row["instance"], row["state"], row["size"]) == (inst.id, "up", "t3.micro")
        table = cli("list", "providers", check=True).stdout
        assert re.search(rf"{re.escape(inst.id)} .* up .* t3\.micro", table), table
    finally:
        cli("daemon", "stop")
        creator.destroy_node(inst.id)
        creator.close()


def test_core_creates_an_instance_for_a_queued_job(cli, home: Path, moto: Any, fleet: Lab) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    try:
        juid = run_job(cli, "echo", "hi")
        wait_for(
            lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
            timeout=30,
            what="the job to end",
        )
        assert info(cli, juid)["state"] == "succeeded", info(cli, juid)
        assert cli("logs", juid, check=True).stdout == "hi\n"
        assert info(cli, juid)["instance"].startswith("aws/i-")
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")

        def recorded() -> list[dict[str, Any]]:
            store = Store(home / "monkey.db")
            try:
                return store.instances("aws")
            finally:
                store.close()

        # The cloud's termination is recorded once the destroy call's outcome is back.
        wait_for(
            lambda: all(r["state"] == "terminated" for r in recorded()),
            timeout=30,
            what="the termination to be recorded",
        )
        [row] = recorded()  # one instance in all, made for the job
        assert row["id"] == info(cli, juid)["instance"]
        store = Store(home / "monkey.db")
        moves = [(e["old"], e["new"]) for e in store.instance_events(row["id"])]
        store.close()
        assert moves[0] == (None, "pending") and moves[-1][1] == "terminated"
    finally:
        cli("daemon", "stop")
        ec2 = moto.boto3("ec2")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            ec2.terminate_instances(InstanceIds=left)


class GatedEndpoint:
    """A proxy to moto that holds every request whose path holds HELD until ``release()``."""

    def __init__(self, target: str, held: str) -> None:
        self.release_event, self.holding = threading.Event(), threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's names)
                if held in self.path:
                    gate.holding.set()
                    gate.release_event.wait(60)
                body = self._body()
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"
                }
                request = urllib.request.Request(
                    target + self.path, data=body or None, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status, headers, reply = answer.status, dict(answer.headers), answer.read()
                except urllib.error.HTTPError as e:
                    status, headers, reply = e.code, dict(e.headers), e.read()
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "server",
                        "date",
                    ):
                        self.send_header(name, value)
                length = headers.get("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(reply)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return body

            do_POST = do_PUT = do_HEAD = do_DELETE = do_GET

        gate = self
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.release_event.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def test_the_next_job_starts_while_the_last_ones_results_come_back(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    # One instance, and each job takes all of it. The first job's output comes back from the
    # bucket after it exited: its slot is free meanwhile, and the next job runs at once.
    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    gate = GatedEndpoint(moto.endpoint, "/results/objects/")
    config = yaml.safe_load((home / "providers.yml").read_text())
    config["providers"]["aws"]["endpoint"] = gate.endpoint
    (home / "providers.yml").write_text(yaml.safe_dump(config))
    try:
        first = json.loads(
            cli(
                "run",
                "--json",
                "-p",
                "aws",
                "--cpus",
                "2",
                "--outputs",
                "result.txt",
                "--",
                "sh",
                "-c",
                "echo 42 > result.txt",
                check=True,
            ).stdout
        )["job"]
        assert gate.holding.wait(60), "the first job's output was never fetched"
        second = json.loads(
            cli(
                "run", "--json", "-p", "aws", "--cpus", "2", "--", "echo", "second", check=True
            ).stdout
        )["job"]
        wait_for(
            lambda: info(cli, second)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the second job to end while the first one's output is held",
        )
        assert info(cli, second)["state"] == "succeeded", info(cli, second)
        time.sleep(6)  # past the heartbeat timeout (4 s): an exited job sends none, and is not lost
        assert info(cli, first)["state"] == "running"  # it ends once its results are back
        daemon_log = (home / "daemon.log").read_text()
        assert "silent" not in daemon_log and "no heartbeat" not in daemon_log, daemon_log
        gate.release()
        wait_for(
            lambda: info(cli, first)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the first job to end",
        )
        assert info(cli, first)["state"] == "succeeded", info(cli, first)
        assert (home / "runs" / first / "1" / "work" / "result.txt").read_text() == "42\n"
    finally:
        gate.release()
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
        gate.close()


def test_job_code_goes_through_the_bucket_and_no_url_is_kept(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    bucket = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]["bucket"]
    versioned(moto, bucket)
    Path("main.py").write_text("import words; print(words.WORD)\n")
    Path("words.py").write_text("WORD = 'fetched from the bucket'\n")
    try:
        first = run_job(cli, "python3", "main.py")
        wait_for(
            lambda: info(cli, first)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the first job to end",
        )
        assert info(cli, first)["state"] == "succeeded", info(cli, first)
        assert cli("logs", first, check=True).stdout == "fetched from the bucket\n"
        store = Store(home / "monkey.db")
        try:
            snapshot = store.get_job(first).snapshot
        finally:
            store.close()
        code = {f[1] for f in json.loads(BlobStore(home / "blobs").read_bytes(snapshot))["files"]}
        # the project's two files went up as one pack, fetched with one request
        assert len(code) == 2 and bucket_blobs(moto, bucket) == {}
        [(pack, versions)] = bucket_blobs(moto, bucket, "packs/").items()
        stored = moto.boto3("s3").get_object(Bucket=bucket, Key=f"packs/{pack}")["Body"].read()
        assert versions == 1 and stored == b"".join(
            BlobStore(home / "blobs").read_bytes(d) for d in sorted(code)
        )
        instance_home = fleet.hosts[0].home
        on_instance = {
            f"{p.parent.name}{p.name}"
            for p in instance_home.rglob("*")
            if p.parent.parent.name == "blobs"
        }
        assert code <= on_instance
        daemon_log = (home / "daemon.log").read_text()
        assert not re.search(r"sent \d+ blobs", daemon_log), daemon_log  # none over SSH

        second = run_job(cli, "python3", "main.py")
        wait_for(
            lambda: info(cli, second)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the second job to end",
        )
        assert info(cli, second)["state"] == "succeeded", info(cli, second)
        assert info(cli, second)["instance"] == info(cli, first)["instance"]
        # nothing uploaded again
        assert bucket_blobs(moto, bucket) == {} and bucket_blobs(moto, bucket, "packs/") == {
            pack: 1
        }
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
    # The presigned URLs went in start requests only: no file keeps one (logs, agent logs,
    # the database).
    for root in (home, instance_home):
        for path in root.rglob("*"):
            if path.is_file():
                assert b"X-Amz-Signature" not in path.read_bytes(), path


def test_a_blob_damaged_on_the_instance_and_in_the_bucket_is_replaced(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    bucket = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]["bucket"]
    versioned(moto, bucket)
    Path("main.py").write_text("import words; print(words.WORD)\n")
    Path("words.py").write_text("WORD = 'fetched from the bucket'\n")
    try:
        first = run_job(cli, "python3", "main.py")
        wait_for(
            lambda: info(cli, first)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the first job to end",
        )
        assert info(cli, first)["state"] == "succeeded", info(cli, first)
        blobs = BlobStore(home / "blobs")
        code = {
            rel: blobs.path(__import__("blake3").blake3(Path(rel).read_bytes()).hexdigest())
            for rel in ("main.py", "words.py")
        }
        copies = {
            rel: next(fleet.hosts[0].home.rglob(f"blobs/{p.parent.name}/{p.name}"))
            for rel, p in code.items()
        }
        [(pack, _)] = bucket_blobs(moto, bucket, "packs/").items()
        s3 = moto.boto3("s3")
        good = s3.get_object(Bucket=bucket, Key=f"packs/{pack}")["Body"].read()
        # The instance's copies and the bucket's are damaged (the same sizes): the core
        # finds the copies damaged when it asks what the instance lacks, the agent finds the
        # bucket's when it fetches them again; it is stored again, and the job runs.
        for copy in copies.values():
            copy.chmod(0o600)
            copy.write_bytes(copy.read_bytes().replace(b"WORD", b"WERD"))
        s3.put_object(Bucket=bucket, Key=f"packs/{pack}", Body=good.replace(b"WORD", b"WERD"))
        second = run_job(cli, "python3", "main.py")
        wait_for(
            lambda: info(cli, second)["state"] in ("succeeded", "failed"),
            timeout=90,
            what="the second job to end",
        )
        assert info(cli, second)["state"] == "succeeded", info(cli, second)
        assert "fetched from the bucket\n" in cli("logs", second, check=True).stdout
        for rel, copy in copies.items():
            assert copy.read_bytes() == Path(rel).read_bytes()
        versions = s3.list_object_versions(Bucket=bucket, Prefix=f"packs/{pack}")["Versions"]
        assert len(versions) == 3  # stored, damaged, stored again
        assert s3.get_object(Bucket=bucket, Key=f"packs/{pack}")["Body"].read() == good
        log = (home / "daemon.log").read_text()
        digests = [p.parent.name + p.name for p in code.values()]
        assert any(f"damaged blob {d} in the bucket" in log for d in digests), log
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_core_terminates_a_tagged_instance_it_has_no_record_of(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    """An instance created while the core was dying (never recorded) is this home's, by
    its tags: the next core terminates it, and leaves other homes' and untagged ones."""
    add_aws(cli, moto, fleet, home)
    config = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]
    stray = EC2Driver(ProviderConfig("aws", "ec2", config), Home(home)).create_node()
    ec2 = moto.boto3("ec2")
    other = ec2.run_instances(ImageId=moto.image, InstanceType="t3.micro", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    try:
        start_core(home)
        wait_for(
            lambda: [i["InstanceId"] for i in moto.instances()] == [other],
            timeout=30,
            what="the stray instance to be terminated",
        )
        assert stray.extra["node"] not in [i["InstanceId"] for i in moto.instances()]
    finally:
        cli("daemon", "stop")
        ec2.terminate_instances(InstanceIds=[other])


def test_core_killed_while_a_job_runs_on_an_instance_reattaches(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    gates = Path(tempfile.mkdtemp(prefix="monkey-gate-"))  # the instance's user may not see ours
    os.chmod(gates, 0o777)
    gate = gates / "gate"
    try:
        juid = run_job(
            cli, "sh", "-c", f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo down"
        )
        wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
        kill_core(home)
        gate.touch()  # it ends while no core runs
        start_core(home)
        wait_for(
            lambda: info(cli, juid)["state"] == "succeeded",
            timeout=60,
            what="the job to be followed again",
        )
        assert cli("logs", juid, check=True).stdout == "up\ndown\n"
        assert len(info(cli, juid)["attempts_detail"]) == 1
        store = Store(Home(home).db)
        try:
            assert len(store.instances("aws")) == 1  # the same instance, not a second one
        finally:
            store.close()
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
        shutil.rmtree(gates, ignore_errors=True)


def test_a_failed_creation_says_why_on_the_waiting_job_and_leaks_nothing(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    add_aws(cli, moto, fleet, home)
    entry = yaml.safe_load((home / "providers.yml").read_text())
    entry["providers"]["aws"]["image"] = "ami-00000000"  # deregistered since
    (home / "providers.yml").write_text(yaml.safe_dump(entry))
    try:
        juid = run_job(cli, "true")
        wait_for(lambda: info(cli, juid).get("waiting"), timeout=30, what="the reason it waits")
        assert (
            "InvalidAMIID" in info(cli, juid)["waiting"] and "image" in info(cli, juid)["waiting"]
        )
        assert info(cli, juid)["state"] == "queued"
        shown = cli("info", "job", juid, check=True).stdout
        assert "waiting: aws: cannot create" in shown
        assert "aws: cannot create" in cli("list", "providers", check=True).stdout
        assert moto.instances() == []
    finally:
        cli("daemon", "stop")


def test_an_unreachable_cloud_says_why_on_the_waiting_job(cli, home: Path, moto: Any) -> None:
    """Nothing listens at the endpoint: the job waits, and says why in one line."""
    entry = {
        "type": "ec2",
        "region": moto.region,
        "endpoint": "http://127.0.0.1:9",
        "size": "t3.micro",
        "image": moto.image,
        "key": str(home / "no-key"),
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"aws": entry}}))
    try:
        juid = run_job(cli, "true")
        wait_for(lambda: info(cli, juid).get("waiting"), timeout=30, what="the reason it waits")
        assert info(cli, juid)["waiting"] == (
            "aws: cannot list instances: cannot reach "
            "http://127.0.0.1:9 (Connection refused); check "
            "the network or `endpoint:`"
        )
        assert info(cli, juid)["state"] == "queued"
        shown = cli("list", "providers", check=True).stdout
        assert "\naws: cannot list instances: cannot reach http://127.0.0.1:9" in shown
        log = (home / "daemon.log").read_text()
        assert log.count("cannot reach http://127.0.0.1:9") <= 3  # once per change, not a flood
    finally:
        cli("daemon", "stop")


def test_an_instance_terminated_from_outside_ends_its_attempt_lost(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    """A spot reclaim (or a console click): the cloud lists the machine terminated while its
    agent still answers here; the attempt ends `lost` from the listing, not from silence."""
    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    try:
        juid = run_job(cli, "sh", "-c", "echo up; sleep 300")
        wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
        node = info(cli, juid)["instance"].split("/", 1)[1]
        moto.boto3("ec2").terminate_instances(InstanceIds=[node])
        wait_for(lambda: info(cli, juid)["state"] == "lost", timeout=30, what="the attempt to end")
        assert info(cli, juid)["attempts_detail"][0]["reason"] == "its instance was terminated"
    finally:
        cli("daemon", "stop")


def test_an_orphaned_instance_powers_itself_off_and_the_core_says_why(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    """The core dies (a laptop that sleeps): the instance's agent, with no job and no word from
    it for `orphan_timeout`, runs the shutdown command (here a hook that leaves a mark; EC2
    then terminates the instance, launched with shutdown behaviour `terminate`); the core
    that comes back records it terminated, and says why."""
    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    marks = Path(tempfile.mkdtemp(prefix="monkey-orphan-"))  # the instance's user writes there
    os.chmod(marks, 0o777)
    mark = marks / "powered-off"
    entry = yaml.safe_load((home / "providers.yml").read_text())
    entry["providers"]["aws"].update(orphan_timeout=5, shutdown_command=f"echo bye > {mark}")
    (home / "providers.yml").write_text(yaml.safe_dump(entry))
    ec2 = moto.boto3("ec2")
    try:
        juid = run_job(cli, "echo", "hi")
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=60, what="the job to end")
        instance = info(cli, juid)["instance"]
        node = instance.split("/", 1)[1]
        attribute = ec2.describe_instance_attribute(
            InstanceId=node, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert attribute["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        # While the core runs, its pings keep the idle instance up, however quiet the link.
        store = Store(Home(home).db)
        try:
            wait_for(
                lambda: (
                    (row := store.instances("aws")[0])["idle_since"] is not None
                    and time.time() - row["idle_since"] > 12
                ),
                timeout=60,
                what="a long idle spell",
            )
        finally:
            store.close()
        assert not mark.exists()
        kill_core(home)
        wait_for(mark.exists, timeout=60, what="the orphaned agent's shutdown command")
        assert mark.read_text() == "bye\n"
        [host] = [h for h in fleet.hosts if (h.home / ".monkey-agent" / "agent.log").exists()]
        said = (host.home / ".monkey-agent" / "agent.log").read_text()
        assert re.search(
            r"orphaned: no job for \d+s and no request from the core for \d+s "
            r"\(orphan_timeout 5s\): powering the machine off",
            said,
        ), said
        ec2.terminate_instances(InstanceIds=[node])  # what EC2 does after that shutdown
        start_core(home)

        def ended() -> list[dict[str, Any]]:
            store = Store(Home(home).db)
            try:
                return [e for e in store.instance_events(instance) if e["new"] == "terminated"]
            finally:
                store.close()

        wait_for(ended, timeout=60, what="the termination to be recorded")
        why = "its agent powered it off: no job and no word from the core for 5s (orphan_timeout)"
        assert ended()[0]["detail"] == why
        assert f"{instance} is gone: {why}" in (home / "daemon.log").read_text()
        shown = cli("list", "providers", "--monkey-instances", "--all", check=True).stdout
        assert re.search(rf"{re.escape(instance)} +aws +terminated .*{re.escape(why)}", shown), (
            shown
        )
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            ec2.terminate_instances(InstanceIds=left)
        shutil.rmtree(marks, ignore_errors=True)


def test_in_job_api_on_an_instance_tracks_as_locally(
    cli, home: Path, moto: Any, fleet: Lab
) -> None:
    """`import monkey; monkey.log(...)` in a job on an instance whose python has no monkey:
    tracked exactly as the same job on the local provider."""
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    Path("train.py").write_text(SCRIPT)
    try:
        remote = run_job(cli, "python3", "train.py")
        local = json.loads(cli("run", "--json", "--", "python3", "train.py", check=True).stdout)[
            "job"
        ]
        for juid in (remote, local):
            wait_for(
                lambda j=juid: info(cli, j)["state"] in ("succeeded", "failed"),
                timeout=60,
                what="the job to end",
            )
            assert info(cli, juid)["state"] == "succeeded", cli("logs", "--stderr", juid).stdout
        assert info(cli, remote)["instance"].startswith("aws/i-")
        assert check_tracked(cli, remote) == check_tracked(cli, local)
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
