"""Spot instances end to end: moto's server for EC2 and S3, an sshd per instance address (the
`fleet` of test_ec2.py) and a metadata service per instance address that the test controls
(tests/imds.py). Results move through the bucket; a notice stops the jobs, which resume on a
new instance from their checkpoint."""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import kill_until_gone, wait_for
from tests.imds import Metadata
from tests.registry import reg  # noqa: F401 - fixture
from tests.sshd import Lab
from tests.test_ec2 import FLEET, add_aws, fleet, info, run_job  # noqa: F401 - fixture

# A training run that checkpoints every epoch and stops cleanly on SIGTERM; its result
# depends on every epoch, so a resume at the wrong epoch changes it.
TRAIN = """\
import json, os, signal, sys, time
path = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"epoch": 0, "total": 0}
print("start at epoch", state["epoch"], flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while state["epoch"] < EPOCHS:
    time.sleep(0.4)
    state["epoch"] += 1
    state["total"] = state["total"] * 3 + state["epoch"]
    with open(path + ".tmp", "w") as out:
        json.dump(state, out)
    os.replace(path + ".tmp", path)
    print("epoch", state["epoch"], flush=True)
    if stop:
        print("stopping: preempted" if os.path.exists(os.path.join(os.environ["MONKEY_RUN_DIR"], "preempted")) else "stopping", flush=True)
        sys.exit(143)
print("result", state["total"], flush=True)
"""
EPOCHS = 12


def expected(epochs: int = EPOCHS) -> int:
    total = 0
    for epoch in range(1, epochs + 1):
        total = total * 3 + epoch
    return total


@pytest.fixture
def metadata(fleet: Lab) -> Iterator[dict[str, Metadata]]:
    """A metadata service on each fleet address, all on one port (one free on every
    address: a port taken on one of them, by a client socket there, means another try)."""
    for _ in range(20):
        services = {"127.0.0.4": Metadata("127.0.0.4")}
        try:
            for n in range(2, FLEET + 1):
                address = f"127.0.0.{n + 3}"
                services[address] = Metadata(address, services["127.0.0.4"].port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            for service in services.values():
                service.close()
            continue
        try:
            yield services
        finally:
            for service in services.values():
                service.close()
        return
    raise AssertionError("no port free on every fleet address in 20 tries")


def spot_provider(
    cli: Any, moto: Any, fleet: Lab, home: Path, port: int, epochs: int = EPOCHS, **options: Any
) -> str:
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    path = home / "providers.yml"
    doc = yaml.safe_load(path.read_text())
    doc["providers"]["aws"].update(
        spot=True,
        metadata_url=f"http://{{address}}:{port}",
        checkpoint_every=1,
        notice_every=0.2,
        **options,
    )
    path.write_text(yaml.safe_dump(doc))
    Path("train.py").write_text(TRAIN.replace("EPOCHS", str(epochs)))
    return doc["providers"]["aws"]["bucket"]


def stdout(home: Path, juid: str, n: int) -> str:
    path = home / "runs" / juid / str(n) / "stdout.log"
    return path.read_text() if path.exists() else ""


def epochs_done(home: Path, juid: str, n: int) -> int:
    return stdout(home, juid, n).count("\nepoch ") + stdout(home, juid, n).startswith("epoch ")


def address_of(cli: Any, juid: str, moto: Any) -> str:
    node = info(cli, juid)["instance"].split("/", 1)[1]
    [found] = [i for i in moto.instances() if i["InstanceId"] == node]
    return found["PrivateIpAddress"]


def finish(cli: Any, moto: Any) -> None:
    cli("daemon", "stop")
    left = [i["InstanceId"] for i in moto.instances()]
    if left:
        moto.boto3("ec2").terminate_instances(InstanceIds=left)
    assert left == [], f"instances left running: {left}"


def test_notice_stops_the_job_which_resumes_on_a_new_instance(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    bucket = spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 3\n" in stdout(home, juid, 1), timeout=60, what="epoch 3")
        first = info(cli, juid)["instance"]
        metadata[address_of(cli, juid, moto)].interrupt(seconds=120)
        wait_for(
            lambda: info(cli, juid)["attempts"] == 2 and info(cli, juid)["state"] == "succeeded",
            timeout=90,
            what="the job to resume and succeed",
        )
        job = info(cli, juid)
        one, two = job["attempts_detail"]
        assert one["reason"].startswith("preempted") and "checkpoint saved" in one["reason"], one
        assert one["spot"] is True and one["instance"] == first
        assert two["instance"] != first and two["reason"] == "exit 0"
        assert "stopping: preempted" in stdout(home, juid, 1)
        stopped_at = epochs_done(home, juid, 1)
        assert f"start at epoch {stopped_at}\n" in stdout(home, juid, 2)  # from the checkpoint
        assert f"result {expected()}\n" in stdout(home, juid, 2)
        kinds = [e["kind"] for e in job["events"]]
        assert "preempt-notice" in kinds and "preempt" in kinds and "retry" not in kinds
        # The checkpoint came back from the bucket, and the bucket holds a manifest naming it.
        state = json.loads((home / "runs" / juid / "checkpoint" / "state.json").read_text())
        assert state == {"epoch": EPOCHS, "total": expected()}
        manifest = json.loads(
            moto.boto3("s3")
            .get_object(Bucket=bucket, Key=f"runs/{juid}/results/manifest.json")["Body"]
            .read()
        )
        assert manifest["attempt"] == 2 and "checkpoint/state.json" in manifest["files"]
        shown = cli("info", "job", juid, check=True).stdout
        assert "spot" in shown and "CAPACITY" in shown
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)


def test_a_reclaim_without_notice_resumes_from_the_last_upload(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port, epochs=40)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 4\n" in stdout(home, juid, 1), timeout=60, what="epoch 4")
        node = info(cli, juid)["instance"].split("/", 1)[1]
        wait_for(
            lambda: _uploaded_epoch(moto, home, juid) >= 3, timeout=30, what="a periodic upload"
        )
        moto.reclaim_spot(node)
        # The machine is gone: everything that ran there with it.
        fleet.hosts[0].cut()
        kill_until_gone(fleet.hosts[0].processes)
        wait_for(
            lambda: info(cli, juid)["state"] == "succeeded", timeout=90, what="the job to resume"
        )
        one, two = info(cli, juid)["attempts_detail"]
        assert one["reason"].startswith("preempted: its spot instance was reclaimed"), one
        assert "start at epoch 0\n" not in stdout(home, juid, 2)
        assert f"result {expected(40)}\n" in stdout(home, juid, 2)
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)


