"""`monkey remote add NAME ssh://USER@HOST[:PORT]` (issue 27): a real `monkey server` on
127.0.0.1 reached through a real sshd (tests/sshd.py) by a laptop with its own HOME, keys
and known_hosts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from mainnode import MainNode, free_port, wait_until_ended
from sshd import Lab, SSHHost
from test_remote_wait import wait_across_a_restart
from test_server import METRICS_JOB, SLICE, _normal

pytestmark = pytest.mark.system


class Tunnelled:
    """A main node whose server is reached through HOST's sshd."""

    def __init__(self, node: MainNode, lab: Lab, host: SSHHost) -> None:
        self.node, self.lab, self.host = node, lab, host

    def url(self, server_port: int | None = None) -> str:
        port = self.node.port if server_port is None else server_port
        return (
            f"ssh://{self.host.user}@{self.host.address}:{self.host.port}/?server=127.0.0.1:{port}"
        )

    def add(self, *extra: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
        node = self.node
        return node.laptop("remote", "add", "lab", url or self.url(), "--token", node.token, *extra)


@pytest.fixture
def tunnelled(home: Path, tmp_path: Path):
    node = MainNode(home, tmp_path)
    node.laptop_env.pop("SSH_AUTH_SOCK", None)  # the laptop's keys only: its own ~/.ssh
    lab = Lab(node.laptop_root)
    try:
        node.start()
        yield Tunnelled(node, lab, lab.add("main"))
    finally:
        lab.close()
        node.close()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_remote_commands_go_through_the_ssh_tunnel(tunnelled):
    node = tunnelled.node
    # the certificate is never trusted silently: shown, with how to pin it
    unpinned = tunnelled.add()
    assert unpinned.returncode == 1
    line = one_line(unpinned.stderr)
    assert f"add --fingerprint {node.fingerprint}" in line
    assert node.laptop_files() == [".ssh/id_ed25519", ".ssh/id_ed25519.pub", ".ssh/known_hosts"]
    added = tunnelled.add("--fingerprint", node.fingerprint)
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"remote lab added: {tunnelled.url()} as ")

    # the commands that work through a remote, each as it is on the main node
    ok = node.server("run", "-f", "--", "sh", "-c", METRICS_JOB).stderr
    ok_id = re.search(r"job (\S+) queued", ok).group(1)
    bad_id = node.server("run", "--", "sh", "-c", "echo one; echo boom >&2; exit 3").stdout.strip()
    wait_until_ended(node, bad_id)
    for command, ages in SLICE:
        argv = command.format(ok=ok_id, bad=bad_id).split()
        local = node.server(*argv)
        remote = node.laptop("--remote", "lab", *argv)
        assert (remote.returncode, _normal(remote.stdout, ages), _normal(remote.stderr, ages)) == (
            local.returncode,
            _normal(local.stdout, ages),
            _normal(local.stderr, ages),
        ), command
    sleeper = node.server("run", "--", "sleep", "600").stdout.strip()
    for action, states in (
        ("pause", ("paused",)),
        ("resume", ("queued", "dispatching", "running")),  # it may start again at once
        ("cancel", ("cancelled",)),
    ):
        done = node.laptop("--remote", "lab", action, sleeper)
        assert done.returncode == 0, (action, done.stderr)
        info = node.server("info", sleeper, "--json").stdout
        assert any(f'"state": "{state}"' in info for state in states), action
    # the laptop holds its keys and its remote settings, no job data
    assert node.laptop_files() == [
        ".config/monkey/lab.token",
        ".config/monkey/remotes.json",
        ".ssh/id_ed25519",
        ".ssh/id_ed25519.pub",
        ".ssh/known_hosts",
    ]


