"""The `gce` provider against a stateful fake of the compute API (tests/fake_gce.py) and the
real fake-gcs-server, each instance reached over real SSH.

The fake gives instance N of a test the internal address 127.0.0.(N+3) (never reused), so
with `address: private` the `fleet` of tests/test_ec2.py (one sshd per address, own host
key and home folder each) serves them. Everything above the address is real: libcloud's
GCENodeDriver, the agent, SSH, the bucket and its signed URLs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from monkey.config import Home, ProviderConfig
from monkey.drivers import gce_setup
from monkey.drivers.base import NoCapacity
from monkey.drivers.cloud import USER_DATA
from monkey.drivers.gce import GCEDriver, list_price, setup
from monkey.models import InstanceState, MonkeyError, Resources
from monkey.snapshot import BlobStore
from monkey.storage.bucket import PACK_BLOB_MAX
from monkey.store import Store
from tests.conftest import kill_core, start_core, wait_for
from tests.driver_contract import CloudContract, Target, serve
from tests.fake_gce import FakeGCE, FakeGCS, service_account_file
from tests.in_job import SCRIPT, check_tracked
from tests.sshd import Lab
from tests.test_ec2 import authorize, fleet  # noqa: F401 (a fixture)

ZONE = "us-central1-a"


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGCS]:
    server = FakeGCS()
    yield server
    server.close()


@pytest.fixture
def gce(gcs_server: FakeGCS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGCE]:
    """An empty fake compute API and an empty fake-gcs-server; nothing Google's is reached
    (metadata probes go to a closed loopback port). The test must leave no instance."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    gcs_server.reset()
    fake = FakeGCE()
    fake.gcs = gcs_server  # type: ignore[attr-defined]
    fake.key = service_account_file(tmp_path / "sa.json")  # type: ignore[attr-defined]
    gcs_server.gate.keys.clear()
    gcs_server.gate.refused.clear()
    gcs_server.trust(fake.key)
    yield fake
    left = [(i["name"], i["status"]) for i in fake.listed()]
    fake.close()
    assert not left, f"the test left instances: {left}"
    assert not gcs_server.gate.refused, f"GCS would have refused: {gcs_server.gate.refused}"


def setup_gcp(home: Path, gce: Any, fleet: Lab, **options: Any) -> ProviderConfig:
    """Provider `gcp` made as `monkey provider add gcp` makes it, recorded in providers.yml;
    the fleet lets its key in."""
    h = Home(home).ensure()
    wanted = {
        "credentials": gce.key,
        "zones": [ZONE],
        "size": "e2-small",
        "image": "debian-12",
        "endpoint": gce.endpoint,
        "storage_endpoint": gce.gcs.endpoint,
        "address": "private",
        "user": fleet.user,
        **options,
    }
    entry = setup(h, "gcp", gce_setup.entry_from(wanted, {}), say=lambda _: None)
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"gcp": entry}}))
    authorize(h, fleet, "gcp")
    return ProviderConfig("gcp", "gce", entry)


@pytest.fixture
def gcp(home: Path, gce: FakeGCE, fleet: Lab) -> ProviderConfig:
    return setup_gcp(home, gce, fleet, max_instances=2)


@pytest.fixture
def driver(gcp: ProviderConfig, home: Path) -> Iterator[GCEDriver]:
    drv = GCEDriver(gcp, Home(home))
    yield drv
    drv.close()


class TestGCEContract(CloudContract):
    """The driver contract against the fake compute API and fake-gcs-server, its instances
    reached over a real sshd."""

    @pytest.fixture
    def target(self, gcp: ProviderConfig, home: Path) -> Iterator[Target]:
        yield from serve(gcp, home, [])


def reached(drv: GCEDriver, instance: str) -> bool:
    return any(c.instance == instance for c in drv.instances())