def _uploaded_epoch(moto: Any, home: Path, juid: str) -> int:
    """The epoch of the checkpoint the bucket holds now."""
    bucket = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]["bucket"]
    s3 = moto.boto3("s3")
    try:
        manifest = json.loads(
            s3.get_object(Bucket=bucket, Key=f"runs/{juid}/results/manifest.json")["Body"].read()
        )
        sha = manifest["files"]["checkpoint/state.json"][0]
        body = s3.get_object(Bucket=bucket, Key=f"runs/{juid}/results/objects/{sha}")["Body"].read()
    except Exception:  # noqa: BLE001 - nothing uploaded yet
        return 0
    return json.loads(body)["epoch"]


def test_a_job_in_an_image_resumes_on_a_new_instance_from_the_same_digest(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata], reg: Any
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port)
    from tests.registry import PASSWORD, USER

    login = cli("registry", "login", reg.host, "-u", USER, "--password-stdin", "--ca-file",
                str(reg.ca), input=PASSWORD + "\n")  # fmt: skip
    assert login.returncode == 0, login.stderr
    try:
        ran = cli("run", "--json", "-p", "aws", "--image", f"{reg.host}/lab/py:1", "--",
                  "python3", "train.py", check=True)  # fmt: skip
        juid = json.loads(ran.stdout)["job"]
        wait_for(lambda: "epoch 3\n" in stdout(home, juid, 1), timeout=90, what="epoch 3")
        first = info(cli, juid)["instance"]
        metadata[address_of(cli, juid, moto)].interrupt(seconds=120)
        wait_for(
            lambda: info(cli, juid)["attempts"] == 2 and info(cli, juid)["state"] == "succeeded",
            timeout=120,
            what="the job to resume in its image and succeed",
        )
        one, two = info(cli, juid)["attempts_detail"]
        assert one["reason"].startswith("preempted") and two["instance"] != first
        stopped_at = epochs_done(home, juid, 1)
        assert f"start at epoch {stopped_at}\n" in stdout(home, juid, 2)  # its checkpoint
        assert f"result {expected()}\n" in stdout(home, juid, 2)
        assert info(cli, juid)["image"]["digest"].startswith("sha256:")
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)
