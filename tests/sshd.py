"""Real OpenSSH servers on loopback for the SSH provider's tests and benchmarks.

Each `SSHHost` is one `sshd -D` on its own 127.0.0.K address with its own host key and
folder (its agent's workdir lives there). Clients reach it through a TCP relay on the same
address, so a test can cut the network link (`cut`) and restore it (`restore`) while
sshd, the agent and the jobs keep running. As root, sshd runs unprivileged as a throwaway
user with /bin/sh (`monkeyssh`), which is also the user jobs run as; otherwise as the
current user.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from conftest import kill_until_gone
from ports import free_port

SSH_USER = "monkeyssh"


def lab_user() -> str:
    """The user sshd runs as and logs in (created when running as root)."""
    if os.getuid() != 0:
        return pwd.getpwuid(os.getuid()).pw_name
    with open(f"/run/{SSH_USER}.lock", "w") as lock:  # xdist's workers may all come at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(SSH_USER)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--create-home",
                    "--home-dir",
                    f"/tmp/{SSH_USER}-home",
                    "--shell",
                    "/bin/sh",
                    SSH_USER,
                ],
                check=True,
                capture_output=True,
            )
            subprocess.run(["usermod", "-p", "*", SSH_USER], check=True, capture_output=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return SSH_USER


class Relay:
    """A TCP relay address:port -> address:target that can be cut and restored."""

    def __init__(self, address: str, target: int) -> None:
        self.address, self.target = address, target
        self.port = free_port(address)
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.sent = 0  # bytes relayed from clients to sshd: what the client put on the wire
        self.restore()

    def restore(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.address, self.port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def cut(self) -> None:
        """Close the listener and every relayed connection, as a pulled cable would."""
        with self.lock:
            listener, self.listener = self.listener, None
            conns, self.conns = self.conns, []
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((self.address, self.target))
            except OSError:
                client.close()
                continue
            for s in (client, server):  # a cable adds no delay of its own
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                if self.listener is not listener:
                    client.close()
                    server.close()
                    return
                self.conns += [client, server]
            for a, b, count in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, count), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, count: bool) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
                if count:
                    with self.lock:
                        self.sent += len(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class SSHHost:
    """One sshd on 127.0.0.K with its own host key and folder.

    With OWN_HOME, a session's home folder is the host's own (``home/`` in its folder: the
    login folder of SFTP and $HOME of commands), so that hosts logging in the same user
    share no `~` — as separate machines would not.
    """

    def __init__(
        self,
        name: str,
        index: int,
        client_pub: str,
        user: str,
        address: str | None = None,
        own_home: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.address = address or f"127.0.0.{index + 2}"
        self.user = user
        self.dir = Path(tempfile.mkdtemp(prefix=f"monkey-sshd-{name}-"))
        self.workdir = str(self.dir / "work")
        self.home = self.dir / "home"
        sftp, home_env = "internal-sftp", ""
        if own_home:
            self.home.mkdir()
            sftp, home_env = f"internal-sftp -d {self.home}", f"SetEnv HOME={self.home}\n"
        if env:  # what every session gets (a Slurm login host: SLURM_CONF)
            home_env += "".join(f"SetEnv {k}={v}\n" for k, v in env.items())
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / "host_key")],
            check=True,
        )
        self.host_key_pub = (self.dir / "host_key.pub").read_text().split()[:2]
        (self.dir / "authorized_keys").write_text(client_pub)
        self.sshd_port = free_port(self.address)
        (self.dir / "sshd_config").write_text(f"""\
ListenAddress {self.address}
Port {self.sshd_port}
HostKey {self.dir}/host_key
PidFile {self.dir}/sshd.pid
AuthorizedKeysFile {self.dir}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
MaxSessions 100
MaxStartups 100
Subsystem sftp {sftp}
{home_env}LogLevel ERROR
""")
        os.chmod(self.dir, 0o755)
        if os.getuid() == 0:
            shutil.chown(self.dir, user, user)
            for path in self.dir.iterdir():
                shutil.chown(path, user, user)
        if own_home:
            os.chmod(self.home, 0o755)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()
        self.relay = Relay(self.address, self.sshd_port)
        self.port = self.relay.port

    def start(self) -> None:
        prefix = (
            ["setpriv", "--reuid", self.user, "--regid", self.user, "--init-groups"]
            if os.getuid() == 0
            else []
        )
        self.proc = subprocess.Popen(
            [
                *prefix,
                "/usr/sbin/sshd",
                "-D",
                "-f",
                str(self.dir / "sshd_config"),
                "-E",
                str(self.dir / "sshd.log"),
            ],
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((self.address, self.sshd_port), 0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {self.address} did not start") from None
                time.sleep(0.01)

    def restart_sshd(self) -> None:
        """Kill sshd with its connections (not the sessions' own processes) and start it again."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.start()

    def authorize(self, public_key: str) -> None:
        """Let the holder of PUBLIC_KEY (an OpenSSH line) log in, instead of the lab's key."""
        (self.dir / "authorized_keys").write_text(public_key.strip() + "\n")

    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {' '.join(self.host_key_pub)}\n"

    def entry(self, **extra: object) -> dict[str, object]:
        """This host's entry for providers.yml."""
        return {
            "name": self.name,
            "host": self.address,
            "port": self.port,
            "user": self.user,
            "workdir": self.workdir,
            **extra,
        }

    def cut(self) -> None:
        self.relay.cut()

    def restore(self) -> None:
        self.relay.restore()

    def processes(self) -> list[int]:
        """Pids of processes (agent, relays, jobs) working in this host's folder."""
        found = []
        needle = str(self.dir).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmd = fh.read()
                cwd = os.readlink(f"/proc/{entry}/cwd").encode()
            except OSError:
                continue
            if needle in cmd or cwd.startswith(needle):
                found.append(int(entry))
        return found

    def close(self) -> None:
        self.relay.cut()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        kill_until_gone(self.processes)
        shutil.rmtree(self.dir, ignore_errors=True)


class Lab:
    """A client identity (~/.ssh under a private HOME) and any number of hosts."""

    def __init__(self, client_home: Path) -> None:
        if not os.path.exists("/usr/sbin/sshd"):
            raise RuntimeError(
                "these tests need OpenSSH's sshd: apt-get install openssh-server "
                "(scripts/test.sh does)"
            )
        self.user = lab_user()
        self.ssh_dir = client_home / ".ssh"
        self.ssh_dir.mkdir(parents=True, mode=0o700)
        self.key = str(self.ssh_dir / "id_ed25519")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key], check=True)
        self.client_pub = Path(self.key + ".pub").read_text()
        self.hosts: list[SSHHost] = []

    def add(
        self,
        name: str,
        trusted: bool = True,
        address: str | None = None,
        own_home: bool = False,
        env: dict[str, str] | None = None,
    ) -> SSHHost:
        host = SSHHost(name, len(self.hosts), self.client_pub, self.user, address, own_home, env)
        self.hosts.append(host)
        if trusted:
            with open(self.ssh_dir / "known_hosts", "a") as fh:
                fh.write(host.known_hosts_line())
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.close()
