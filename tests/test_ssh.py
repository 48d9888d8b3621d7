"""The `ssh` provider against real OpenSSH servers on loopback (see tests/sshd.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_for
from tests.driver_contract import DriverContract, Target, provider, serve
from tests.in_job import SCRIPT, bare_python, check_tracked, open_tmp, site_packages, tracked  # noqa: F401
from tests.sshd import Lab, SSHHost


@pytest.fixture
def lab(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """SSH hosts on loopback, with the client's ~/.ssh in a private HOME."""
    client_home = tmp_path / "client"
    monkeypatch.setenv("HOME", str(client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("MONKEY_HEARTBEAT_TIMEOUT", "4")
    lab = Lab(client_home)
    yield lab
    lab.close()


def configure(home: Path, hosts: list[dict[str, Any]], name: str = "lab", **options: Any) -> None:
    providers = {"providers": {name: {"type": "ssh", "hosts": hosts, **options}}}
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text(yaml.safe_dump(providers))


class TestSSHContract(DriverContract):
    """The driver contract against a real sshd on loopback."""

    @pytest.fixture
    def target(self, home: Path, lab: Lab) -> Iterator[Target]:
        host = lab.add("h1")
        config = provider(home, "lab", {"type": "ssh", "hosts": [host.entry(key=lab.key)]})
        yield from serve(config, home, ["lab/h1"])


def remote_runs(host: SSHHost) -> Path:
    """The host's folder of this MONKEY_HOME's runs."""
    [tag] = os.listdir(Path(host.workdir) / "runs")
    return Path(host.workdir) / "runs" / tag


def job_info(cli, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def run(cli, *args: str) -> str:
    out = cli("run", "--json", *args, check=True).stdout
    return json.loads(out)["job"]


def state(cli, juid: str) -> str:
    return job_info(cli, juid)["state"]


def wait_state(cli, juid: str, *states: str, timeout: float = 30) -> str:
    return wait_for(
        lambda: (s := state(cli, juid)) in states and s,
        timeout=timeout,
        what=f"{juid} to be {'/'.join(states)}",
    )  # type: ignore[return-value]


def test_first_contact_installs_agent_once_and_runs_jobs(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("train.py").write_text("import sys; print('hello from', sys.argv[1])\n")
    first = run(cli, "--provider", "lab", "--", "python3", "train.py", "one")
    assert wait_state(cli, first, "succeeded", "failed") == "succeeded", job_info(cli, first)
    assert cli("logs", first, check=True).stdout == "hello from one\n"
    installed = sorted(os.listdir(Path(host.workdir) / "agent"))
    assert len(installed) == 1
    stamp = os.stat(Path(host.workdir) / "agent" / installed[0]).st_mtime_ns

    second = run(cli, "--provider", "lab", "--", "python3", "train.py", "two")
    assert wait_state(cli, second, "succeeded", "failed") == "succeeded"
    assert cli("logs", second, check=True).stdout == "hello from two\n"
    assert sorted(os.listdir(Path(host.workdir) / "agent")) == installed
    assert os.stat(Path(host.workdir) / "agent" / installed[0]).st_mtime_ns == stamp
    assert job_info(cli, second)["instance"] == "lab/h1"


def _fingerprint(host: SSHHost) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(base64.b64decode(host.host_key_pub[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def keyscan(host: SSHHost, hashed: bool = False) -> str:
    """What `ssh-keyscan [-H] -p PORT ADDRESS` prints of the host's ed25519 key."""
    done = subprocess.run(
        [
            "ssh-keyscan",
            *(["-H"] if hashed else []),
            "-t",
            "ed25519",
            "-p",
            str(host.port),
            host.address,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert host.host_key_pub[1] in done.stdout, done
    return done.stdout


def waiting(cli, juid: str) -> str:
    """Why the queued job waits (`info job`), once it says so."""
    return wait_for(lambda: job_info(cli, juid).get("waiting"), what=f"{juid} to say why it waits")  # type: ignore[return-value]


def test_unknown_host_key_keeps_jobs_queued_until_keyscan(cli, home: Path, lab: Lab) -> None:
    """Issue 25 section 4: a job never fails because its host cannot be trusted yet; it waits,
    saying why, and starts as soon as `ssh-keyscan >> ~/.ssh/known_hosts` is done (no restart)."""
    host = lab.add("h1", trusted=False)
    configure(home, [host.entry(key=lab.key)])
    juid = run(cli, "--provider", "lab", "--", "true")
    why = waiting(cli, juid)
    assert f"host key of [{host.address}]:{host.port} is unknown" in why
    assert _fingerprint(host) in why and "trust_on_first_use" in why
    # The core's dispatch passes saw it (and keep seeing it): the job is neither failed nor tried.
    wait_for(
        lambda: "lab: jobs wait: " in (home / "daemon.log").read_text(), what="the core to say why"
    )
    info = job_info(cli, juid)
    assert (info["state"], info["attempts"]) == ("queued", 0), info
    assert "is unknown" in cli("info", "job", juid, check=True).stdout
    assert "is unknown" in cli("list", "providers", check=True).stdout
    assert not (Path(host.workdir) / "agent").exists()  # nothing was installed

    pid = (home / "daemon.pid").read_text().split()[0]
    with open(lab.ssh_dir / "known_hosts", "a") as fh:
        fh.write(keyscan(host))
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
    assert (home / "daemon.pid").read_text().split()[0] == pid  # the same core
    assert "is unknown" not in cli("list", "providers", check=True).stdout
    assert not (home / "known_hosts").exists()  # trusted through the user's file only


def test_unknown_host_key_trusted_on_first_use(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1", trusted=False)
    configure(home, [host.entry(key=lab.key)], trust_on_first_use=True)
    juid = run(cli, "--provider", "lab", "--", "true")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    assert host.host_key_pub[1] in (home / "known_hosts").read_text()


def test_changed_host_key_keeps_jobs_queued_until_known_hosts_is_fixed(
    cli, home: Path, lab: Lab
) -> None:
    host = lab.add("h1", trusted=False)
    other = lab.add("h2", trusted=False)
    # known_hosts pins h2's key under h1's name: h1 now presents a "changed" key.
    line = f"[{host.address}]:{host.port} {' '.join(other.host_key_pub)}\n"
    (lab.ssh_dir / "known_hosts").write_text(line)
    configure(home, [host.entry(key=lab.key)], trust_on_first_use=True)
    juid = run(cli, "--provider", "lab", "--", "true")
    assert "has CHANGED" in waiting(cli, juid)
    assert state(cli, juid) == "queued"
    assert not (home / "known_hosts").exists()

    # The user checks the host and replaces the line, hashed as `ssh-keyscan -H` writes it.
    (lab.ssh_dir / "known_hosts").write_text(keyscan(host, hashed=True))
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
    assert not (home / "known_hosts").exists()


def test_jobs_spread_by_capacity_and_gpus_assigned(cli, home: Path, lab: Lab) -> None:
    hosts = [lab.add(f"h{i}") for i in range(3)]
    configure(
        home,
        [
            hosts[0].entry(key=lab.key, cpus=2, gpus=2),
            hosts[1].entry(key=lab.key, cpus=1),
            hosts[2].entry(key=lab.key, cpus=1),
        ],
    )
    Path("hold.py").write_text(
        "import os, sys, time\n"
        "print('gpus=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'), flush=True)\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
    )
    release = hosts[0].dir / "release"
    gpu_jobs = [
        run(cli, "--provider", "lab", "--gpus", "1", "--", "python3", "hold.py", str(release))
        for _ in range(2)
    ]
    cpu_jobs = [
        run(cli, "--provider", "lab", "--", "python3", "hold.py", str(release)) for _ in range(3)
    ]
    for juid in gpu_jobs:
        wait_state(cli, juid, "running")
    running = wait_for(
        lambda: (
            [j for j in cpu_jobs if state(cli, j) == "running"]
            if sum(state(cli, j) == "running" for j in cpu_jobs) == 2
            else None
        ),
        what="two cpu jobs running",
    )
    waiting = [j for j in cpu_jobs if j not in running]
    # h0 is full with the two GPU jobs, h1 and h2 take one job each; the fifth waits.
    assert {job_info(cli, j)["instance"] for j in gpu_jobs} == {"lab/h0"}
    assert {job_info(cli, j)["instance"] for j in running} == {"lab/h1", "lab/h2"}
    assert state(cli, waiting[0]) == "queued"
    started = gpu_jobs + running
    wait_for(lambda: all(cli("logs", j).stdout for j in started), what="the jobs' output")
    assert sorted(cli("logs", j).stdout for j in gpu_jobs) == ["gpus=0\n", "gpus=1\n"]
    assert [cli("logs", j).stdout for j in running] == ["gpus=-\n"] * 2
    release.write_text("")
    os.chmod(release, 0o644)
    for juid in gpu_jobs + cpu_jobs:
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"


COUNTER = """\
import sys, time
for i in range(int(sys.argv[1])):
    print(f"line {i:05d} " + "x" * 60, flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_link_cut_mid_job_keeps_job_and_logs_complete(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("count.py").write_text(COUNTER)
    juid = run(cli, "--provider", "lab", "--", "python3", "count.py", "150", "0.03")
    wait_for(lambda: "line 00020" in cli("logs", juid).stdout, what="output before the cut")
    host.cut()
    remote_log = remote_runs(host) / juid / "1" / "stdout.log"
    wait_for(
        lambda: remote_log.exists() and "line 00080" in remote_log.read_text(),
        what="the job to keep printing while cut off",
    )
    assert state(cli, juid) == "running"
    host.restore()
    wait_for(
        lambda: "line 00100" in cli("logs", juid).stdout, what="output after the link returned"
    )
    host.restart_sshd()  # the other way to lose the link: sshd itself dies and comes back
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    expected = "".join(f"line {i:05d} " + "x" * 60 + "\n" for i in range(150))
    assert cli("logs", juid).stdout == expected
    assert remote_log.read_text() == expected


EPOCHS = """\
import os, sys, time
ckpt = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "epoch.txt")
start = int(open(ckpt).read()) + 1 if os.path.exists(ckpt) else 1
print(f"start at epoch {start}", flush=True)
for epoch in range(start, int(sys.argv[1]) + 1):
    time.sleep(float(sys.argv[2]))
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(epoch))
    os.replace(ckpt + ".tmp", ckpt)
    print(f"epoch {epoch}", flush=True)
"""


def test_lost_host_resumes_elsewhere_from_checkpoint_and_stale_is_fenced(
    cli, home: Path, lab: Lab
) -> None:
    first, second = lab.add("h1"), lab.add("h2")
    configure(home, [first.entry(key=lab.key, cpus=1)], checkpoint_every=0.2, lost_after=3)
    # Held at its end while its run folder holds `hold`: the attempt on the lost host runs on
    # until it is fenced, however long the rest takes.
    Path("train.py").write_text(
        EPOCHS + "while os.path.exists(os.path.join(os.environ['MONKEY_RUN_DIR'], "
        "'hold')):\n    time.sleep(0.05)\n"
    )
    juid = run(
        cli, "--provider", "lab", "--retries", "1", "--", "python3", "train.py", "80", "0.25"
    )
    wait_for(lambda: "epoch 3\n" in cli("logs", juid).stdout, what="three epochs")
    (remote_runs(first) / juid / "1" / "hold").write_text("")
    ckpt = home / "runs" / juid / "checkpoint" / "epoch.txt"
    wait_for(
        lambda: ckpt.exists() and int(ckpt.read_text()) >= 3, what="the checkpoint synced back"
    )
    # Add the second host, then lose the first for good (the job keeps running there).
    cli("daemon", "stop", check=True)
    configure(
        home,
        [first.entry(key=lab.key, cpus=1), second.entry(key=lab.key, cpus=1)],
        checkpoint_every=0.2,
        lost_after=3,
    )
    first.cut()
    cli("daemon", "start", check=True)
    wait_for(
        lambda: (i := job_info(cli, juid))["state"] == "queued" and i["attempts"] == 1,
        what="the attempt lost and the job re-queued",
    )
    events = [e for e in job_info(cli, juid)["events"] if e["kind"] == "state"]
    assert events[-1]["new"] == "lost"
    assert events[-1]["detail"].startswith("its instance was unreachable for ")  # the user sees why
    synced = int(ckpt.read_text())  # what MONKEY_HOME holds when the host is lost
    wait_for(lambda: job_info(cli, juid)["attempts"] == 2 or None, what="a second attempt")
    assert job_info(cli, juid)["instance"] == "lab/h2"
    wait_for(lambda: "start at epoch" in cli("logs", juid, "--attempt", "2").stdout, what="resume")
    resumed = int(cli("logs", juid, "--attempt", "2").stdout.split()[3])
    assert synced >= 3 and resumed == synced + 1, (resumed, synced)
    stale_pid = int((remote_runs(first) / juid / "1" / "started").read_text().split()[0])
    assert os.path.exists(f"/proc/{stale_pid}")  # still running on the lost host
    first.restore()
    wait_for(lambda: not os.path.exists(f"/proc/{stale_pid}"), what="the stale attempt stopped")
    assert wait_state(cli, juid, "succeeded", "failed", timeout=60) == "succeeded"
    assert ckpt.read_text() == "80"
    out = cli("logs", juid, "--attempt", "2").stdout.splitlines()
    assert out[-1] == "epoch 80" and out[1] == f"epoch {resumed}"


def test_cancel_stops_remote_process_tree(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("tree.py").write_text(
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    juid = run(cli, "--provider", "lab", "--", "python3", "tree.py")
    child = int(wait_for(lambda: cli("logs", juid).stdout.strip(), what="the child's pid"))
    parent = int((remote_runs(host) / juid / "1" / "started").read_text().split()[0])  # the claim
    assert os.path.exists(f"/proc/{child}") and os.path.exists(f"/proc/{parent}")
    cli("job", "cancel", juid, check=True)
    assert wait_state(cli, juid, "cancelled") == "cancelled"
    wait_for(
        lambda: not os.path.exists(f"/proc/{child}") and not os.path.exists(f"/proc/{parent}"),
        what="the remote process tree gone",
    )


def test_pause_and_resume_remote_job_from_checkpoint(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    # The first attempt waits after its second epoch until it is paused (under load the
    # whole job could end before the pause came).
    Path("train.py").write_text(
        EPOCHS + "while os.environ['MONKEY_ATTEMPT'] == '1':\n    time.sleep(0.05)\n"
    )
    juid = run(cli, "--provider", "lab", "--", "python3", "train.py", "2", "0.2")
    wait_for(lambda: "epoch 2\n" in cli("logs", juid).stdout, what="two epochs")
    cli("job", "pause", juid, check=True)
    assert wait_state(cli, juid, "paused") == "paused"
    done = int((home / "runs" / juid / "checkpoint" / "epoch.txt").read_text())
    cli("job", "resume", juid, check=True)
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    assert (
        cli("logs", juid, "--attempt", "2").stdout.splitlines()[0] == f"start at epoch {done + 1}"
    )


def test_second_job_with_same_dataset_sends_no_dataset_bytes(home: Path, lab: Lab, monkey) -> None:
    from monkey.drivers import load_providers
    from monkey.drivers.ssh import SSHDriver

    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    data = Path("data")
    data.mkdir()
    (data / "a.bin").write_bytes(os.urandom(300_000))
    (data / "b.bin").write_bytes(os.urandom(200_000))
    Path("train.py").write_text("print(1)\n")
    first = monkey.run("python3 train.py", provider="lab", datasets=["data"], start_core=False)
    driver = SSHDriver(load_providers(monkey.home)["lab"], monkey.home)
    try:
        [cap] = wait_for(driver.instances, what="the host contacted")
        job = monkey.store.get_job(first.juid)
        blobs = _blobs(monkey, job)
        driver.transport.prepare(cap.instance, blobs)
        assert driver.transport.bytes_sent() >= 500_000
        Path("train.py").write_text("print(2)\n")  # new code, same data
        second = monkey.store.get_job(
            monkey.run("python3 train.py", provider="lab", datasets=["data"], start_core=False).juid
        )
        fresh = SSHDriver(load_providers(monkey.home)["lab"], monkey.home)  # no in-memory cache
        try:
            wait_for(fresh.instances, what="the host contacted")
            fresh.transport.prepare(cap.instance, _blobs(monkey, second))
            assert 0 < fresh.transport.bytes_sent() < 1000  # the changed file only
        finally:
            fresh.close()
    finally:
        driver.close()


def _blobs(monkey, job) -> list[str]:
    from monkey.snapshot import BlobStore

    store = BlobStore(monkey.home.blobs)
    digests = [job.snapshot] + [d["digest"] for d in job.datasets]
    out = []
    for digest in digests:
        out += [f[1] for f in json.loads(store.read_bytes(digest))["files"]]
    return out


def test_bad_host_configs_give_clear_errors(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    cases = [
        ({"key": lab.key, "port": 1}, "is unreachable"),
        ({"key": lab.key, "user": "nobody"}, "authentication as 'nobody' failed"),
        ({"key": str(home / "no-such-key")}, "no-such-key does not exist"),
        ({"key": lab.key, "python": "python9"}, "'python9' is not installed there"),
    ]
    for extra, message in cases:
        cli("daemon", "stop")
        configure(home, [host.entry(**extra)])
        juid = run(cli, "--provider", "lab", "--", "true")
        if message == "is unreachable":
            wait_for(
                lambda: "is unreachable" in cli("list", "providers").stdout,
                what="unreachable shown",
            )
            assert state(cli, juid) == "queued"  # waits for the host to come back
            cli("job", "cancel", juid, check=True)
            continue
        assert wait_state(cli, juid, "failed") == "failed"
        reason = job_info(cli, juid)["reason"]
        assert message in reason and "Traceback" not in reason, reason
    (home / "providers.yml").write_text(
        "providers:\n  lab: {type: ssh, hosts: [{host: a, port: x}]}\n"
    )
    proc = cli("list", "providers")
    assert proc.returncode != 0
    assert proc.stderr.strip().endswith("provider 'lab': host 'a': port must be 1-65535, got 'x'")


def test_ssh_config_applies_to_hosts(home: Path, lab: Lab) -> None:
    from monkey.config import ProviderConfig
    from monkey.drivers.ssh_hosts import host_specs

    ssh = Path(os.environ["HOME"]) / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    (ssh / "config").write_text(
        "Host gpu1\n  HostName 10.0.0.5\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/lab\n"
        "  ProxyJump bastion\n"
    )
    [spec] = host_specs(
        ProviderConfig("lab", "ssh", {"hosts": [{"host": "gpu1", "memory": "2G", "gpus": 2}]})
    )
    assert (spec.hostname, spec.user, spec.port, spec.proxy_jump) == (
        "10.0.0.5",
        "alice",
        2200,
        "bastion",
    )
    assert spec.keys == [str(ssh / "lab")] and spec.gpus == ["0", "1"] and spec.memory == 2 << 30


def test_provider_add_then_run_pinned_to_a_host(cli, home: Path, lab: Lab) -> None:
    one, two = lab.add("h1"), lab.add("h2")
    proc = cli(
        "provider",
        "add",
        "ssh",
        "lab",
        "--host",
        f"{lab.user}@{one.address}:{one.port}",
        "--host",
        f"{two.address}:{two.port}",
        "--user",
        lab.user,
        "--key",
        lab.key,
        "--cpus",
        "2",
        "--workdir",
        one.workdir,
    )
    assert proc.returncode == 0, proc.stderr
    # Both hosts share the user's workdir here: give the second its own folder.
    data = yaml.safe_load((home / "providers.yml").read_text())
    data["providers"]["lab"]["hosts"][1]["workdir"] = two.workdir
    (home / "providers.yml").write_text(yaml.safe_dump(data))
    again = cli("provider", "add", "ssh", "lab", "--host", "x")
    assert again.returncode != 0 and "exists already; pass --force" in again.stderr
    bad = cli("provider", "add", "ssh", "other", "--host", "a@b@c")
    assert bad.returncode != 0 and "is not [USER@]HOST[:PORT]" in bad.stderr
    check = cli("provider", "check", "lab")
    assert check.returncode == 0, check.stderr
    assert check.stdout.count(" up ") == 2 and "cpus 2" in check.stdout
    juids = [run(cli, "--provider", "lab", "--host", two.address, "--", "true") for _ in range(3)]
    for juid in juids:
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
        assert job_info(cli, juid)["instance"] == f"lab/{two.address}"
    wrong = cli("run", "--provider", "lab", "--host", "nope", "--", "true")
    assert wrong.returncode != 0 and "has no such host" in wrong.stderr
    too_big = cli("run", "--provider", "lab", "--cpus", "3", "--", "true")
    assert too_big.returncode != 0 and "no host of provider 'lab' has --cpus 3" in too_big.stderr
    listing = cli("list", "providers").stdout
    assert f"lab/{two.address}" in listing and "up" in listing


def test_outputs_fetched_back(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("make.py").write_text(
        "import os\nos.makedirs('results/plots', exist_ok=True)\n"
        "open('results/metrics.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open('results/plots/loss.txt', 'w').write('0.1')\nopen('scratch.tmp', 'w').write('x')\n"
    )
    juid = run(cli, "--provider", "lab", "--outputs", "results/**", "--", "python3", "make.py")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded"
    work = home / "runs" / juid / "1" / "work"
    assert (work / "results" / "metrics.csv").read_text() == "a,b\n1,2\n"
    assert (work / "results" / "plots" / "loss.txt").read_text() == "0.1"
    assert not (work / "scratch.tmp").exists()
    bad = cli("run", "--provider", "lab", "--outputs", "../etc/*", "--", "true")
    assert bad.returncode != 0 and "relative to the job's folder" in bad.stderr


def test_host_behind_a_proxy_jump(cli, home: Path, lab: Lab) -> None:
    bastion, inner = lab.add("bastion"), lab.add("inner")
    # The client reaches `inner` only through the bastion's sshd (direct-tcpip to inner's sshd).
    with open(lab.ssh_dir / "known_hosts", "a") as fh:
        fh.write(f"[{inner.address}]:{inner.sshd_port} {' '.join(inner.host_key_pub)}\n")
    (lab.ssh_dir / "config").write_text(
        f"Host inner\n  HostName {inner.address}\n  Port {inner.sshd_port}\n  User {lab.user}\n"
        f"  ProxyJump {lab.user}@{bastion.address}:{bastion.port}\n"
    )
    configure(home, [{"host": "inner", "workdir": inner.workdir}])
    juid = run(cli, "--provider", "lab", "--", "sh", "-c", "echo via jump")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)[
        "reason"
    ]
    assert cli("logs", juid).stdout == "via jump\n"
    assert (Path(inner.workdir) / "agent").is_dir() and not (
        Path(bastion.workdir) / "agent"
    ).exists()
    assert bastion.relay.sent > 10_000  # the code, the agent and every request went through it


def test_shared_fs_sends_no_blobs_over_ssh(cli, home: Path, lab: Lab) -> None:
    host = lab.add("h1")
    shared = Path(tempfile.mkdtemp(prefix="monkey-shared-"))
    try:
        os.chmod(shared, 0o755)
        configure(home, [host.entry(key=lab.key)], shared_fs=str(shared))
        Path("data.txt").write_text("shared data\n")
        Path("read.py").write_text(
            "import os; print(open(os.environ['MONKEY_DATASET_D']).read(), end='')\n"
        )
        juid = run(cli, "--provider", "lab", "--dataset", "data.txt:D", "--", "python3", "read.py")
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)[
            "reason"
        ]
        assert cli("logs", juid).stdout == "shared data\n"
        assert not (Path(host.workdir) / "blobs").exists()  # nothing went over SSH
        assert len(list((shared / "blobs").glob("*/*"))) == 2  # the code and the dataset
    finally:
        shutil.rmtree(shared)


def test_provider_added_while_the_core_runs_takes_jobs(cli, home: Path, lab: Lab) -> None:
    """The README's flow with a core already running: add, check, run on it."""
    host = lab.add("h1")
    assert wait_state(cli, run(cli, "--", "true"), "succeeded") == "succeeded"  # the core runs
    bad = cli("provider", "add", "ssh", "lab", "--host", f"{host.address}:99999")
    assert bad.returncode != 0 and bad.stderr.strip().endswith(
        f"provider 'lab': host '{host.address}': port must be 1-65535, got 99999"
    )
    assert ".tmp" not in bad.stderr and not (home / "providers.yml").exists()
    slash = cli("provider", "add", "ssh", "a/b", "--host", "x")
    assert slash.returncode != 0 and "provider name 'a/b'" in slash.stderr
    added = cli(
        "provider",
        "add",
        "ssh",
        "lab",
        "--host",
        f"{lab.user}@{host.address}:{host.port}",
        "--key",
        lab.key,
        "--workdir",
        "/proc/monkey-work",
    )
    assert added.returncode == 0, added.stderr
    check = cli("provider", "check", "lab")
    assert check.returncode != 0
    assert "cannot create /proc/monkey-work on the host" in check.stdout, check.stdout
    cli(
        "provider",
        "add",
        "ssh",
        "lab",
        "--force",
        "--host",
        f"{lab.user}@{host.address}:{host.port}",
        "--key",
        lab.key,
        "--workdir",
        host.workdir,
        check=True,
    )
    juid = run(cli, "--provider", "lab", "--", "echo", "hi")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
    assert cli("logs", juid, check=True).stdout == "hi\n"


def test_dashboard_instances_pane_shows_ssh_hosts_as_configured(
    cli, home: Path, lab: Lab, monkey
) -> None:
    """Attempts are placed as `lab/h1` (not `lab/lab/h1`), a down host says why, and a host
    removed from providers.yml (or a provider added) shows once the file changes."""
    import asyncio

    from textual.widgets import DataTable

    from monkey.tui.app import DashApp
    from tests.conftest import start_core

    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key), {"name": "gone", "host": host.address, "port": 1}])
    start_core(home)
    juid = monkey.run(["sleep", "60"], provider="lab", host="h1").juid
    wait_for(lambda: monkey.job(juid).status.value == "running", what="the job running on h1")
    assert cli("provider", "check", "lab").returncode == 1  # records why `gone` is down
    app = DashApp(home)

    def rows(table: str) -> list[list[str]]:
        t = app.instances.query_one(f"#{table}", DataTable)
        return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]

    async def until(pilot, predicate, what: str) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.05)

    async def main() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.press("i")
            await until(
                pilot,
                lambda: [r[3] for r in rows("attempts-table")] == ["lab/h1"],
                "the attempt on lab/h1",
            )
            await until(
                pilot,
                lambda: any(
                    r[2] == "lab/gone" and "unreachable:" in r[4] for r in rows("instances-table")
                ),
                "why gone is down",
            )
            configure(home, [host.entry(key=lab.key)])
            await until(
                pilot,
                lambda: [r[2] for r in rows("instances-table") if r[0] == "lab"] == ["lab/h1"],
                "the removed host gone",
            )
            app.exit()

    asyncio.run(main())
    monkey.job(juid).cancel()


def test_passphrase_key_in_ssh_agent_is_used_and_named_when_configured(
    cli, home: Path, lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common set-up: ~/.ssh/id_ed25519 has a passphrase and ssh-agent holds it."""
    import subprocess

    host = lab.add("h1")
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-N", "secret", "-f", lab.key], check=True, capture_output=True
    )
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho secret\n")
    askpass.chmod(0o700)
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(sock), what="ssh-agent")
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        subprocess.run(
            ["ssh-add", lab.key],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "SSH_ASKPASS": str(askpass),
                "SSH_ASKPASS_REQUIRE": "force",
                "DISPLAY": ":0",
            },
        )
        configure(home, [host.entry()])  # no `key:`: the agent's key, then ~/.ssh/id_*
        check = cli("provider", "check", "lab")
        assert check.returncode == 0 and " up " in check.stdout, check.stdout + check.stderr
        configure(home, [host.entry(key=lab.key)])
        check = cli("provider", "check", "lab")
        assert check.returncode == 1
        assert f"SSH key {lab.key} is encrypted; load it into ssh-agent" in check.stdout, (
            check.stdout
        )
    finally:
        agent.terminate()
        agent.wait()


def test_in_job_api_on_a_host_without_monkey_tracks_as_locally(
    cli, home: Path, lab: Lab, open_tmp: Path
) -> None:  # the fixture
    """`import monkey; monkey.log(...)` in a job run by a python without monkey installed:
    the host needs no install step and the job is tracked exactly as on the local provider."""
    python = bare_python(open_tmp / "bare")
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("train.py").write_text(SCRIPT)
    remote = run(cli, "--provider", "lab", "--", python, "train.py")
    local = run(cli, "--", python, "train.py")
    for juid in (remote, local):
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", cli(
            "logs", "--stderr", juid
        ).stdout
    assert check_tracked(cli, remote) == check_tracked(cli, local)


def test_a_monkey_of_the_jobs_own_wins_and_metrics_still_arrive(
    cli, home: Path, lab: Lab, open_tmp: Path
) -> None:  # the fixture
    """A worker environment with its own `monkey` (an unrelated module, or a monkey of another
    version) keeps it: the job imports that one, and its metrics reach monkey all the same."""
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    unrelated = open_tmp / "unrelated"
    python = bare_python(unrelated)
    (site_packages(unrelated) / "monkey.py").write_text("BANANA = 'yes'\n")
    Path("unrelated.py").write_text(
        "import monkey, monkey_track\nprint(monkey.BANANA)\nmonkey_track.log('x', 1.5, step=3)\n"
    )
    first = run(cli, "--provider", "lab", "--", python, "unrelated.py")
    # Another monkey on the PYTHONPATH the host gives its jobs: an older one, writing the
    # plain JSON form of the metrics file itself.
    older = open_tmp / "older" / "monkey"
    older.mkdir(parents=True)
    (older / "__init__.py").write_text(
        "import json, os, time\n"
        "__version__ = '0.0.1'\n"
        "def log(name, value, step=None):\n"
        "    with open(os.path.join(os.environ['MONKEY_RUN_DIR'], 'metrics.jsonl'), 'a') as f:\n"
        "        f.write(json.dumps([[name, step, value, time.time_ns()]]) + '\\n')\n"
    )
    Path("older.py").write_text(
        "import monkey\nprint(monkey.__version__)\nmonkey.log('y', 2.5, step=1)\n"
    )
    bare = bare_python(open_tmp / "bare")
    second = run(
        cli,
        "--provider",
        "lab",
        "--",
        "sh",
        "-c",
        f'PYTHONPATH="$PYTHONPATH:{older.parent}" exec {bare} older.py',
    )
    for juid, printed in ((first, "yes\n"), (second, "0.0.1\n")):
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", cli(
            "logs", "--stderr", juid
        ).stdout
        assert cli("logs", "--stdout", juid, check=True).stdout == printed
    assert tracked(cli, first)[1] == {"x": [[3, 1.5]]}
    assert tracked(cli, second)[1] == {"y": [[1, 2.5]]}
