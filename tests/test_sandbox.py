"""Jobs on a main node see only what is their own (issue 41, finding 2): each user's job
runs in a bubblewrap sandbox, and a worker that cannot make one refuses other people's jobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import processes_with_env, wait_for
from mainnode import MainNode, node, wait_until_ended  # noqa: F401  (the fixture)

SECRET = "ana-s3cret-value-9f2c"

# ana's job: a checkpoint, a metric, a persisted folder, two children that outlive nothing,
# and then it sleeps holding her secret in its environment.
ANA = """\
import os, subprocess, time
import monkey
attempt = os.environ["MONKEY_ATTEMPT"]
mark = monkey.checkpoint_dir() / "state"
seen = mark.read_text() if mark.exists() else "none"
mark.write_text(attempt)
monkey.log({"acc": 0.5}, step=int(attempt))
monkey.flush()
os.makedirs("output", exist_ok=True)
with open("output/progress.txt", "w") as f:
    f.write(attempt)
subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"])
print("ready", attempt, "checkpoint", seen, flush=True)
time.sleep(600)
"""

# bob's job: every read and write of what is not his; prints what succeeded.
BOB = """\
import json, os
t = json.load(open("targets.json"))
got = {"read": [], "wrote": [], "environ": [], "home_var": "MONKEY_HOME" in os.environ,
       "home_holds": sorted(os.listdir(t["home"]))}
for path in t["read"]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        got["read"].append(path)
    except OSError:
        pass
for path in t["write"]:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
        got["wrote"].append(path)
    except OSError:
        pass
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and t["secret"].encode() in open(f"/proc/{pid}/environ", "rb").read():
            got["environ"].append(pid)
    except OSError:
        pass
