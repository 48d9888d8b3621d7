"""Preemptible GCE instances end to end: the fake compute API (tests/fake_gce.py), the real
fake-gcs-server behind its signature gate, an sshd per instance address (the `fleet` of
test_ec2.py) and a GCE metadata service per address that the test controls (tests/imds.py).
Results move through the bucket by signed POST policy; a preemption stops the job, which
resumes on a new instance from its checkpoint. Also GCE's variants of tests/test_spot_more.py:
a notice with two jobs on the instance, and a job cancelled before the notice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import kill_until_gone, wait_for
from tests.fake_gce import FakeGCE
from tests.imds import Metadata
from tests.sshd import Lab
from tests.test_ec2 import fleet  # noqa: F401 - fixture
from tests.test_gce import ZONE, add_gcp, gce, gcs_server, info, run_job  # noqa: F401 - fixtures
from tests.test_spot import (
    EPOCHS,
    TRAIN,
    epochs_done,
    expected,
    metadata,  # noqa: F401 - fixture
    stdout,
)
from tests.test_spot_more import SLOW_STOP


def preemptible_provider(
    cli: Any, gce: FakeGCE, fleet: Lab, home: Path, port: int, epochs: int = EPOCHS
) -> str:
    add_gcp(cli, gce, fleet, home, "--max-instances", "1", "--idle-timeout", "2")
    path = home / "providers.yml"
    doc = yaml.safe_load(path.read_text())
    doc["providers"]["gcp"].update(
        preemptible=True,
        metadata_url=f"http://{{address}}:{port}",
        checkpoint_every=1,
        notice_every=0.2,
    )
    path.write_text(yaml.safe_dump(doc))
    Path("train.py").write_text(TRAIN.replace("EPOCHS", str(epochs)))
    return doc["providers"]["gcp"]["bucket"]


def node_of(cli: Any, juid: str, fake: FakeGCE) -> dict[str, Any]:
    name = info(cli, juid)["instance"].split("/", 1)[1]
    [found] = [i for i in fake.listed() if i["name"] == name]
    return found


def finish(cli: Any, fake: FakeGCE) -> None:
    try:
        wait_for(lambda: fake.listed() == [], timeout=30, what="idle termination")
    finally:
        cli("daemon", "stop")


def test_preemption_notice_stops_the_job_which_resumes_on_a_new_instance(
    cli, home: Path, gce: FakeGCE, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    bucket = preemptible_provider(cli, gce, fleet, home, metadata["127.0.0.4"].port)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 3\n" in stdout(home, juid, 1), timeout=60, what="epoch 3")
        first = info(cli, juid)["instance"]
        node = node_of(cli, juid, gce)
        assert node["scheduling"]["preemptible"] is True
        metadata[node["networkInterfaces"][0]["networkIP"]].preempt()  # instance/preempted TRUE
        wait_for(lambda: "stopping: preempted" in stdout(home, juid, 1), timeout=30, what="SIGTERM")
        wait_for(
            lambda: info(cli, juid)["attempts_detail"][0]["reason"],
            timeout=30,
            what="the attempt to end",
        )
        gce.preempt(ZONE, node["name"])  # GCE stops the machine (unless monkey deleted it first)
        wait_for(
            lambda: info(cli, juid)["state"] == "succeeded",
            timeout=90,
            what="the job to resume and succeed",
        )
        job = info(cli, juid)
        one, two = job["attempts_detail"]
        assert one["reason"].startswith("preempted") and "checkpoint saved" in one["reason"], one
        assert one["spot"] is True and one["instance"] == first
        assert two["instance"] != first and two["reason"] == "exit 0"
        stopped_at = epochs_done(home, juid, 1)
        assert f"start at epoch {stopped_at}\n" in stdout(home, juid, 2)  # from the checkpoint
        assert f"result {expected()}\n" in stdout(home, juid, 2)  # as an uninterrupted run's
        kinds = [e["kind"] for e in job["events"]]
        assert "preempt-notice" in kinds and "preempt" in kinds and "retry" not in kinds
        state = json.loads((home / "runs" / juid / "checkpoint" / "state.json").read_text())
        assert state == {"epoch": EPOCHS, "total": expected()}
        stored = gce.gcs.objects(bucket, f"runs/{juid}/results/")  # type: ignore[attr-defined]
        manifest = json.loads(stored[f"runs/{juid}/results/manifest.json"])
        assert manifest["attempt"] == 2 and "checkpoint/state.json" in manifest["files"]
        assert first.split("/", 1)[1] not in [i["name"] for i in gce.listed()]
    finally:
        finish(cli, gce)


def test_a_preemption_without_notice_resumes_from_the_last_upload(
    cli, home: Path, gce: FakeGCE, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    bucket = preemptible_provider(cli, gce, fleet, home, metadata["127.0.0.4"].port, epochs=40)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 4\n" in stdout(home, juid, 1), timeout=60, what="epoch 4")
        wait_for(
            lambda: _uploaded_epoch(gce, bucket, juid) >= 3, timeout=30, what="a periodic upload"
        )
        gce.preempt(ZONE, node_of(cli, juid, gce)["name"])
        fleet.hosts[0].cut()  # the machine is gone, and everything that ran there with it
        kill_until_gone(fleet.hosts[0].processes)
        wait_for(
            lambda: info(cli, juid)["state"] == "succeeded", timeout=90, what="the job to resume"
        )
        one, two = info(cli, juid)["attempts_detail"]
        assert one["reason"].startswith("preempted: its spot instance was reclaimed"), one
        assert "start at epoch 0\n" not in stdout(home, juid, 2)
        assert f"result {expected(40)}\n" in stdout(home, juid, 2)
    finally:
        finish(cli, gce)


def _uploaded_epoch(fake: FakeGCE, bucket: str, juid: str) -> int:
    """The epoch of the checkpoint the bucket holds now."""
    stored = fake.gcs.objects(bucket, f"runs/{juid}/results/")  # type: ignore[attr-defined]
    try:
        manifest = json.loads(stored[f"runs/{juid}/results/manifest.json"])
        sha = manifest["files"]["checkpoint/state.json"][0]
        return int(json.loads(stored[f"runs/{juid}/results/objects/{sha}"])["epoch"])
    except KeyError:
        return 0


def test_a_notice_stops_both_jobs_of_the_instance_and_both_resume(
    cli, home: Path, gce: FakeGCE, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    preemptible_provider(cli, gce, fleet, home, metadata["127.0.0.4"].port)
    try:
        jobs = [run_job(cli, "python3", "train.py") for _ in range(2)]
        for juid in jobs:
            wait_for(
                lambda j=juid: "epoch 2\n" in stdout(home, j, 1),
                timeout=60,
                what=f"{juid} at epoch 2",
            )
        [first] = {info(cli, juid)["instance"] for juid in jobs}  # e2-small: 2 slots, one machine
        node = node_of(cli, jobs[0], gce)
        metadata[node["networkInterfaces"][0]["networkIP"]].preempt()
        for juid in jobs:
            wait_for(
                lambda j=juid: info(cli, j)["attempts_detail"][0]["reason"],
                timeout=60,
                what=f"{juid}'s first attempt to end",
            )
        gce.preempt(ZONE, node["name"])
        for juid in jobs:
            wait_for(
                lambda j=juid: info(cli, j)["state"] == "succeeded",
                timeout=120,
                what=f"{juid} to resume and succeed",
            )
        for juid in jobs:
            one, two = info(cli, juid)["attempts_detail"]
            assert one["reason"].startswith("preempted") and "checkpoint saved" in one["reason"], (
                one
            )
            assert (
                one["instance"] == first and two["instance"] != first and two["reason"] == "exit 0"
            )
            stopped_at = epochs_done(home, juid, 1)
            assert "stopping: preempted" in stdout(home, juid, 1)
            assert f"start at epoch {stopped_at}\n" in stdout(home, juid, 2)
            assert f"result {expected()}\n" in stdout(home, juid, 2)
        assert first.split("/", 1)[1] not in [i["name"] for i in gce.listed()]
    finally:
        finish(cli, gce)


def test_a_job_cancelled_before_the_notice_stays_cancelled(
    cli, home: Path, gce: FakeGCE, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    preemptible_provider(cli, gce, fleet, home, metadata["127.0.0.4"].port)
    Path("slow.py").write_text(SLOW_STOP)
    try:
        juid = run_job(cli, "python3", "slow.py")
        wait_for(lambda: "running\n" in stdout(home, juid, 1), timeout=60, what="the job to run")
        node = node_of(cli, juid, gce)
        cli("job", "cancel", juid, check=True)
        wait_for(
            lambda: "asked to stop\n" in stdout(home, juid, 1),
            timeout=30,
            what="the cancel's SIGTERM",
        )
        metadata[node["networkInterfaces"][0]["networkIP"]].preempt()
        wait_for(
            lambda: info(cli, juid)["state"] == "cancelled",
            timeout=60,
            what="the job to end cancelled",
        )
        gce.preempt(ZONE, node["name"])
        job = info(cli, juid)
        assert job["attempts"] == 1 and job["attempts_detail"][0]["reason"] == "cancelled by user"
        assert not any(e["kind"] in ("preempt", "retry") for e in job["events"]), job["events"]
        wait_for(lambda: gce.listed() == [], timeout=30, what="the noticed instance to go")
        assert info(cli, juid)["state"] == "cancelled" and info(cli, juid)["attempts"] == 1
    finally:
        finish(cli, gce)
