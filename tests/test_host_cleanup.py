"""`rm`, `gc` and `du --hosts` reach SSH hosts (issue 24 finding 4): a deleted job's folder,
blobs no job needs and partial uploads go from every host that holds them, a host out of
reach is cleaned once it is back, and a live job's blobs stay. Real sshd hosts on loopback."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import yaml

from tests import test_ec2, test_ssh
from tests.conftest import wait_for
from tests.test_ssh import configure, job_info, remote_runs, run, wait_state

lab = test_ssh.lab  # SSH hosts on loopback
fleet = test_ec2.fleet  # the sshds at EC2 instances' addresses

CODE = "import sys; print(open(sys.argv[1], 'rb').read()[:4].hex())\n"


def leave_partial(host, user: str, size: int, age: float = 0) -> Path:
    """A partial upload in the host's blobs folder, as an interrupted transfer leaves it."""
    partial = Path(host.workdir) / "blobs" / "ab" / ".tmp-cdef-123"
    partial.parent.mkdir(exist_ok=True)
    partial.write_bytes(b"x" * size)
    os.utime(partial, (time.time() - age, time.time() - age))
    for path in (partial.parent, partial):
        shutil.chown(path, user, user)
    return partial


def host_blobs(host) -> set[str]:
    """Digests stored in the host's blobs folder (partial uploads left out)."""
    base = Path(host.workdir) / "blobs"
    return {p.parent.name + p.name for p in base.glob("??/*") if not p.name.startswith(".tmp-")}


def job_blobs(cli, juid: str) -> set[str]:
    """The blobs of a job's code files."""
    files = json.loads(cli("info", "job", juid, "--files", "--json", check=True).stdout)
    return {f["digest"] for f in files if f.get("digest")}


def sizes(host) -> list[int]:
    """Sizes of the blobs stored on the host."""
    return sorted(
        p.stat().st_size
        for p in Path(host.workdir, "blobs").glob("??/*")
        if not p.name.startswith(".tmp-")
    )