def test_create_list_destroy(
    driver: GCEDriver, gce: FakeGCE, home: Path, gcp: ProviderConfig
) -> None:
    inst = driver.create_node(options={"preemptible": True})
    assert inst.id.startswith("gcp/monkey-gcp-") and inst.provider == "gcp"
    assert (inst.size, inst.spot, inst.address, inst.extra["zone"]) == (
        "e2-small",
        True,
        "127.0.0.4",
        ZONE,
    )
    [raw] = gce.listed()
    assert raw["labels"]["monkey-home"] == Home(home).home_id()
    assert raw["labels"]["monkey-provider"] == "gcp" and raw["scheduling"]["preemptible"] is True
    metadata = {i["key"]: i["value"] for i in raw["metadata"]["items"]}
    assert metadata["startup-script"] == USER_DATA
    public = (Home(home).keys / "gcp.pub").read_text().strip()
    assert metadata["ssh-keys"] == f"{gcp.options['user']}:{public}"
    assert raw["tags"]["items"] == [gce_setup.network_tag("gcp")]

    [found] = driver.list_nodes()
    assert (found.id, found.state, found.address) == (inst.id, InstanceState.RUNNING, "127.0.0.4")
    # Priced as GCE lists a preemptible e2-small in us-central1: half a vCPU and 2 GiB.
    assert found.price == pytest.approx(0.003527, abs=1e-6)
    gce.preempt(ZONE, raw["name"])  # GCE stops a preempted instance: listed stopped
    assert driver.list_nodes()[0].state == InstanceState.STOPPED
    driver.destroy_node(inst.id)
    assert driver.list_nodes() == [] and gce.listed() == []
    driver.destroy_node(inst.id)  # idempotent


def test_list_prices_are_gces_own() -> None:
    """GCE's on-demand and preemptible list prices in us-central1 (libcloud's price list),
    a shared-core type billed its fraction of a vCPU; an entry's ``prices:`` wins; a type
    whose rates the list lacks (GPU families) is unknown."""
    assert list_price("e2-standard-2", "us-central1") == pytest.approx(0.067011, abs=1e-6)
    assert list_price("n2-standard-4", "us-central1") == pytest.approx(0.194236, abs=1e-6)
    assert list_price("e2-micro", "us-central1") == pytest.approx(0.008376, abs=1e-6)
    assert list_price("e2-standard-2", "us-central1", preemptible=True) < 0.067011 / 3
    assert list_price("g2-standard-4", "us-central1") is None
    assert list_price("e2-standard-2", "mars-north1") is None


def test_an_entrys_prices_win(gcp: ProviderConfig, home: Path) -> None:
    entry = {**gcp.options, "prices": {"e2-small": 0.5}}
    drv = GCEDriver(ProviderConfig(gcp.name, gcp.type, entry), Home(home))
    try:
        assert (drv.price("e2-small"), drv.price("e2-small", spot=True)) == (0.5, 0.5)
        assert drv.price("e2-medium") == pytest.approx(0.033506, abs=1e-6)
    finally:
        drv.close()


def test_labels_filter_the_listing(
    driver: GCEDriver, gcp: ProviderConfig, gce: FakeGCE, tmp_path: Path
) -> None:
    inst = driver.create_node()
    other = GCEDriver(gcp, Home(tmp_path / "other-home").ensure())
    try:
        assert other.list_nodes() == []  # another home's instance is not listed there
        assert [i.id for i in driver.list_nodes()] == [inst.id]
    finally:
        other.close()
        driver.destroy_node(inst.id)


def test_size_for_and_slots(driver: GCEDriver) -> None:
    assert driver.size_for(Resources(cpus=4)) == "e2-standard-4"
    assert driver.size_slots(None) == 2


@pytest.mark.parametrize(
    "options, expected",
    [
        (
            {"image": "no-such-image"},
            r"^gcp: cannot create a e2-small: image no-such-image not found; fix `image:`",
        ),
        (
            {"size": "x9-huge"},
            r"^gcp: cannot create a x9-huge: machine type x9-huge does not exist in "
            r"us-central1-a; fix `size:`",
        ),
    ],
)
def test_bad_image_or_size_is_one_line_and_leaks_nothing(
    driver: GCEDriver, gce: FakeGCE, options: dict[str, str], expected: str
) -> None:
    with pytest.raises(MonkeyError, match=expected) as caught:
        driver.create_node(options=options)
    assert "\n" not in str(caught.value) and not isinstance(caught.value, NoCapacity)
    assert gce.listed() == []


@pytest.mark.parametrize("leak", [False, True])
def test_quota_is_no_capacity_and_a_half_made_instance_is_deleted(
    driver: GCEDriver, gce: FakeGCE, leak: bool
) -> None:
    gce.fail_next_insert(
        "QUOTA_EXCEEDED", "Quota 'CPUS' exceeded. Limit: 8.0 in region us-central1.", leak
    )
    with pytest.raises(
        NoCapacity,
        match=r"^gcp: cannot create a e2-small: QUOTA_EXCEEDED: Quota "
        r"'CPUS' exceeded\. .*; monkey tries again later",
    ):
        driver.create_node()
    assert gce.listed() == []


