"""A replacement is never created in the zone that just preempted a machine when another zone
is configured (issue 11 §2, ``zones: [..]``). EC2 entries have one subnet, hence one zone:
the rule lives in the shared cloud base and GCE's ``zones`` use it. Real parts as in
tests/test_gce.py (the stateful fake compute API, fake-gcs-server, an sshd per instance
address) plus the metadata service of tests/imds.py announcing the preemption."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import wait_for
from tests.fake_gce import FakeGCE
from tests.imds import Metadata
from tests.sshd import Lab
from tests.test_ec2 import fleet  # noqa: F401 - fixture
from tests.test_gce import ZONE, add_gcp, gce, gcs_server, info, run_job  # noqa: F401 - fixtures
from tests.test_spot import TRAIN, expected, metadata, stdout  # noqa: F401 - fixture

OTHER = "us-central1-b"


def _zone_of(gce: FakeGCE, instance: str) -> str | None:
    name = instance.split("/", 1)[1]
    return next((i["zone"].rsplit("/", 1)[1] for i in gce.listed() if i["name"] == name), None)


def test_the_replacement_avoids_the_zone_that_preempted(
    cli, home: Path, gce: FakeGCE, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    path = home / "providers.yml"
    doc = yaml.safe_load(path.read_text())
    doc["providers"]["gcp"].update(
        zones=[ZONE, OTHER],
        preemptible=True,
        checkpoint_every=1,
        notice_every=0.2,
        metadata_url=f"http://{{address}}:{metadata['127.0.0.4'].port}",
    )
    # Without the bucket: GCS gives workers no upload form yet; the checkpoint goes over SSH.
    del doc["providers"]["gcp"]["bucket"]
    path.write_text(yaml.safe_dump(doc))
    Path("train.py").write_text(TRAIN.replace("EPOCHS", "8"))
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 2\n" in stdout(home, juid, 1), timeout=60, what="epoch 2")
        first = info(cli, juid)["instance"]
        assert _zone_of(gce, first) == ZONE  # the first zone configured
        [address] = [i["networkInterfaces"][0]["networkIP"] for i in gce.listed()]
        metadata[address].preempt()
        wait_for(
            lambda: info(cli, juid)["attempts"] == 2 and info(cli, juid)["state"] == "running",
            timeout=90,
            what="the job to run again",
        )
        second = info(cli, juid)["instance"]
        assert second != first and _zone_of(gce, second) == OTHER
        wait_for(
            lambda: info(cli, juid)["state"] == "succeeded", timeout=60, what="the job to succeed"
        )
        one, _ = info(cli, juid)["attempts_detail"]
        assert one["reason"].startswith("preempted"), one
        assert f"result {expected(8)}\n" in stdout(home, juid, 2)
        assert "no new instance there for 10 minutes" in (home / "daemon.log").read_text()
        wait_for(lambda: gce.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")
