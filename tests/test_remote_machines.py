"""A main node on another machine (issue 27): a real `monkey server` in a network namespace,
on its own address with TLS and the default port, reached from a laptop in another
namespace (tests/netns.py); the link between them cut while a laptop script waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mainnode import MainNode, wait_until_ended
from netns import MAIN_IP, Machines
from test_remote_wait import WAITER

pytestmark = pytest.mark.system


class OtherMachine(MainNode):
    """The main node in the "main" namespace, its laptop in the "laptop" one."""

    def __init__(self, home: Path, tmp: Path, machines: Machines) -> None:
        super().__init__(home, tmp)
        self.machines = machines
        self.address, self.port = MAIN_IP, 8443
        self.url = f"https://{MAIN_IP}:8443"
        self.server_prefix = machines.prefix("main")
        self.laptop_prefix = machines.prefix("laptop")

    def _accepts(self) -> bool:
        return self.machines.reaches(self.address, self.port)

    def popen(self, *argv: str) -> subprocess.Popen[str]:
        """A laptop program that runs on."""
        return subprocess.Popen(
            [*self.laptop_prefix, sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.laptop_env,
        )


@pytest.fixture
def other(home: Path, tmp_path: Path):
    machines = Machines()
    node = OtherMachine(home, tmp_path, machines)
    try:
        yield node
    finally:
        node.close()
        machines.close()


def test_remote_commands_reach_a_server_on_another_machine(other, tmp_path):
    welcome = other.start()
    assert f"server: https://{MAIN_IP}:8443" in welcome
    other.add_remote()
    done = other.server("run", "--", "sh", "-c", "echo hello; exit 4").stdout.strip()
    wait_until_ended(other, done)
    go = tmp_path / "go"
    held = other.server(
        "run", "--", "sh", "-c", f"echo one; while [ ! -e {go} ]; do sleep 0.05; done; echo two"
    ).stdout.strip()
    sleeper = other.server("run", "--", "sleep", "600").stdout.strip()
    for command in (f"info {done}", f"info {done} --json", f"logs {done}", "list providers"):
        local = other.server(*command.split())
        remote = other.laptop("--remote", "lab", *command.split())
        assert (remote.returncode, remote.stdout, remote.stderr) == (
            local.returncode,
            local.stdout,
            local.stderr,
        ), command
    listed = other.laptop("--remote", "lab", "list", "jobs")
    assert listed.returncode == 0
    assert all(juid in listed.stdout for juid in (done, held, sleeper))
    follower = other.popen("-m", "monkey", "--remote", "lab", "logs", "-f", held)
    assert follower.stdout is not None and follower.stdout.readline() == "one\n"
    go.touch()
    rest, err = follower.communicate(timeout=120)
    assert (follower.returncode, rest) == (0, "two\n"), err
    cancelled = other.laptop("--remote", "lab", "cancel", sleeper)
    assert cancelled.returncode == 0, cancelled.stderr
    assert '"state": "cancelled"' in other.server("info", sleeper, "--json").stdout
    assert other.laptop_files() == [".config/monkey/lab.token", ".config/monkey/remotes.json"]


def test_job_wait_rides_out_a_cut_link(other, tmp_path):
    other.start()
    other.add_remote()
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; echo after"
    juid = other.server("run", "--", "sh", "-c", script).stdout.strip()
    waiter = other.popen("-c", WAITER, juid)
    assert waiter.stdout is not None and waiter.stderr is not None
    assert waiter.stdout.readline().startswith("waiting ")
    other.machines.cut()  # the server and the job go on; the laptop cannot reach them
    lost = waiter.stderr.readline()
    assert lost == f"monkey: lab: connection lost; reconnecting (job {juid} goes on)\n"
    other.machines.restore()
    go.touch()
    out, err = waiter.communicate(timeout=180)
    assert waiter.returncode == 0, err
    assert out == "succeeded 0\n"
    assert err == "monkey: lab: reconnected; waiting again\n"
