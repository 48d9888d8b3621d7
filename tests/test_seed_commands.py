"""The original Monkey's commands and habits: `--juid JOB` wherever a JOB is taken,
`create instance` / `delete instance`, and sweeps found by their `--name`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.sshd import Lab
from tests.test_ec2 import add_aws, fleet  # noqa: F401  (the loopback sshd fleet)
from tests.test_ssh import configure, lab  # noqa: F401  (the SSH hosts fixture)


def info(cli: Any, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def ended(cli: Any, juid: str) -> str:
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed", "cancelled"),
        what=f"{juid} to end",
    )
    return info(cli, juid)["state"]


def test_juid_is_taken_wherever_a_job_is(cli, home: Path) -> None:
    first = cli("run", "--", "sh", "-c", "echo one", check=True).stdout.strip()
    # The seed's script: `monkey logs --follow --juid X` follows to the end, with its code.
    follow = cli("logs", "--follow", "--juid", first)
    assert (follow.returncode, follow.stdout) == (0, "one\n"), follow.stderr
    assert cli("logs", f"--juid={first}", check=True).stdout == "one\n"
    assert (
        info(cli, first)["job"]
        == json.loads(cli("info", "--juid", first, "--json", check=True).stdout)["job"]
    )
    assert cli("metrics", "--juid", first, check=True).returncode == 0

    slow = cli("run", "--", "sleep", "60", check=True).stdout.strip()
    paused = cli("job", "pause", "--juid", slow)
    assert paused.returncode == 0 and paused.stdout.startswith(slow), paused.stderr
    wait_for(lambda: info(cli, slow)["state"] == "paused", what="the pause")
    cancelled = cli("job", "cancel", "--juid", slow, "--juid", first)
    assert slow in cancelled.stdout and "Traceback" not in cancelled.stderr
    assert info(cli, slow)["state"] == "cancelled"
    diff = cli("diff", "--juid", first, "--juid", slow, "--json")
    assert diff.returncode == 0 and json.loads(diff.stdout)["jobs"] == [first, slow]
    assert cli("compare", "--juid", first, "--json", check=True).returncode == 0

    # Both forms at once, or none: one line naming the fix, exit 2, nothing done.
    both = cli("logs", first, "--juid", slow)
    assert both.returncode == 2 and both.stderr == (
        "monkey: error: monkey logs: give the job once: as JOB or as --juid JOB; "
        "see `monkey logs --help`\n"
    )
    none = cli("job", "pause")
    assert none.returncode == 2 and none.stderr == (
        "monkey: error: monkey job pause: give at least one job (JOB or --juid JOB); "
        "see `monkey job pause --help`\n"
    )
    assert cli("info", "job").stderr == (
        "monkey: error: monkey info job: name the job (JOB or "
        "--juid JOB, e.g. `last`); see `monkey info job --help`\n"
    )
    assert "--juid JOB" in cli("job", "cancel", "--help", check=True).stdout


def test_a_sweep_is_found_by_its_name(cli, home: Path) -> None:
    sid = cli(
        "sweep", "--name", "lr-scan", "--grid", "x=1,2", "--", "echo", "{x}", check=True
    ).stdout.strip()
    status = cli("sweep", "status", "lr-scan", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id"] == sid and json.loads(status.stdout)["name"] == "lr-scan"
    wait_for(
        lambda: json.loads(cli("sweep", "status", sid, "--json").stdout)["state"] == "finished",
        what="the sweep to end",
    )
    rows = json.loads(cli("compare", "--sweep", "lr-scan", "--json", check=True).stdout)
    assert sorted(r["job"] for r in rows) == sorted(
        j["job"] for j in json.loads(status.stdout)["jobs"]
    )
    other = cli(
        "sweep", "--name", "lr-scan", "--grid", "x=3", "--", "echo", "{x}", check=True
    ).stdout.strip()
    twice = cli("sweep", "status", "lr-scan")
    assert twice.returncode == 1
    assert twice.stderr == (
        f"monkey: error: several sweeps are named 'lr-scan' ({other}, {sid}); give the id\n"
    )
    assert json.loads(cli("sweep", "status", sid, "--json", check=True).stdout)["id"] == sid


def test_create_and_delete_an_ec2_instance(cli, home: Path, moto: Any, fleet: Lab) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "600")
    try:
        made = cli("create", "instance", "--provider", "aws")
        assert made.returncode == 0, made.stderr
        instance = made.stdout.strip()
        assert re.fullmatch(r"aws/i-[0-9a-f]+", instance), made.stdout
        assert f"aws: {instance} created (t3.micro)" in made.stderr
        assert [i["State"]["Name"] for i in moto.instances()] in (["pending"], ["running"])
        listed = json.loads(
            cli("list", "providers", "--monkey-instances", "--json", check=True).stdout
        )["instances"]
        assert [i["id"] for i in listed] == [instance]

        # It serves jobs as any instance the core made.
        juid = cli("run", "-p", "aws", "--", "echo", "hi", check=True).stdout.strip()
        assert ended(cli, juid) == "succeeded", info(cli, juid)
        assert info(cli, juid)["instance"] == instance

        # max_instances holds for requests too: one line, nothing made.
        again = cli("create", "instance", "--provider", "aws")
        assert again.returncode == 1 and len(again.stderr.splitlines()) == 1, again.stderr
        assert "max_instances is 1" in again.stderr
        assert len(moto.instances()) == 1

        # One that runs a job is ended only with --force: the job ends lost.
        busy = cli("run", "-p", "aws", "--", "sleep", "120", check=True).stdout.strip()
        wait_for(lambda: info(cli, busy)["state"] == "running", what="the job to run")
        refused = cli("delete", "instance", instance)
        assert refused.returncode == 1 and refused.stderr == (
            f"monkey: error: deleting {instance}: instance {instance} runs job(s) {busy}; cancel "
            f"them first (`monkey job cancel {busy}`), or add --force (they end lost and are "
            "retried while retries remain)\n"
        )
        gone = cli("delete", "instance", instance[:9], "--force")  # a unique prefix
        assert (gone.returncode, gone.stdout) == (0, f"{instance} terminated\n"), gone.stderr
        wait_for(lambda: info(cli, busy)["state"] == "lost", what="the job to end lost")
        wait_for(
            lambda: all(
                i["State"]["Name"] in ("shutting-down", "terminated") for i in moto.instances()
            ),
            what="the termination",
        )
        missing = cli("delete", "instance", instance)
        assert missing.returncode == 1
        assert missing.stderr.startswith(f"monkey: error: '{instance}' is no live instance")
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances() if i["State"]["Name"] != "terminated"]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_create_and_delete_instance_on_ssh_hosts(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    made = cli("create", "instance", "--provider", "lab")
    assert (made.returncode, made.stdout) == (0, "lab/h1\n"), made.stderr
    assert os.listdir(Path(host.workdir) / "agent"), "no agent was installed"
    # Claimed: its agent runs there before any job.
    providers = json.loads(cli("list", "providers", "--json", check=True).stdout)["providers"]
    [row] = [p for p in providers if p["name"] == "lab"][0]["hosts"]
    assert row["state"] == "up", row

    wrong = cli("create", "instance", "--provider", "lab", "--size", "t3.micro")
    assert wrong.returncode == 1 and "--size and --spot are for cloud providers" in wrong.stderr
    named = cli("create", "instance", "--provider", "lab", "--host", "h1")  # as `run --host`
    assert (named.returncode, named.stdout) == (0, "lab/h1\n"), named.stderr
    nohost = cli("create", "instance", "--provider", "lab", "--host", "nope")
    assert nohost.returncode == 1 and "has no host 'nope'; its hosts: lab/h1" in nohost.stderr
    local = cli("create", "instance", "--provider", "local")
    assert local.returncode == 1 and "there is no instance to create" in local.stderr

    busy = cli("run", "-p", "lab", "--", "sleep", "60", check=True).stdout.strip()
    wait_for(lambda: info(cli, busy)["state"] == "running", what="the job to run")
    refused = cli("delete", "instance", "lab/h1")
    assert refused.returncode == 1 and refused.stderr == (
        f"monkey: error: deleting lab/h1: instance lab/h1 runs job(s) {busy}; cancel them "
        f"first (`monkey job cancel {busy}`)\n"
    )
    forced = cli("delete", "instance", "lab/h1", "--force")  # an SSH host's jobs would run on
    assert forced.returncode == 1 and "--force" not in forced.stderr, forced.stderr
    assert info(cli, busy)["state"] == "running"
    cli("job", "cancel", busy, check=True)
    assert ended(cli, busy) == "cancelled"
    gone = cli("delete", "instance", "lab/h")  # a unique prefix
    assert (gone.returncode, gone.stdout) == (0, "lab/h1 released\n"), gone.stderr
    # Released, not gone: the next job contacts it again.
    again = cli("run", "-p", "lab", "--", "echo", "back", check=True).stdout.strip()
    assert ended(cli, again) == "succeeded"
    cli("daemon", "stop")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["create", "instance"], "the following arguments are required: --provider/-p"),
        (["create", "instance", "-p", "nope"], "no provider 'nope'"),
        (["delete", "instance", "i-nothing"], "'i-nothing' is no live instance (live: none)"),
    ],
)
def test_create_delete_instance_bad_input(cli, home: Path, argv: list[str], message: str) -> None:
    proc = cli(*argv)
    assert proc.returncode in (1, 2) and message in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_create_instance_on_slurm_is_refused_in_one_line(cli, home: Path) -> None:
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text("providers:\n  hpc: {type: slurm, partition: debug}\n")
    proc = cli("create", "instance", "--provider", "hpc")
    assert proc.returncode == 1
    assert proc.stderr == (
        "monkey: error: provider 'hpc' (slurm) gets one allocation per job "
        "when it starts; there is no instance to create ahead\n"
    )


def test_a_request_left_under_way_by_a_dead_core_ends_in_one_line(cli, home: Path) -> None:
    from monkey.config import Home
    from monkey.store import Store

    store = Store(Home(home).ensure().db)
    try:
        rid = store.add_instance_request("create", "local")
        store.set_instance_request(rid, "working")  # as a core that died mid-create left it
    finally:
        store.close()
    cli("daemon", "start", check=True)

    def state() -> dict[str, Any]:
        s = Store(Home(home).db)
        try:
            return s.instance_request(rid) or {}
        finally:
            s.close()

    wait_for(lambda: state()["state"] == "failed", what="the request to be failed")
    assert state()["detail"].startswith("the core stopped while it was under way")
    cli("daemon", "stop")


def test_tab_completes_job_ids_after_juid(cli, home: Path) -> None:
    juid = cli("run", "--", "true", check=True).stdout.strip()
    for argv in (
        ["logs", "--follow", "--juid", ""],
        ["job", "pause", "--juid", juid[:4]],
        ["web", "--juid", ""],
        ["report", "--jobs", juid[:4]],
    ):
        words = cli("__complete", *argv, check=True).stdout.split()
        assert juid in words, (argv, words)
    assert cli("__complete", "logs", "--ju", check=True).stdout.split() == ["--juid"]