def test_logs_follow_through_the_tunnel_resumes_across_a_server_restart(tunnelled, tmp_path):
    node = tunnelled.node
    assert tunnelled.add("--fingerprint", node.fingerprint).returncode == 0
    go = tmp_path / "go"
    script = f"echo one; while [ ! -e {go} ]; do sleep 0.05; done; for i in 2 3 4; do echo $i; done"
    juid = node.server("run", "--", "sh", "-c", script).stdout.strip()
    follower = subprocess.Popen(
        [sys.executable, "-m", "monkey", "--remote", "lab", "logs", "-f", juid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=node.laptop_env,
        bufsize=0,
    )
    assert follower.stdout is not None and follower.stdout.readline() == b"one\n"
    node.kill()  # the sshd stays up: the channel to the server fails until it is back
    node.start()
    go.touch()
    rest, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert rest == b"2\n3\n4\n"
    assert b"connection lost; reconnecting" in err and b"reconnected" in err


def test_job_wait_through_the_tunnel_rides_out_a_server_restart(tunnelled, tmp_path):
    node = tunnelled.node
    assert tunnelled.add("--fingerprint", node.fingerprint).returncode == 0
    wait_across_a_restart(node, tmp_path / "go", node.laptop_env)


def test_job_wait_through_the_tunnel_rides_out_a_cut_ssh_link(tunnelled, tmp_path):
    node, host = tunnelled.node, tunnelled.host
    assert tunnelled.add("--fingerprint", node.fingerprint).returncode == 0
    wait_across_a_restart(node, tmp_path / "go", node.laptop_env, host.cut, host.restore)


def test_ssh_failures_are_one_line_naming_the_fix(tunnelled):
    node, host, lab = tunnelled.node, tunnelled.host, tunnelled.lab
    pin = ("--fingerprint", node.fingerprint)
    name = f"[{host.address}]:{host.port}"
    # a host key known_hosts does not hold
    known = lab.ssh_dir / "known_hosts"
    known.write_text("")
    unknown = tunnelled.add(*pin)
    assert unknown.returncode == 1
    line = one_line(unknown.stderr)
    assert line.startswith(
        f"monkey: error: lab: host key of {name} is unknown (ssh-ed25519 SHA256:"
    )
    assert f"ssh-keyscan -p {host.port} {host.address} >> ~/.ssh/known_hosts" in line
    assert "--trust-on-first-use" in line
    assert not (node.laptop_root / ".config").exists()  # nothing saved
    # trusted on first use, explicitly: recorded, and checked from then on; not recorded
    # when the remote could not be added
    wrong = node.laptop(
        "remote", "add", "lab", tunnelled.url(), "--token", "mk_wrong", *pin, "--trust-on-first-use"
    )
    assert one_line(wrong.stderr).endswith(
        "lab: token refused; ask an admin: monkey server user token NAME"
    )
    assert [f for f in node.laptop_files() if not f.startswith(".ssh/")] == []
    trusted = tunnelled.add(*pin, "--trust-on-first-use")
    assert trusted.returncode == 0, trusted.stderr
    recorded = node.laptop_root / ".config/monkey/known_hosts"
    assert recorded.read_text() == f"{name} {' '.join(host.host_key_pub)}\n"
    assert node.laptop("--remote", "lab", "list", "jobs").returncode == 0
    # the host's key changed (reinstalled, or another machine at its address)
    other = lab.add("other", trusted=False)
    recorded.write_text(f"{name} {' '.join(other.host_key_pub)}\n")
    changed = node.laptop("--remote", "lab", "list", "jobs")
    assert changed.returncode == 1
    line = one_line(changed.stderr)
    assert line.startswith(f"monkey: error: lab: host key of {name} has CHANGED (ssh-ed25519 ")
    assert line.endswith(
        f"(ssh-keygen -R '{name}'); it was trusted on first use and recorded in {recorded} "
        f"(ssh-keygen -R '{name}' -f {recorded})"
    )
    recorded.write_text(f"{name} {' '.join(host.host_key_pub)}\n")
    # the laptop's key is not accepted there
    host.authorize(other.host_key_pub[0] + " " + other.host_key_pub[1])
    refused = node.laptop("--remote", "lab", "list", "jobs")
    assert refused.returncode == 1
    assert one_line(refused.stderr) == (
        f"monkey: error: lab: SSH authentication as {host.user!r} failed on "
        f"{host.user}@{host.address}:{host.port} with ssh-agent and ~/.ssh keys; add your "
        f"public key to ~/.ssh/authorized_keys there (ssh-copy-id -p {host.port} "
        f"{host.user}@{host.address})"
    )
    host.authorize(lab.client_pub)
    # sshd answers, but no monkey server listens behind it
    nobody = free_port()
    empty = tunnelled.add(*pin, url=tunnelled.url(nobody))
    assert empty.returncode == 1
    line = one_line(empty.stderr)
    assert line.startswith(
        f"monkey: error: lab: {host.address}:{host.port} answers over SSH but no monkey "
        f"server listens at 127.0.0.1:{nobody} on it ("
    )
    assert "`monkey server start`" in line and "?server=HOST:PORT" in line
    # sshd forwards nothing
    config = host.dir / "sshd_config"
    config.write_text(config.read_text().replace("AllowTcpForwarding yes", "AllowTcpForwarding no"))
    host.restart_sshd()
    closed = node.laptop("--remote", "lab", "list", "jobs")
    assert closed.returncode == 1
    assert one_line(closed.stderr) == (
        f"monkey: error: lab: the sshd of {host.address}:{host.port} refuses to forward "
        f"connections for {host.user} (AllowTcpForwarding in its sshd_config); ask its admin "
        "to allow it, or reach the server by https:// on an open port"
    )
    # sshd down: one line, quickly
    host.cut()
    down = node.laptop("--remote", "lab", "list", "jobs", timeout=30)
    assert down.returncode == 1
    assert one_line(down.stderr) == (
        f"monkey: error: lab: cannot reach {host.user}@{host.address}:{host.port} over SSH "
        "(connection refused); is the main node up and its sshd running?"
    )


@pytest.mark.parametrize(
    "url",
    [
        "ssh://:22",
        "ssh://host/some/path",
        "ssh://host:99999",
        "ssh://host/?port=1",
        "ssh://u:secret@host",
    ],
)
def test_a_bad_ssh_url_is_one_line(home, tmp_path, url):
    node = MainNode(home, tmp_path)
    done = node.laptop("remote", "add", "lab", url, "--token", "t")
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"monkey: error: {url!r} is not an SSH remote; give ssh://USER@HOST[:PORT], with "
        "?server=HOST:PORT when the server does not listen on 127.0.0.1:8443 there"
    )
    bad_server = node.laptop("remote", "add", "lab", "ssh://h/?server=ftp://x:1", "--token", "t")
    assert bad_server.returncode == 1 and "'ftp://x:1' is not a server URL" in bad_server.stderr
    tofu = node.laptop(
        "remote", "add", "lab", "https://h:1", "--token", "t", "--trust-on-first-use"
    )
    assert tofu.returncode == 2 and "--trust-on-first-use is for an ssh:// remote" in tofu.stderr
    assert not re.search(r"Traceback", done.stderr + bad_server.stderr + tofu.stderr)
    assert node.laptop_files() == []


