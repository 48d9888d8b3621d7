"""More spot cases end to end, on the parts of tests/test_spot.py (moto's server for EC2 and
S3, an sshd per instance address, a metadata service per address that the test controls):
two jobs on the noticed instance, a notice during the environment's set-up, the fallback to
on-demand capacity, a job cancelled before the notice, ``max_preemptions`` reached, and an
agent killed mid-job whose successor keeps uploading the job's checkpoint, and a job that
ended while no agent ran whose last checkpoint is still uploaded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import kill_core, start_core, wait_for
from tests.imds import Metadata
from tests.sshd import Lab, SSHHost
from tests.test_ec2 import fleet, info, run_job  # noqa: F401 - fixture
from tests.test_spot import (  # noqa: F401 - fixture
    _uploaded_epoch,
    address_of,
    epochs_done,
    expected,
    finish,
    metadata,
    spot_provider,
    stdout,
)


def _attempts_done(cli: Any, juid: str, state: str = "succeeded", attempts: int = 2) -> bool:
    job = info(cli, juid)
    return job["attempts"] == attempts and job["state"] == state


def _resumed_where_it_stopped(home: Path, juid: str, epochs: int) -> None:
    stopped_at = epochs_done(home, juid, 1)
    assert "stopping: preempted" in stdout(home, juid, 1)
    assert f"start at epoch {stopped_at}\n" in stdout(home, juid, 2)
    assert f"result {expected(epochs)}\n" in stdout(home, juid, 2)


def test_a_notice_stops_both_jobs_of_the_instance_and_both_resume(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port)
    try:
        jobs = [run_job(cli, "python3", "train.py") for _ in range(2)]
        for juid in jobs:
            wait_for(
                lambda j=juid: "epoch 2\n" in stdout(home, j, 1),
                timeout=60,
                what=f"{juid} at epoch 2",
            )
        [first] = {info(cli, juid)["instance"] for juid in jobs}  # t3.micro: 2 slots, one machine
        metadata[address_of(cli, jobs[0], moto)].interrupt(seconds=120)
        for juid in jobs:
            wait_for(
                lambda j=juid: _attempts_done(cli, j),
                timeout=120,
                what=f"{juid} to resume and succeed",
            )
        for juid in jobs:
            one, two = info(cli, juid)["attempts_detail"]
            assert one["reason"].startswith("preempted") and "checkpoint saved" in one["reason"], (
                one
            )
            assert one["instance"] == first and two["instance"] != first
            _resumed_where_it_stopped(home, juid, 12)
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)


def test_a_notice_during_the_environment_set_up(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port, epochs=3)
    shared = Path(tempfile.mkdtemp(prefix="monkey-spot-setup-"))  # the instances' user writes it
    shared.chmod(0o777)
    mark = shared / "installing"
    # The first set-up takes long (the notice comes then); the second is quick.
    Path("setup.sh").write_text(
        f'if [ ! -e "{mark}" ]; then touch "{mark}"; echo installing; sleep 60; fi\n'
        "echo installed\n"
    )
    Path("job.yml").write_text(
        "name: spot-setup\nrun:\n  env_type: none\n  install_script: setup.sh\ncode:\n  path: .\n"
    )
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(mark.exists, timeout=60, what="the set-up to start")
        assert "epoch" not in stdout(home, juid, 1)
        metadata[address_of(cli, juid, moto)].interrupt(seconds=120)
        wait_for(
            lambda: _attempts_done(cli, juid), timeout=120, what="the job to run again and succeed"
        )
        one, two = info(cli, juid)["attempts_detail"]
        assert one["reason"].startswith("preempted"), one  # not a set-up failure: not final
        assert two["reason"] == "exit 0" and two["instance"] != one["instance"]
        assert "start at epoch 0\n" in stdout(
            home, juid, 2
        ) and f"result {expected(3)}\n" in stdout(home, juid, 2)
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)
        shutil.rmtree(shared, ignore_errors=True)


def test_on_demand_after_one_preemption(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(
        cli, moto, fleet, home, metadata["127.0.0.4"].port, fallback={"on_demand_after": 1}
    )
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 2\n" in stdout(home, juid, 1), timeout=60, what="epoch 2")
        metadata[address_of(cli, juid, moto)].interrupt(seconds=120)
        wait_for(
            lambda: _attempts_done(cli, juid), timeout=120, what="the job to resume and succeed"
        )
        one, two = info(cli, juid)["attempts_detail"]
        assert (one["spot"], two["spot"]) == (True, False)
        _resumed_where_it_stopped(home, juid, 12)
        rows = cli("info", "job", juid, check=True).stdout.splitlines()
        header = next(i for i, line in enumerate(rows) if "CAPACITY" in line)
        assert "spot" in rows[header + 1] and "on-demand" in rows[header + 2], rows
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)


# Stops slowly when told to: the notice comes while the cancel's SIGTERM is being handled.
SLOW_STOP = """\
import signal, sys, time
def stop(*_):
    print("asked to stop", flush=True)
    time.sleep(2)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("running", flush=True)
