"""A full disk under MONKEY_HOME (a small tmpfs): commands say so in one line and write
nothing half-way; the core waits, says why in `daemon status`, and carries on by itself
once space is freed; a job that fills the disk says so in its reason."""

from __future__ import annotations

import errno
import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest
from conftest import core_pid, kill_all, kill_until_gone, wait_for

from monkey.models import State
from tests import test_ssh


@pytest.fixture
def disk(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """MONKEY_HOME on its own 8 MB tmpfs, unmounted afterwards whatever happened."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root): {done.stderr.strip()}")
    root = mount / "mh"
    root.mkdir()
    monkeypatch.setenv("MONKEY_HOME", str(root))
    try:
        yield root
    finally:
        kill_all(f"MONKEY_HOME={root}")
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def api(disk: Path):
    """The Python API over the MONKEY_HOME on the small disk."""
    from monkey.api import Monkey

    m = Monkey(disk)
    yield m
    m.store.close()


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a file in FOLDER until the disk is full, then give LEAVE bytes back; returns it."""
    ballast = folder / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    if leave:
        os.truncate(ballast, ballast.stat().st_size - leave)
    return ballast


def one_line_disk_full(proc: subprocess.CompletedProcess[str], disk: Path) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"disk full at {disk}" in lines[0] and "bytes free" in lines[0], lines[0]


def test_commands_on_a_full_disk_fail_in_one_line_and_write_nothing(disk, cli):
    Path("train.py").write_text("print('hi')\n")
    cli("daemon", "start", check=True)
    cli("run", "--", "python3", "train.py", check=True)
    wait_for(lambda: "succeeded" in cli("list", "jobs").stdout, what="the first job to run")
    cli("daemon", "stop", check=True)  # its database files are closed: they must be reopened
    ballast = fill(disk)
    Path("train.py").write_text("print('changed')\n")  # a new blob to store

    one_line_disk_full(cli("run", "--", "python3", "train.py"), disk)
    # Not "not a monkey database; move it aside": the store is healthy.
    one_line_disk_full(cli("run", "--env", "MY_TOKEN=x", "--", "true"), disk)
    one_line_disk_full(cli("list", "jobs"), disk)

    ballast.unlink()
    assert len(cli("list", "jobs", check=True).stdout.splitlines()) == 2  # header + the first job
    assert not list((disk / "blobs").rglob(".tmp-*"))
    assert not list((disk / "secrets").iterdir())
    assert cli("run", "--env", "MY_TOKEN=x", "--", "python3", "train.py").returncode == 0


def one_slot_two_jobs(disk: Path, api, gate: Path):
    """On one slot, a job running until GATE exists, and one queued behind it."""
    (disk / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    running = api.run(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"])
    queued = api.run(["true"])
    wait_for(lambda: running.status == State.RUNNING, what="the first job to run")
    return running, queued


def test_core_waits_out_a_full_disk_and_carries_on_by_itself(disk, cli, api):
    gate = Path("gate").resolve()
    running, queued = one_slot_two_jobs(disk, api, gate)
    pid = core_pid(disk)
    ballast = fill(disk)
    gate.touch()  # its end must be recorded on a full disk; the queued job must be started

    # What the core said of its failed write, or the full disk it has yet to try (when the
    # agent could not record the job's end either: see the next test).
    status = wait_for(
        lambda: f"disk full at {disk} (" in (s := cli("daemon", "status").stdout) and s,
        what="`daemon status` to say why the core is stuck",
    )
    assert f"core running (pid {pid}) for {disk}, but " in status
    assert "free some space there" in status
    assert queued.status == State.QUEUED
    one_line_disk_full(cli("run", "--", "true"), disk)

    ballast.unlink()  # nothing wakes the core: it must notice by itself
    wait_for(lambda: queued.status == State.SUCCEEDED, what="the queued job to run")
    assert running.status == State.SUCCEEDED
    assert core_pid(disk) == pid
    assert "disk full" not in cli("daemon", "status").stdout
    assert len(api.jobs()) == 2  # the refused `run` left no job behind
    log = (disk / "daemon.log").read_text()
    assert "Traceback" not in log
    assert log.count("cannot write the store") <= 1  # said once, not at every retry


def test_a_nearly_full_disk_refuses_runs_and_its_queued_jobs_wait_for_room(disk, cli, api):
    # Room left for the store, not for a job's run: `monkey run` is refused, writing
    # nothing; the job queued before waits for disk, saying where and how much is free,
    # and runs by itself once space returns (issue 46 item 4). None is failed for it.
    gate = Path("gate").resolve()
    running, queued = one_slot_two_jobs(disk, api, gate)
    Path("train.py").write_text("print('a new blob to store')\n")
    stored = sorted((disk / "blobs").rglob("*"))
    # Filled with the core away: a write of its while the disk is at 0 bytes, before
    # fill gives some back, would make it wait for 1 MiB free (see test_core_waits_...).
    cli("daemon", "stop", check=True)
    ballast = fill(disk, leave=256 << 10)

    one_line_disk_full(cli("run", "--", "python3", "train.py"), disk)
    assert sorted((disk / "blobs").rglob("*")) == stored
    assert len(api.jobs()) == 2

    cli("daemon", "start", check=True)
    gate.touch()
    assert running.wait(timeout=30) == State.SUCCEEDED
    listing = wait_for(
        lambda: "waiting for disk" in (p := cli("list", "jobs")).stdout and p,
        what="the queued job to wait for disk",
    )
    row = next(line for line in listing.stdout.splitlines() if queued.juid in line)
    assert "waiting for disk" in row, listing.stdout
    assert f"local: waiting for disk: {disk}/runs has " in listing.stderr, listing.stderr
    assert "bytes free; free some space there" in listing.stderr, listing.stderr
    info = cli("info", queued.juid, check=True).stdout
    assert f"queued; waiting for disk: {disk}/runs has " in info, info
    assert queued.status == State.QUEUED and not queued.record.reason

    ballast.unlink()  # nothing wakes the core: it must notice by itself
    assert queued.wait(timeout=30) == State.SUCCEEDED
    assert "waiting for disk" not in cli("list", "jobs").stdout + cli("info", queued.juid).stdout
    assert (disk / "daemon.log").read_text().count("jobs wait: waiting for disk") == 1


def test_a_start_that_runs_out_of_room_here_waits_for_it(disk, cli, api):
    # The disk has room for the store but not for the queued job's copy of its code: the
    # agent's start runs out of space. The job is not failed: it waits for disk, and runs
    # once space returns.
    (disk / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    gate, elsewhere = Path("gate").resolve(), Path("elsewhere").resolve()
    elsewhere.mkdir()
    running = api.run(
        ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"], workdir=elsewhere
    )
    Path("weights.bin").write_bytes(os.urandom(3 << 19))  # 1.5 MB its start copies
    queued = api.run(["true"])
    wait_for(lambda: running.status == State.RUNNING, what="the first job to run")
    ballast = fill(disk, leave=5 << 18)  # 1.25 MB: more than the store needs

    gate.touch()
    assert running.wait(timeout=30) == State.SUCCEEDED
    info = wait_for(
        lambda: "waiting for disk" in (out := cli("info", queued.juid).stdout) and out,
        what="the queued job to wait for disk",
    )
    assert f"queued (never started); waiting for disk: {disk}/runs has " in info, info
    assert "could not start" not in info and queued.status == State.QUEUED
    assert not list((disk / "runs" / queued.juid).glob("*/work"))  # no half copy

    ballast.unlink()
    assert queued.wait(timeout=30) == State.SUCCEEDED


def test_an_end_the_agent_cannot_record_is_recorded_once_there_is_room(disk, cli, api):
    # The disk fills while the job's events.jsonl has no room left in its last block: the
    # agent cannot write the exit (nor heartbeats), so the core hears nothing and writes
    # nothing. `daemon status` still says the disk is full; the job stays running; once
    # space is freed the agent records the exit by itself, once, well before the core
    # would give up on the silent link (30 s) and ask again.
    gate = Path("gate").resolve()
    job, queued = one_slot_two_jobs(disk, api, gate)
    ballast = fill(disk)
    events = disk / "runs" / job.juid / "1" / "events.jsonl"
    fd = os.open(events, os.O_WRONLY | os.O_APPEND)
    try:
        while True:  # leading blanks are nothing to a JSON reader
            os.write(fd, b" ")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    gate.touch()

    status = cli("daemon", "status").stdout
    assert f"but its disk is nearly full: disk full at {disk} (" in status, status
    time.sleep(2.5)  # the wrapper has ended, and the agent tried again twice
    assert job.status == State.RUNNING and queued.status == State.QUEUED

    ballast.unlink()
    wait_for(lambda: job.status == State.SUCCEEDED, timeout=15, what="the exit to be recorded")
    assert queued.wait(timeout=30) == State.SUCCEEDED
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert [e["type"] for e in lines].count("exit") == 1
    assert "disk full" not in cli("daemon", "status").stdout


def test_job_that_fills_the_disk_says_so(disk, cli, api):
    cli("daemon", "start", check=True)
    job = api.run(["python3", "-c", "f = open('fill', 'wb')\nwhile True: f.write(bytes(65536))"])
    wait_for(
        lambda: "cannot write" in cli("daemon", "status").stdout or job.status == State.FAILED,
        what="the job to fill the disk",
    )
    for path in (disk / "runs").rglob("fill"):
        path.unlink()
    assert job.wait(timeout=30) == State.FAILED
    reason = job.record.reason
    assert reason.startswith("exit 1; disk full at "), reason


# -- a full disk on an SSH host (issue 24 finding 5) --------------------------------------

lab = test_ssh.lab  # SSH hosts on loopback


@pytest.fixture
def small_host(lab, home: Path):
    """A host whose workdir is its own 8 MB tmpfs, unmounted afterwards."""
    host = lab.add("h1")
    workdir = Path(host.workdir)
    workdir.mkdir()
    uid, gid = pwd.getpwnam(lab.user).pw_uid, pwd.getpwnam(lab.user).pw_gid
    done = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size=8m,uid={uid},gid={gid},mode=0700",
            "tmpfs",
            str(workdir),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root): {done.stderr.strip()}")
    test_ssh.configure(home, [host.entry(key=lab.key)])
    try:
        yield host
    finally:
        kill_all(f"MONKEY_HOME={home}")
        kill_until_gone(host.processes)
        subprocess.run(["umount", "-l", str(workdir)], check=True)


def test_an_upload_to_a_full_host_says_disk_full_and_leaves_nothing_partial(cli, small_host):
    workdir = small_host.workdir
    Path("train.py").write_text("print('hi')\n")
    Path("big.bin").write_bytes(os.urandom(12 << 20))  # more than the host's disk holds
    juid = test_ssh.run(
        cli, "--provider", "lab", "--dataset", "big.bin", "--", "python3", "train.py"
    )
    assert test_ssh.wait_state(cli, juid, "failed", "succeeded") == "failed"
    reason = test_ssh.job_info(cli, juid)["reason"]
    assert f"disk full on lab/h1 at {workdir}/blobs (" in reason and " bytes free)" in reason, (
        reason
    )
    assert "Socket is closed" not in reason and "exit 1" not in reason
    assert not [p for p in Path(workdir, "blobs").rglob("*") if p.is_file()]  # no partial blob

    Path("big.bin").write_bytes(os.urandom(1 << 20))  # one that fits: the host works again
    juid = test_ssh.run(
        cli, "--provider", "lab", "--dataset", "big.bin", "--", "python3", "train.py"
    )
    assert test_ssh.wait_state(cli, juid, "failed", "succeeded") == "succeeded"


def test_a_job_that_fills_a_hosts_disk_says_so(cli, small_host):
    juid = test_ssh.run(
        cli,
        "--provider",
        "lab",
        "--",
        "python3",
        "-c",
        "f = open('fill', 'wb')\nwhile True: f.write(bytes(65536))",
    )
    assert test_ssh.wait_state(cli, juid, "failed", "succeeded", "lost") == "failed"
    info = test_ssh.job_info(cli, juid)
    run_dir = f"{small_host.workdir}/runs/"
    assert info["reason"].startswith("exit "), info["reason"]
    assert (
        "; disk full on lab/h1 at " + run_dir in info["reason"] and " bytes free)" in info["reason"]
    ), info["reason"]


def test_a_start_that_cannot_copy_its_inputs_on_a_full_host_says_disk_full(cli, small_host):
    workdir = small_host.workdir
    Path("train.py").write_text("print('hi')\n")
    Path("data.bin").write_bytes(os.urandom(4 << 20))  # stored there, but not copied twice
    juid = test_ssh.run(
        cli, "--provider", "lab", "--dataset", "data.bin", "--", "python3", "train.py"
    )
    assert test_ssh.wait_state(cli, juid, "failed", "succeeded") == "failed"
    reason = test_ssh.job_info(cli, juid)["reason"]
    assert reason.startswith(f"could not start: disk full on lab/h1 at {workdir}/runs/"), reason
    assert " bytes free)" in reason and "Errno" not in reason, reason
    leftovers = [p for p in Path(workdir).rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert [p.parent.parent.name for p in leftovers] == ["blobs"], leftovers  # the stored blob only