def test_next_zone_when_the_first_has_no_capacity(gce: FakeGCE, home: Path, fleet: Lab) -> None:
    config = setup_gcp(home, gce, fleet, zones=[ZONE, "us-central1-b"])
    drv = GCEDriver(config, Home(home))
    try:
        gce.fail_next_insert("ZONE_RESOURCE_POOL_EXHAUSTED", "no e2-small in us-central1-a")
        inst = drv.create_node()
        assert inst.extra["zone"] == "us-central1-b"
        drv.destroy_node(inst.id)
    finally:
        drv.close()


def test_libclouds_token_cache_lives_in_monkey_home(
    gcp: ProviderConfig, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against Google (no `endpoint`), libcloud caches its OAuth2 token under MONKEY_HOME,
    0600, not in ~/.google_libcloud_auth.*; here a cached token spares the token request."""
    import datetime

    from libcloud.common import google
    from libcloud.compute.drivers.gce import GCENodeDriver

    from monkey.drivers.gce_api import gce_node_driver, service_account, token_cache

    def no_token(*_: Any) -> None:
        raise AssertionError("asked Google for a token")

    monkeypatch.setattr(google.GoogleServiceAcctAuthConnection, "get_new_token", no_token)
    monkeypatch.setattr(GCENodeDriver, "ex_get_zone", lambda *_: None)  # no call to Google
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    (tmp_path / "user-home").mkdir()
    entry = {k: v for k, v in gcp.options.items() if k != "endpoint"}
    cache = token_cache(Home(home), service_account(entry["credentials"]))
    later = datetime.datetime.utcnow() + datetime.timedelta(hours=1)
    cache.write_text(
        json.dumps(
            {
                "access_token": "cached",
                "token_type": "Bearer",
                "expire_time": later.strftime(google.UTC_TIMESTAMP_FORMAT),
            }
        )
    )
    api = gce_node_driver(entry, Home(home))
    credential = api.connection.oauth2_credential
    assert credential.access_token == "cached" and Path(credential.credential_file) == cache
    cache.unlink()
    credential._write_token_to_file()  # as libcloud does after each new token
    assert oct(cache.stat().st_mode & 0o777) == "0o600" and cache.parent == Home(home).private
    assert oct(cache.parent.stat().st_mode & 0o777) == "0o700"
    assert list((tmp_path / "user-home").iterdir()) == []


def test_instance_reached_and_blobs_through_the_bucket(
    driver: GCEDriver, gcp: ProviderConfig, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    local = BlobStore(Home(home).blobs)
    code, _ = local.put_bytes(b"from helper import size\nprint(size('data.bin'))\n")
    helper, _ = local.put_bytes(b"def size(path):\n    return len(open(path, 'rb').read())\n")
    data, _ = local.put_bytes(os.urandom(PACK_BLOB_MAX + 1))
    inst = driver.create_node()
    try:
        wait_for(lambda: reached(driver, inst.id), what="the instance to be reached")
        fields = driver.transport.prepare(inst.id, [code, helper, data])
        bucket = gcp.options["bucket"]
        assert sorted(gce.gcs.objects(bucket, "blobs/")) == [f"blobs/{data}"]  # the code: packed
        [pack] = gce.gcs.objects(bucket, "packs/").values()
        assert pack == b"".join(local.read_bytes(d) for d in sorted([code, helper]))
        assert "X-Goog-Signature=" in fields["blob_urls"][data][0]
        assert "X-Goog-Signature=" in fields["blob_packs"][0][0]
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
                files=[
                    ["main.py", code, 0o644],
                    ["helper.py", helper, 0o644],
                    ["data.bin", data, 0o644],
                ],
                **fields,
            )
            out = Path(run_dir, "stdout.log")
            wait_for(lambda: out.exists() and out.read_text().strip(), what="the job's output")
        finally:
            link.close()
        assert out.read_text() == f"{PACK_BLOB_MAX + 1}\n"
        assert driver.pool.bytes_sent() == 0  # nothing went over SSH
        assert str(fleet.hosts[0].home) in run_dir
    finally:
        driver.destroy_node(inst.id)


def test_workers_upload_results_through_a_signed_post_policy(gce: FakeGCE, tmp_path: Path) -> None:
    """The agent's uploader posts under the form's prefix; GCS's checks (the gate's) refuse
    a key outside it, a forged signature and an expired form."""
    from monkey.client_agent.results import Results
    from monkey.storage.gcs import GCSStorage

    storage = GCSStorage("results", credentials=gce.key, endpoint=gce.gcs.endpoint)
    storage.ensure_bucket()
    form = storage.upload_form("runs/26-01-01-001/results", expires=600)
    assert form["url"] == f"{gce.gcs.endpoint}/results" and "private_key" not in json.dumps(form)
    state = tmp_path / "ckpt" / "state.json"
    state.parent.mkdir()
    state.write_text('{"epoch": 3}')
    uploader = Results(
        {**form, "prefix": "runs/26-01-01-001/results", "dirs": {"checkpoint": str(state.parent)}},
        "26-01-01-001",
        1,
        str(tmp_path),
    )
    sent = uploader.upload()
    assert sent["files"] == 1 and sent["bytes"] == len('{"epoch": 3}')
    stored = gce.gcs.objects("results", "runs/26-01-01-001/results/")  # type: ignore[attr-defined]
    manifest = json.loads(stored["runs/26-01-01-001/results/manifest.json"])
    sha = manifest["files"]["checkpoint/state.json"][0]
    back = tmp_path / "back.json"
    assert storage.get_file(f"runs/26-01-01-001/results/objects/{sha}", back)
    assert back.read_text() == '{"epoch": 3}'
    with urllib.request.urlopen(
        storage.get_url(f"runs/26-01-01-001/results/objects/{sha}", 60)
    ) as got:
        assert got.read() == b'{"epoch": 3}'

    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    expired = storage.upload_form("runs/26-01-01-001/results", expires=-1)
    forged = {**form, "fields": {**form["fields"], "x-goog-signature": "00" * 256}}
    for bad, prefix in (
        (form, "runs/26-01-01-002/results"),
        (forged, "runs/26-01-01-001/results"),
        (expired, "runs/26-01-01-001/results"),
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            Results({**bad, "prefix": prefix}, "26-01-01-001", 1, "")._post_file(
                "objects/y", str(blob)
            )
        assert refused.value.code == 403
    assert [r.split(": ", 1)[1] for r in gce.gcs.gate.refused] == [  # type: ignore[attr-defined]
        "the form's key='runs/26-01-01-002/results/objects/y' does not meet "
        "['starts-with', '$key', 'runs/26-01-01-001/results/']",
        "the signature does not match",
        "the policy has expired",
    ]
    gce.gcs.gate.refused.clear()  # type: ignore[attr-defined]
    assert sorted(gce.gcs.objects("results")) == sorted(stored)  # type: ignore[attr-defined]


# -- end to end, through the real CLI -----------------------------------------------------


def add_gcp(cli: Any, gce: FakeGCE, fleet: Lab, home: Path, *extra: str) -> Any:
    proc = cli(
        "provider",
        "add",
        "gcp",
        "gcp",
        "--endpoint",
        gce.endpoint,
        "--credentials",
        gce.key,
        "--storage-endpoint",
        gce.gcs.endpoint,
        "--zone",
        ZONE,
        "--size",
        "e2-small",
        "--image",
        "debian-12",
        "--address",
        "private",
        "--user",
        fleet.user,
        *extra,
    )
    assert proc.returncode == 0, proc.stderr
    authorize(Home(home), fleet, "gcp")
    return proc


def run_job(cli: Any, *argv: str) -> str:
    return json.loads(cli("run", "--json", "-p", "gcp", "--", *argv, check=True).stdout)["job"]


def info(cli: Any, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def test_provider_add_gcp_creates_then_reuses(cli, home: Path, gce: FakeGCE, fleet: Lab) -> None:
    first = add_gcp(cli, gce, fleet, home, "--network", "monkey-net")
    entry = yaml.safe_load((home / "providers.yml").read_text())["providers"]["gcp"]
    assert "created network monkey-net" in first.stdout
    assert f"created bucket {entry['bucket']}" in first.stdout
    rule = gce.firewalls[entry["firewall"]]
    assert rule["sourceRanges"] == ["127.0.0.1/32"] and rule["targetTags"] == ["monkey-gcp"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert entry["project"] == "monkey-test" and entry["credentials"] == gce.key
    assert oct(os.stat(entry["key"]).st_mode & 0o777) == "0o600"
    assert "BEGIN PRIVATE KEY" not in (home / "providers.yml").read_text()
    second = add_gcp(cli, gce, fleet, home, "--max-instances", "3")
    assert "created" not in second.stdout and "reusing network monkey-net" in second.stdout
    again = yaml.safe_load((home / "providers.yml").read_text())["providers"]["gcp"]
    assert again == {**entry, "max_instances": 3}
    bad = cli(
        "provider",
        "add",
        "gcp",
        "g2",
        "--endpoint",
        gce.endpoint,
        "--credentials",
        gce.key,
        "--zone",
        ZONE,
        "--size",
        "e2-small",
        "--image",
        "nope-image",
    )
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0
    assert "image nope-image not found; pass --image" in bad.stderr


def test_core_creates_an_instance_code_goes_through_gcs_then_idle_termination(
    cli, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    bucket = yaml.safe_load((home / "providers.yml").read_text())["providers"]["gcp"]["bucket"]
    Path("main.py").write_text("import words; print(words.WORD)\n")
    Path("words.py").write_text("WORD = 'fetched from gcs'\n")
    try:
        juid = run_job(cli, "python3", "main.py")
        wait_for(
            lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the job to end",
        )
        assert info(cli, juid)["state"] == "succeeded", info(cli, juid)
        assert cli("logs", juid, check=True).stdout == "fetched from gcs\n"
        assert info(cli, juid)["instance"].startswith("gcp/monkey-gcp-")
        assert len(gce.gcs.objects(bucket, "packs/")) == 1  # the project's two files, packed
        assert not re.search(r"sent \d+ blobs", (home / "daemon.log").read_text())  # none over SSH
        wait_for(lambda: gce.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
    for path in home.rglob("*"):
        if path.is_file():
            assert b"X-Goog-Signature" not in path.read_bytes(), path


def test_a_spend_quota_binds_on_gces_list_prices(cli, home: Path, gce: FakeGCE, fleet: Lab) -> None:
    """With no `prices:` in the entry, a job's spend rate comes from GCE's list price: a
    spend quota below an e2-small's (the entry's size) holds the job and no machine is
    made; raised, it runs on a machine priced in the listing."""
    from monkey.store.db import local_user

    me = local_user()
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    try:
        cli("server", "quota", "set", me, "--provider", "gcp", "--spend", "0.01", check=True)
        juid = json.loads(
            cli(
                "run", "--json", "-p", "gcp", "--cpus", "2", "--", "sleep", "600", check=True
            ).stdout
        )["job"]
        reason = f"over quota: {me} spends $0.00 of $0.0100/h on gcp; this job adds $0.0168/h"
        wait_for(lambda: info(cli, juid)["held"] == reason, timeout=60, what="the job held")
        assert gce.listed() == []  # no machine is made for a held job
        cli("server", "quota", "set", me, "--provider", "gcp", "--spend", "0.02", check=True)
        wait_for(lambda: info(cli, juid)["state"] == "running", timeout=90, what="the job")
        [row] = json.loads(
            cli("list", "providers", "--monkey-instances", "--json", check=True).stdout
        )["instances"]
        assert (row["size"], row["price"]) == ("e2-small", pytest.approx(0.016753, abs=1e-6))
        [use] = json.loads(cli("list", "providers", "--json", check=True).stdout)["quotas"]
        assert use["spend"] == {"used": pytest.approx(0.016753, abs=1e-6), "limit": 0.02}
        cli("cancel", juid, check=True)
        wait_for(lambda: gce.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")


def test_core_terminates_a_labelled_instance_it_has_no_record_of(
    cli, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    add_gcp(cli, gce, fleet, home)
    config = yaml.safe_load((home / "providers.yml").read_text())["providers"]["gcp"]
    stray = GCEDriver(ProviderConfig("gcp", "gce", config), Home(home)).create_node()
    try:
        start_core(home)
        wait_for(lambda: gce.listed() == [], timeout=30, what="the stray instance to be deleted")
        assert stray.id.startswith("gcp/")
    finally:
        cli("daemon", "stop")


def test_core_killed_while_a_job_runs_reattaches(cli, home: Path, gce: FakeGCE, fleet: Lab) -> None:
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    gates = Path(tempfile.mkdtemp(prefix="monkey-gate-"))
    os.chmod(gates, 0o777)
    gate = gates / "gate"
    try:
        juid = run_job(
            cli, "sh", "-c", f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo down"
        )
        wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
        kill_core(home)
        gate.touch()
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
            assert len(store.instances("gcp")) == 1
        finally:
            store.close()
        wait_for(lambda: gce.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
        shutil.rmtree(gates, ignore_errors=True)


def test_a_failed_creation_says_why_on_the_waiting_job(
    cli, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    add_gcp(cli, gce, fleet, home)
    entry = yaml.safe_load((home / "providers.yml").read_text())
    entry["providers"]["gcp"]["image"] = "gone-image"
    (home / "providers.yml").write_text(yaml.safe_dump(entry))
    try:
        juid = run_job(cli, "true")
        wait_for(lambda: info(cli, juid).get("waiting"), timeout=30, what="the reason it waits")
        assert "image gone-image not found" in info(cli, juid)["waiting"]
        assert info(cli, juid)["state"] == "queued"
        assert "gcp: cannot create" in cli("list", "providers", check=True).stdout
        assert gce.listed() == []
    finally:
        cli("daemon", "stop")


def test_an_orphaned_instance_powers_itself_off_and_the_core_deletes_it(
    cli, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    """The core dies: the instance's agent, with no job and no word from it for
    `orphan_timeout`, runs the shutdown command (a hook here); GCE stops a machine whose OS
    powers off (no more vCPU billing), and the core that comes back deletes it and says why."""
    add_gcp(cli, gce, fleet, home, "--max-instances", "1")
    marks = Path(tempfile.mkdtemp(prefix="monkey-orphan-"))
    os.chmod(marks, 0o777)
    mark = marks / "powered-off"
    entry = yaml.safe_load((home / "providers.yml").read_text())
    entry["providers"]["gcp"].update(orphan_timeout=2, shutdown_command=f"echo bye > {mark}")
    (home / "providers.yml").write_text(yaml.safe_dump(entry))
    try:
        juid = run_job(cli, "echo", "hi")
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=60, what="the job to end")
        instance = info(cli, juid)["instance"]
        kill_core(home)
        wait_for(mark.exists, timeout=60, what="the orphaned agent's shutdown command")
        [host] = [h for h in fleet.hosts if (h.home / ".monkey-agent" / "agent.log").exists()]
        assert (
            "(orphan_timeout 2s): powering the machine off"
            in (host.home / ".monkey-agent" / "agent.log").read_text()
        )
        gce.guest_shutdown(ZONE, instance.split("/", 1)[1])
        start_core(home)
        wait_for(lambda: gce.listed() == [], timeout=60, what="the stopped instance to be deleted")
        why = "its agent powered it off: no job and no word from the core for 2s (orphan_timeout)"

        def shown() -> str | None:  # the core records the deletion once GCE has done it
            out = cli("list", "providers", "--monkey-instances", "--all", check=True).stdout
            return (
                out
                if re.search(
                    rf"{re.escape(instance)} +gcp +terminated .*destroyed: "
                    rf"{re.escape(why)}",
                    out,
                )
                else None
            )

        wait_for(shown, timeout=30, what=f"`list providers` to show {instance} destroyed: {why}")
    finally:
        cli("daemon", "stop")
        shutil.rmtree(marks, ignore_errors=True)


def test_orphan_timeout_is_validated_with_the_other_options() -> None:
    entry = {
        "type": "gce",
        "credentials": "/c.json",
        "size": "e2-small",
        "image": "debian-12",
        "zone": ZONE,
        "project": "p",
    }
    gce_setup.validate(
        "providers.yml", "gcp", {**entry, "orphan_timeout": 600, "shutdown_command": "poweroff"}
    )
    with pytest.raises(
        MonkeyError,
        match=r"^providers.yml: provider 'gcp': orphan_timeout must be a "
        r"number of seconds \(0: never\), got True; an instance",
    ):
        gce_setup.validate("providers.yml", "gcp", {**entry, "orphan_timeout": True})


def test_in_job_api_on_an_instance_tracks_as_locally(
    cli, home: Path, gce: FakeGCE, fleet: Lab
) -> None:
    """`import monkey; monkey.log(...)` in a job on a GCE instance whose python has no monkey:
    tracked exactly as the same job on the local provider."""
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
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
        assert info(cli, remote)["instance"].startswith("gcp/monkey-gcp-")
        assert check_tracked(cli, remote) == check_tracked(cli, local)
        wait_for(lambda: gce.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
