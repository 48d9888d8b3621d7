"""The `slurm` provider through a login host: every Slurm command runs over SSH on a
loopback sshd (tests/sshd.py) in front of the real single-node Slurm (tests/slurm.py), and
MONKEY_HOME is not shared with the cluster (it is private to this user; jobs run as the
login host's user, with their files under the provider's workdir there)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import wait_for
from slurm import PARTITION, SlurmLab, slurm, slurm_cluster  # noqa: F401 - fixtures
from sshd import Lab, SSHHost, free_port
from test_slurm import TRAIN, attempt_logs, info, monkey_jobs, run_job

from monkey.models import State


@pytest.fixture
def login(
    home: Path, tmp_path: Path, slurm: SlurmLab, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> Iterator[tuple[Lab, SSHHost]]:
    """A login host whose sessions find the cluster (SLURM_CONF), and ~/.ssh to reach it."""
    client_home = tmp_path / "client"
    monkeypatch.setenv("HOME", str(client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lab = Lab(client_home)
    host = lab.add("login", env=slurm.env)
    yield lab, host
    cli("daemon", "stop")
    lab.close()


def add_provider(cli: Any, lab: Lab, host: SSHHost, *extra: str) -> Any:
    return cli(
        "provider",
        "add",
        "slurm",
        "cluster",
        "--login",
        f"{host.user}@{host.address}:{host.port}",
        "--key",
        lab.key,
        "--workdir",
        f"{host.workdir}/slurm",
        *extra,
    )


def test_provider_add_validates_over_ssh_and_a_job_runs_with_its_outputs_back(
    cli: Any, home: Path, login: tuple[Lab, SSHHost], slurm: SlurmLab
) -> None:
    lab, host = login
    added = add_provider(cli, lab, host)
    assert added.returncode == 0, added.stderr
    assert f"partition {PARTITION}: 1 idle" in added.stdout
    entry = yaml.safe_load((home / "providers.yml").read_text())["providers"]["cluster"]
    assert entry["login"] == {
        "host": host.address,
        "user": host.user,
        "port": host.port,
        "key": lab.key,
    }
    listing = cli("list", "providers", check=True).stdout
    assert f"cluster: partition {PARTITION} (up): 1 idle" in listing, listing

    Path("make.sh").write_text(
        "mkdir -p results; echo 42 > results/answer.txt; echo scratch > tmp.txt\n"
        'echo "hi from $SLURM_JOB_ID as $(id -un)"; echo oops >&2\n'
    )
    juid = run_job(cli, "sh", "make.sh", options=("--outputs", "results/*", "--cpus", "2"))
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=90,
        what="the job to end",
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", job
    slurm_id = job["instance"].split("/")[1]
    assert (
        cli("logs", "--stdout", juid, check=True).stdout == f"hi from {slurm_id} as {host.user}\n"
    )
    assert cli("logs", "--stderr", juid, check=True).stdout == "oops\n"
    work = home / "runs" / juid / "1" / "work"
    assert (work / "results" / "answer.txt").read_text() == "42\n"
    assert not (work / "tmp.txt").exists()
    # The agent's code, the allocation's files and Slurm's output live in the workdir on
    # the cluster, nothing of it in MONKEY_HOME.
    assert (Path(host.workdir) / "slurm" / "logs" / f"{slurm_id}.out").exists()
    assert not (home / "slurm").exists()
    wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="the allocation to be released")
    log = (home / "daemon.log").read_text()
    assert "lost the link" not in log and "cannot reach the agent" not in log, log


def test_cancel_through_the_login_host_leaves_no_slurm_job(
    cli: Any, home: Path, login: tuple[Lab, SSHHost], slurm: SlurmLab
) -> None:
    lab, host = login
    add_provider(cli, lab, host).check_returncode()
    juid = run_job(cli, "sh", "-c", "echo started; exec sleep 300")
    wait_for(lambda: cli("logs", juid).stdout == "started\n", timeout=90, what="the job to run")
    assert len(monkey_jobs(slurm)) == 1
    cli("job", "cancel", juid, check=True)
    wait_for(lambda: info(cli, juid)["state"] == "cancelled", timeout=30, what="the cancel")
    wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="no allocation left")


def test_pause_through_the_login_host_brings_the_checkpoint_back_and_resume_goes_on(
    cli: Any, home: Path, login: tuple[Lab, SSHHost], slurm: SlurmLab
) -> None:
    lab, host = login
    add_provider(cli, lab, host).check_returncode()
    Path("train.py").write_text(TRAIN)
    juid = run_job(cli, "python3", "train.py", "10")
    wait_for(lambda: "epoch 3\n" in cli("logs", juid).stdout, timeout=90, what="three epochs")
    cli("job", "pause", juid, check=True)
    wait_for(lambda: info(cli, juid)["state"] == "paused", timeout=60, what="the pause")
    saved = int(attempt_logs(cli, juid, 1).split("checkpointed at epoch ")[1].split()[0])
    assert (home / "runs" / juid / "checkpoint" / "epoch").read_text() == str(saved)  # back home
    wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="the allocation to be released")
    cli("job", "resume", juid, check=True)
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=120,
        what="the job to end",
    )
    assert info(cli, juid)["state"] == "succeeded"
    log2 = attempt_logs(cli, juid, 2)
    assert log2.startswith(f"resumed from epoch {saved}\nepoch {saved + 1}\n") and log2.endswith(
        "done\n"
    ), log2
    wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="no allocation left")


def test_a_sweep_through_the_login_host_is_one_job_array(
    cli: Any, home: Path, monkey: Any, login: tuple[Lab, SSHHost], slurm: SlurmLab
) -> None:
    lab, host = login
    add_provider(cli, lab, host).check_returncode()
    sid = cli(
        "sweep",
        "--grid",
        "k=0,1,2,3,4,5",
        "--max-parallel",
        "3",
        "-p",
        "cluster",
        "--",
        "sh",
        "-c",
        "echo cell {k} in $SLURM_ARRAY_JOB_ID; sleep 1",
        check=True,
    ).stdout.strip()
    jobs = lambda: monkey.store.list_jobs(sweep=sid)  # noqa: E731
    wait_for(
        lambda: all(j.state == State.SUCCEEDED for j in jobs()),
        timeout=180,
        what="every cell to succeed",
    )
    # Each cell ran in its own task of one array (ARRAYID_TASK), made by one sbatch.
    tasks = {info(cli, j.juid)["instance"].split("/")[1] for j in jobs()}
    arrays = {task.split("_")[0] for task in tasks}
    assert len(tasks) == 6 and len(arrays) == 1, tasks
    assert len(monkey.store.instances("cluster")) == 6  # no surplus allocation
    [array] = arrays
    for job in jobs():
        assert (
            cli("logs", "--stdout", job.juid, check=True).stdout
            == f"cell {job.params['k']} in {array}\n"
        )
    wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="no task of the array left")


def test_an_unreachable_login_host_is_one_line_and_the_job_waits_with_it(
    cli: Any, home: Path, login: tuple[Lab, SSHHost], slurm: SlurmLab
) -> None:
    lab, host = login
    closed = free_port(host.address)  # nothing listens there
    bad = cli(
        "provider",
        "add",
        "slurm",
        "cluster",
        "--login",
        f"{host.user}@{host.address}:{closed}",
        "--key",
        lab.key,
    )
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "login host" in bad.stderr and "unreachable" in bad.stderr, bad.stderr
    assert (
        not (home / "providers.yml").exists()
        or "cluster" not in (home / "providers.yml").read_text()
    )

    entry = {
        "type": "slurm",
        "partition": PARTITION,
        "workdir": f"{host.workdir}/slurm",
        "login": {"host": host.address, "port": closed, "user": host.user, "key": lab.key},
    }
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"cluster": entry}}))
    juid = run_job(cli, "true")
    wait_for(
        lambda: "unreachable" in (info(cli, juid)["waiting"] or ""),
        timeout=60,
        what="the job to say why it waits",
    )
    job = info(cli, juid)
    assert (
        job["state"] == "queued" and "\n" not in job["waiting"] and "login host" in job["waiting"]
    ), job
    assert not monkey_jobs(slurm)
    # An unknown host key: refused, with the setting that accepts it.
    (Path(lab.ssh_dir) / "known_hosts").write_text("")
    unknown = add_provider(cli, lab, host, "--force")
    assert unknown.returncode != 0 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "is unknown" in unknown.stderr and "trust_new_host" in unknown.stderr, unknown.stderr
    assert add_provider(cli, lab, host, "--trust-new-host", "--force").returncode == 0
    assert json.loads(cli("list", "providers", "--json", check=True).stdout)