def test_a_server_without_tls_through_the_tunnel_to_a_host_of_ssh_config(home, tmp_path):
    node = MainNode(home, tmp_path)
    node.laptop_env.pop("SSH_AUTH_SOCK", None)
    lab = Lab(node.laptop_root)
    try:
        welcome = node.start("--no-tls")
        assert "certificate" not in welcome
        host = lab.add("main")
        # the host as ~/.ssh/config names it: its address, port and user come from there
        (lab.ssh_dir / "config").write_text(
            f"Host mainnode\n  HostName {host.address}\n  Port {host.port}\n  User {host.user}\n"
        )
        url = f"ssh://mainnode?server=http://127.0.0.1:{node.port}"
        added = node.laptop("remote", "add", "lab", url, "--token", node.token)
        assert added.returncode == 0, added.stderr
        listed = node.laptop("--remote", "lab", "list", "jobs")
        assert listed.returncode == 0 and listed.stdout.startswith("no jobs yet"), listed.stderr
    finally:
        lab.close()
        node.close()


def test_the_laptops_ssh_agent_logs_in(tunnelled, tmp_path):
    node, lab = tunnelled.node, tunnelled.lab
    # the key only in the agent: no file ~/.ssh would offer
    hidden = tmp_path / "agent-only-key"
    Path(lab.key).rename(hidden)
    Path(lab.key + ".pub").unlink()
    without = tunnelled.add("--fingerprint", node.fingerprint)
    assert without.returncode == 1
    assert one_line(without.stderr) == (
        f"monkey: error: lab: no SSH key to log in to {tunnelled.host.user}@"
        f"{tunnelled.host.address}:{tunnelled.host.port}: load one into ssh-agent (ssh-add), "
        "keep it as ~/.ssh/id_ed25519 (or id_ecdsa, id_rsa), or name it with IdentityFile in "
        "~/.ssh/config"
    )
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, what="ssh-agent to listen")
        env = {**node.laptop_env, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(hidden)], env=env, check=True, capture_output=True)
        node.laptop_env = env
        added = tunnelled.add("--fingerprint", node.fingerprint)
        assert added.returncode == 0, added.stderr
        assert node.laptop("--remote", "lab", "list", "jobs").stdout.startswith("no jobs yet")
    finally:
        agent.terminate()
        agent.wait(timeout=30)