time.sleep(300)
"""


def test_a_job_cancelled_before_the_notice_stays_cancelled(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port)
    Path("slow.py").write_text(SLOW_STOP)
    try:
        juid = run_job(cli, "python3", "slow.py")
        wait_for(lambda: "running\n" in stdout(home, juid, 1), timeout=60, what="the job to run")
        address = address_of(cli, juid, moto)
        cli("job", "cancel", juid, check=True)
        wait_for(
            lambda: "asked to stop\n" in stdout(home, juid, 1),
            timeout=30,
            what="the cancel's SIGTERM",
        )
        metadata[address].interrupt(seconds=120)
        wait_for(
            lambda: info(cli, juid)["state"] == "cancelled",
            timeout=60,
            what="the job to end cancelled",
        )
        job = info(cli, juid)
        assert job["attempts"] == 1 and job["attempts_detail"][0]["reason"] == "cancelled by user"
        assert not any(e["kind"] in ("preempt", "retry") for e in job["events"]), job["events"]
        wait_for(lambda: moto.instances() == [], timeout=30, what="the noticed instance to go")
        assert info(cli, juid)["state"] == "cancelled" and info(cli, juid)["attempts"] == 1
    finally:
        finish(cli, moto)


def test_max_preemptions_reached_ends_the_job_preempted(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port, max_preemptions=0)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: "epoch 2\n" in stdout(home, juid, 1), timeout=60, what="epoch 2")
        metadata[address_of(cli, juid, moto)].interrupt(seconds=120)
        wait_for(
            lambda: info(cli, juid)["state"] == "preempted",
            timeout=60,
            what="the job to end preempted",
        )
        job = info(cli, juid)
        [one] = job["attempts_detail"]
        assert "checkpoint saved" in one["reason"] and one["reason"].endswith(
            "preempted 1 times, max_preemptions is 0"
        ), one
        shown = cli("info", "job", juid, check=True).stdout
        assert "max_preemptions is 0" in shown
        wait_for(lambda: moto.instances() == [], timeout=30, what="the noticed instance to go")
        assert info(cli, juid)["state"] == "preempted" and info(cli, juid)["attempts"] == 1
    finally:
        finish(cli, moto)


def agent_pid(host: SSHHost) -> int | None:
    """The pid of the monkey agent serving HOST (its root lies in the host's folder)."""
    for pid in host.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
        except OSError:
            continue
        if b"monkey.client_agent" in b" ".join(cmd) and b"--root" in cmd:
            return pid
    return None


def test_an_agent_killed_mid_job_is_replaced_and_the_job_keeps_uploading(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port, epochs=40)
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: _uploaded_epoch(moto, home, juid) >= 2, timeout=60, what="a first upload")
        address = address_of(cli, juid, moto)
        [host] = [h for h in fleet.hosts if h.address == address]
        [kept] = list(host.dir.rglob("results.json"))
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        form = json.loads(kept.read_text())["fields"]
        old = wait_for(lambda: agent_pid(host), what="the agent")
        os.kill(old, signal.SIGKILL)
        killed_at = epochs_done(home, juid, 1)
        wait_for(lambda: agent_pid(host) not in (None, old), timeout=60, what="a new agent")
        # The new agent adopted the job and uploads its checkpoint again.
        wait_for(
            lambda: _uploaded_epoch(moto, home, juid) >= killed_at + 3,
            timeout=60,
            what="uploads after the agent was replaced",
        )
        metadata[address].interrupt(seconds=120)
        wait_for(
            lambda: _attempts_done(cli, juid), timeout=120, what="the job to resume and succeed"
        )
        one, _ = info(cli, juid)["attempts_detail"]
        assert "checkpoint saved" in one["reason"], one
        _resumed_where_it_stopped(home, juid, 40)
        # The presigned form stays on the instance: in no log, event or record here.
        secrets = [v for k, v in form.items() if "signature" in k.lower() or k.lower() == "policy"]
        assert secrets
        for path in [home / "daemon.log", *home.rglob("events.jsonl"), *home.rglob("*.log")]:
            text = path.read_text(errors="replace") if path.is_file() else ""
            assert not any(s in text for s in secrets), path
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)


def test_a_job_that_ended_while_no_agent_ran_has_its_last_checkpoint_uploaded(
    cli, home: Path, moto: Any, fleet: Lab, metadata: dict[str, Metadata]
) -> None:
    # The agent dies (and the core, so none replaces it) mid-job; the job saves its last
    # checkpoint and ends. The agent that adopts the ended job uploads that checkpoint
    # before telling the exit, as the first would have.
    spot_provider(cli, moto, fleet, home, metadata["127.0.0.4"].port, epochs=8)
    # Each epoch waits for `go` in the run folder, given once the agent is dead: under load
    # the whole job could end before the kill.
    gate = '    while not os.path.exists(os.path.join(os.environ["MONKEY_RUN_DIR"], "go")):\n'
    mark = '    print("epoch", state["epoch"], flush=True)\n'
    train = Path("train.py").read_text()
    Path("train.py").write_text(train.replace(mark, mark + gate + "        time.sleep(0.05)\n"))
    try:
        juid = run_job(cli, "python3", "train.py")
        wait_for(lambda: _uploaded_epoch(moto, home, juid) >= 1, timeout=60, what="a first upload")
        [host] = [h for h in fleet.hosts if h.address == address_of(cli, juid, moto)]
        kill_core(home)
        os.kill(wait_for(lambda: agent_pid(host), what="the agent"), signal.SIGKILL)
        uploaded = _uploaded_epoch(moto, home, juid)
        assert uploaded < 8
        [out] = list(host.dir.rglob(f"{juid}/1/stdout.log"))
        (out.parent / "go").write_text("")
        wait_for(
            lambda: f"result {expected(8)}\n" in out.read_text(), timeout=60, what="the job to end"
        )
        start_core(home)
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=120, what="the exit")
        assert _uploaded_epoch(moto, home, juid) == 8
        assert info(cli, juid)["attempts"] == 1
        wait_for(lambda: moto.instances() == [], timeout=30, what="idle termination")
    finally:
        finish(cli, moto)