print("probe", json.dumps(got))
"""


def _logs(node: MainNode, juid: str, *extra: str) -> str:
    return node.server("logs", juid, *extra).stdout


def test_a_users_job_sees_nothing_of_another_users_job_nor_of_monkey_home(node, home):
    node.add_remote(node.add_user("ana"), name="ana")
    node.add_remote(node.add_user("bob"), name="bob")
    assert "local: isolation sandbox (bubblewrap)\n" in node.server("list", "providers").stdout
    checked = node.server("provider", "check", "local").stdout
    assert checked.startswith("local ") and " isolation sandbox (bubblewrap)  images " in checked
    Path("ana.py").write_text(ANA)
    Path("job.yml").write_text("persist:\n  - name: output\n    path: output\n")
    ana = node.laptop("--remote", "ana", "run", "--env", f"API_TOKEN={SECRET}", "--", "python",
                      "ana.py").stdout.strip()  # fmt: skip
    wait_for(lambda: "ready 1" in _logs(node, ana), timeout=60, what="ana's job to start")
    os.remove("job.yml")
    run = home / "runs" / ana / "1"
    ssh_key = Path(node.server_env["HOME"]) / ".ssh" / "id_ed25519"  # the main node's own
    ssh_key.parent.mkdir(parents=True, exist_ok=True)
    ssh_key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    secrets = sorted(str(p) for p in (home / "secrets").iterdir())
    assert secrets and (home / "server" / "key.pem").exists()
    readable = [run, run / "stdout.log", home / "monkey.db", home / "server" / "key.pem",
                home / "secrets", home / "runs" / ana / "checkpoint" / "state", ssh_key]  # fmt: skip
    writable = [run / "stdout.log", run / "evil", home / "monkey.db", home / "secrets" / "x"]
    targets = {
        "read": [str(p) for p in readable] + secrets,
        "write": [str(p) for p in writable],
        "secret": SECRET,
        "home": str(home),
    }
    Path("targets.json").write_text(json.dumps(targets))
    Path("bob.py").write_text(BOB)
    bob = node.laptop("--remote", "bob", "run", "--", "python", "bob.py").stdout.strip()
    wait_until_ended(node, bob)
    assert '"state": "succeeded"' in node.server("info", bob, "--json").stdout
    probe = next(line for line in _logs(node, bob).splitlines() if line.startswith("probe "))
    assert json.loads(probe[len("probe ") :]) == {
        "read": [],
        "wrote": [],
        "environ": [],
        "home_var": False,
        "home_holds": ["jobcode", "runs"],  # its own run folder and the code every job gets
    }
    assert not (run / "evil").exists()
    # ana's own job works as before: checkpoint, metrics, persisted folder, pause/resume ...
    assert (home / "runs" / ana / "checkpoint" / "state").read_text() == "1"
    metrics = node.laptop("--remote", "ana", "metrics", ana, "--json")
    assert metrics.returncode == 0 and "acc" in metrics.stdout, metrics.stderr
    assert node.laptop("--remote", "ana", "job", "pause", ana).returncode == 0
    wait_for(lambda: '"state": "paused"' in node.server("info", ana, "--json").stdout,
             what="ana's job to pause")  # fmt: skip
    saved = home / "runs" / ana / "persist" / "output" / "progress.txt"
    assert saved.read_text() == "1"
    assert node.laptop("--remote", "ana", "job", "resume", ana).returncode == 0
    wait_for(lambda: "ready 2 checkpoint 1" in _logs(node, ana, "--attempt", "2"), timeout=60,
             what="ana's job to resume from its checkpoint")  # fmt: skip
    assert "restored persisted folder output" in _logs(node, ana, "--setup", "--attempt", "2")
    # ... and a cancel ends every process of it, its children's too.
    assert len(processes_with_env(f"API_TOKEN={SECRET}")) >= 4  # launcher, job, 2 sleeps
    assert node.laptop("--remote", "ana", "cancel", ana).returncode == 0
    wait_until_ended(node, ana)
    assert '"state": "cancelled"' in node.server("info", ana, "--json").stdout
    wait_for(lambda: not processes_with_env(f"API_TOKEN={SECRET}"), what="ana's processes gone")


def test_on_an_ssh_host_a_users_job_sees_nothing_of_another_users_job(home, tmp_path):
    """The same agent on an SSH host (sshd as a plain user): bob's job there reads and writes
    nothing of ana's job's folder, nor the main node's SSH key, nor her environment."""
    from sshd import Lab

    lab = Lab(tmp_path / "srv-user")  # the main node's ~/.ssh
    n = MainNode(home, tmp_path)
    n.server_env.pop("SSH_AUTH_SOCK", None)
    try:
        host = lab.add("h1")
        home.mkdir(parents=True, exist_ok=True)
        hosts = json.dumps([host.entry(key=lab.key)])
        (home / "providers.yml").write_text(f"providers:\n  lab: {{type: ssh, hosts: {hosts}}}\n")
        n.start()
        n.add_remote(n.add_user("ana"), name="ana")
        n.add_remote(n.add_user("bob"), name="bob")
        Path("ana.py").write_text(ANA)
        ana = n.laptop("--remote", "ana", "run", "-p", "lab", "--env", f"API_TOKEN={SECRET}",
                       "--", "python3", "ana.py").stdout.strip()  # fmt: skip
        wait_for(lambda: "ready 1" in _logs(n, ana), timeout=60, what="ana's job on the host")
        [run] = Path(host.workdir).glob(f"runs/*/{ana}/1")
        targets = {
            "read": [str(run), str(run / "stdout.log"), str(Path(lab.key))],
            "write": [str(run / "stdout.log"), str(run / "evil")],
            "secret": SECRET,
            "home": host.workdir,
        }
        Path("targets.json").write_text(json.dumps(targets))
        Path("bob.py").write_text(BOB)
        bob = n.laptop("--remote", "bob", "run", "-p", "lab", "--", "python3", "bob.py")
        wait_until_ended(n, bob.stdout.strip())
        probe = next(
            line for line in _logs(n, bob.stdout.strip()).splitlines() if line.startswith("probe ")
        )
        got = json.loads(probe[len("probe ") :])
        assert (got["read"], got["wrote"], got["environ"], got["home_var"]) == ([], [], [], False)
        assert "ana" not in json.dumps(got["home_holds"])
        assert n.laptop("--remote", "ana", "cancel", ana).returncode == 0
        wait_until_ended(n, ana)
        wait_for(lambda: not processes_with_env(f"API_TOKEN={SECRET}"), what="ana's processes gone")
    finally:
        n.close()
        lab.close()