def test_rm_and_gc_free_a_hosts_folders_blobs_and_partial_uploads(cli, home: Path, lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("train.py").write_text(CODE)
    Path("old.bin").write_bytes(os.urandom(300_000))
    Path("kept.bin").write_bytes(os.urandom(200_000))
    old = run(
        cli, "--provider", "lab", "--dataset", "old.bin", "--", "python3", "train.py", "old.bin"
    )
    assert wait_state(cli, old, "succeeded", "failed") == "succeeded"
    Path("train.py").write_text(CODE + "# kept\n")
    Path("old.bin").unlink()  # else the next job's code holds it
    kept = run(
        cli, "--provider", "lab", "--dataset", "kept.bin", "--", "python3", "train.py", "kept.bin"
    )
    assert wait_state(cli, kept, "succeeded", "failed") == "succeeded"
    runs = remote_runs(host)
    assert (runs / old).is_dir() and (runs / kept).is_dir()
    before = host_blobs(host)
    assert {300_000, 200_000} <= set(sizes(host))  # the datasets
    partial = leave_partial(host, lab.user, 5000, age=300)  # an interrupted transfer's

    out = cli("rm", old, "--yes", check=True).stdout
    assert "deleted 1 jobs" in out
    assert "lab/h1: freed " in out and "1 job folders" in out, out
    assert not (runs / old).exists() and (runs / kept).is_dir()

    out = cli("gc", "--grace", "0s", check=True).stdout
    assert "lab/h1: freed " in out and "1 partial uploads (5.0 kB)" in out, out
    after = host_blobs(host)
    assert not partial.exists()
    assert job_blobs(cli, kept) <= after  # what the remaining job needs stays
    gone = before - after
    assert gone and not gone & job_blobs(cli, kept), (gone, job_blobs(cli, kept))
    assert 300_000 not in sizes(host) and 200_000 in sizes(host)  # the old job's dataset went
    assert any(f"{len(gone)} blobs (" in line for line in out.splitlines()), out

    # The remaining job runs again there: what the host lacks now is sent again.
    again = json.loads(cli("rerun", kept, "--json", check=True).stdout)["job"]
    assert wait_state(cli, again, "succeeded", "failed") == "succeeded", job_info(cli, again)
    assert cli("logs", again, check=True).stdout == cli("logs", kept, check=True).stdout


def test_a_host_out_of_reach_is_cleaned_when_it_is_back(cli, home: Path, lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("train.py").write_text("print('hi')\n")
    juid = run(cli, "--provider", "lab", "--", "python3", "train.py")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    folder = remote_runs(host) / juid
    assert folder.is_dir()
    host.cut()
    wait_for(
        lambda: "unreachable" in cli("list", "providers").stdout, what="the host to be out of reach"
    )

    out = cli("rm", juid, "--yes", check=True).stdout
    assert "not reached yet: lab/h1" in out and "cleans them when it next reaches them" in out, out
    assert folder.is_dir()  # owed, not forgotten
    cli("daemon", "stop", check=True)  # even across a restart of the core
    host.restore()
    cli("daemon", "start", check=True)
    wait_for(
        lambda: not folder.exists(), what="the core to delete the folder once the host is back"
    )


def test_gc_keeps_the_blobs_of_a_running_job(cli, home: Path, lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    gate = host.dir / "gate"  # where the host's user can see it
    Path("wait.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('done')\n"
    )
    juid = run(cli, "--provider", "lab", "--", "python3", "wait.py")
    assert wait_state(cli, juid, "running") == "running"
    needed = job_blobs(cli, juid)
    assert needed <= host_blobs(host)
    out = cli("gc", "--grace", "0s", check=True).stdout
    assert "lab/h1: " in out, out
    assert needed <= host_blobs(host)
    gate.write_text("")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"


def test_du_hosts_shows_what_each_host_holds(cli, home: Path, lab) -> None:
    first, second = lab.add("h1"), lab.add("h2")
    configure(home, [first.entry(key=lab.key, cpus=1), second.entry(key=lab.key, cpus=1)])
    Path("data.bin").write_bytes(os.urandom(400_000))
    Path("train.py").write_text("print('hi')\n")
    jobs = [
        run(
            cli,
            "--provider",
            "lab",
            "--host",
            h,
            "--dataset",
            "data.bin",
            "--",
            "python3",
            "train.py",
        )
        for h in ("h1", "h2", "h1")
    ]
    for juid in jobs:
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    leave_partial(second, lab.user, 7000)

    usage = json.loads(cli("du", "--hosts", "--json", check=True).stdout)
    assert usage["not_reached"] == []
    h1, h2 = usage["hosts"]["lab/h1"]["usage"], usage["hosts"]["lab/h2"]["usage"]
    assert (h1["jobs"], h2["jobs"]) == (2, 1)
    assert h1["blobs"][0] >= 400_000 and h2["blobs"][0] >= 400_000
    assert h2["partial"] == [7000, 1] and h1["partial"] == [0, 0]
    assert h1["free"] > 0
    table = cli("du", "--hosts", check=True).stdout.splitlines()
    assert table[0].split()[:3] == ["HOST", "JOBS", "RUN"]
    assert [line.split()[:2] for line in table[1:3]] == [["lab/h1", "2"], ["lab/h2", "1"]]

    second.cut()
    wait_for(lambda: "unreachable" in cli("list", "providers").stdout, what="h2 to be out of reach")
    out = cli("du", "--hosts", check=True).stdout
    assert "not reached yet: lab/h2" in out, out
    rows = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert rows["lab/h1"].rstrip().endswith("now") and not rows["lab/h2"].rstrip().endswith("now")


# -- the bucket of a cloud provider (moto's S3, instances at loopback sshds) ---------------


def test_rm_and_gc_reach_a_cloud_providers_bucket(cli, home: Path, moto, fleet) -> None:
    from tests.test_ec2 import add_aws, info

    add_aws(cli, moto, fleet, home, "--max-instances", "1")
    bucket = yaml.safe_load((home / "providers.yml").read_text())["providers"]["aws"]["bucket"]
    s3 = moto.boto3("s3")

    def keys(prefix: str) -> list[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    Path("main.py").write_text(
        "import os\n"
        "open(os.path.join(os.environ['MONKEY_CHECKPOINT_DIR'], 'm.pt'), 'w').write('w')\n"
    )
    Path("data.bin").write_bytes(os.urandom(1_500_000))  # a blob of its own, not in a pack
    try:
        juid = json.loads(
            cli(
                "run",
                "--json",
                "-p",
                "aws",
                "--dataset",
                "data.bin",
                "--",
                "python3",
                "main.py",
                check=True,
            ).stdout
        )["job"]
        wait_for(
            lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the job to end",
        )
        assert info(cli, juid)["state"] == "succeeded", info(cli, juid)
        assert keys(f"runs/{juid}/") and keys("blobs/")

        out = cli("rm", juid, "--yes", check=True).stdout
        assert "aws bucket: freed " in out and "1 job folders" in out, out
        assert keys(f"runs/{juid}") == []

        out = cli("gc", "--grace", "0s", check=True).stdout
        assert "aws bucket: freed " in out, out
        assert keys("blobs/") == [] and keys("packs/") == []  # no job needs them any more
        assert keys("needed/")  # what this home needs, for other homes' gc
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