def _no_bwrap_node(home: Path, tmp_path: Path) -> MainNode:
    n = MainNode(home, tmp_path)
    n.server_env["MONKEY_BWRAP"] = str(tmp_path / "no-bwrap")
    return n


def test_a_worker_that_cannot_isolate_refuses_other_users_jobs(home, tmp_path):
    n = _no_bwrap_node(home, tmp_path)
    n.start()
    try:
        n.add_remote(n.add_user("ana"), name="ana")
        mine = n.server("run", "--", "true").stdout.strip()  # the server's own user
        ana = n.laptop("--remote", "ana", "run", "--", "true").stdout.strip()
        wait_until_ended(n, mine)
        wait_until_ended(n, ana)
        assert '"state": "succeeded"' in n.server("info", mine, "--json").stdout
        assert (
            f"local: isolation none: bubblewrap is not at {tmp_path / 'no-bwrap'} (MONKEY_BWRAP), "
            "or not executable; other users' jobs fail to start there\n"
        ) in n.server("list", "providers").stdout
        info = json.loads(n.server("info", ana, "--json").stdout)
        assert info["state"] == "failed"
        reason = info["reason"]
        assert "\n" not in reason
        assert reason == (
            f"could not start: jobs on provider 'local' must run in a sandbox and cannot: "
            f"bubblewrap is not at {tmp_path / 'no-bwrap'} (MONKEY_BWRAP), or not executable; "
            "install bubblewrap (apt-get install bubblewrap), or set `isolation: none` on that "
            "provider (every job then runs with the server's authority)"
        )
    finally:
        n.close()


def test_isolation_sandbox_without_bwrap_fails_the_job_in_one_line(cli, home, monkeypatch):
    from monkey.client_agent import sandbox

    monkeypatch.setattr(sandbox, "_found", None)  # this process's answer (the CLI runs here)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                if not os.path.exists(f"{p}/bwrap")))  # fmt: skip
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, isolation: sandbox}\n")
    assert (
        "local: isolation none: bubblewrap (bwrap) is not installed on this machine; its jobs "
        "fail to start\n"
    ) in cli("list", "providers").stdout
    done = cli("run", "--follow", "--", sys.executable, "-c", "pass")
    assert done.returncode == 1
    assert (
        "could not start: jobs on provider 'local' must run in a sandbox and cannot: "
        "bubblewrap (bwrap) is not installed on this machine; install bubblewrap"
    ) in done.stderr
    bad = home / "providers.yml"
    bad.write_text("providers:\n  local: {type: local, isolation: maybe}\n")
    refused = cli("list", "providers")
    assert refused.returncode == 1
    assert "isolation must be auto, sandbox or none, got 'maybe'" in refused.stderr


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    assert os.path.exists("/usr/bin/bwrap"), "install bubblewrap (scripts/test.sh does)"


def test_which_jobs_isolation_puts_in_a_sandbox():
    from monkey.drivers.base import start_isolation

    assert start_isolation({}, 1, "me", "me") == "none"  # a single-user machine: as before
    assert start_isolation({}, 3, "ana", "me") == "sandbox"  # another user's: one or refused
    assert start_isolation({}, 3, "me", "me") == "auto"  # the server's own: one if it can
    assert start_isolation({"isolation": "none"}, 3, "ana", "me") == "none"
    assert start_isolation({"isolation": "sandbox"}, 1, "me", "me") == "sandbox"


def test_a_sandbox_hides_the_server_users_home_but_the_software_jobs_run(tmp_path):
    from monkey.client_agent.sandbox import home_software

    home = tmp_path / "srv"
    for folder in ("miniconda3/bin", "bin", ".ssh", "lib/py"):
        (home / folder).mkdir(parents=True)
    environ = {
        "HOME": str(home),
        "PATH": f"{home}/miniconda3/bin:{home}/bin:/usr/bin",
        "PYTHONPATH": f"{home}/lib/py",
    }
    assert home_software(environ, "/opt/monkey") == (
        str(home),
        [f"{home}/bin", f"{home}/lib/py", f"{home}/miniconda3"],  # never .ssh, nor all of home
    )
    assert home_software({"HOME": "/"}, "/opt/monkey") == ("", [])
