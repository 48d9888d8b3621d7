"""The SSH tunnel to a main node that opens no port: ``ssh://USER@HOST[:PORT]`` (with
``?server=HOST:PORT`` when the server does not listen on 127.0.0.1:8443 there).

Each connection of the client is a ``direct-tcpip`` channel from the main node's sshd to the
server's address on it, over one SSH connection; the host key is checked against
~/.ssh/known_hosts and monkey's own (``known_hosts`` in the remotes' folder, where
``remote add --trust-on-first-use`` records it), and the user's ssh-agent and ~/.ssh keys
(or ~/.ssh/config's IdentityFile) log in, as the SSH provider does (``monkey.drivers.ssh_hosts``).

TLS is kept inside the tunnel, checked against the pinned fingerprint: on a shared main node
any user may listen on a loopback port while the server is down, and the pin is what keeps
the token from being sent to them. A server started with ``--no-tls`` (loopback only) is
reached with ``?server=http://127.0.0.1:PORT``.

paramiko is imported here only: this module is loaded when an ssh:// remote is used."""

from __future__ import annotations

import select
import socket
import threading
from urllib.parse import parse_qs, urlsplit

from monkey.drivers.ssh_hosts import HostKeys
from monkey.models import MonkeyError
from monkey.remote import RemoteError, Unreachable, split_url

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import paramiko

DEFAULT_SERVER = "127.0.0.1:8443"  # `monkey server`'s default --bind


def split_ssh_url(url: str) -> tuple[dict[str, Any], str]:
    """(the SSH host as a providers.yml `hosts:` item, the server's URL on it) of
    ``ssh://[USER@]HOST[:PORT][/?server=[http[s]://]HOST:PORT]``; MonkeyError naming the fix."""
    bad = MonkeyError(
        f"{url!r} is not an SSH remote; give ssh://USER@HOST[:PORT], with "
        f"?server=HOST:PORT when the server does not listen on {DEFAULT_SERVER} there"
    )
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise bad from None
    query = parse_qs(parts.query, keep_blank_values=True)
    if (
        parts.scheme != "ssh"
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.password
        or set(query) - {"server"}
        or len(query.get("server", [""])) != 1
    ):
        raise bad
    server = query.get("server", [DEFAULT_SERVER])[0]
    server = server if "://" in server else f"https://{server}"
    split_url(server)  # a bad server address: its own line
    entry = {"host": parts.hostname, "port": port, "user": parts.username}
    return entry, server


class Tunnel:
    """One SSH connection to a main node, opening a channel per client connection."""

    def __init__(self, name: str, url: str, trust_on_first_use: bool = False) -> None:
        self.name, self.url = name, url
        self.entry, self.server_url = split_ssh_url(url)
        self.tofu = trust_on_first_use
        self._transport: paramiko.Transport | None = None
        self._keys: _RemoteKeys | None = None
        self._where = self._user = ""  # the sshd's HOST:PORT and user, once resolved
        self._lock = threading.Lock()

    def forget_trusted(self) -> None:
        """Drop the host key trusted on first use by this tunnel (a `remote add` that
        failed leaves nothing behind)."""
        keys = self._keys
        if keys is not None and keys.recorded:
            keys.forget(keys.recorded)
            if keys.own_path.is_file() and not keys.own_path.stat().st_size:
                keys.own_path.unlink()  # it held only that key

    def close(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    def open(
        self, address: tuple[str, int], timeout: float, source_address: Any = None
    ) -> socket.socket:
        """A socket to ADDRESS on the main node (as ``socket.create_connection``), carried by
        a channel of the SSH connection (opened, or opened again, as needed)."""
        import paramiko

        for fresh in (False, True):
            transport = self._up(timeout, again=fresh)
            try:
                chan = transport.open_channel(
                    "direct-tcpip", address, ("127.0.0.1", 0), timeout=timeout
                )
                break
            except paramiko.ChannelException as exc:
                host, port = address
                if exc.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
                    raise RemoteError(
                        f"{self.name}: the sshd of {self._label()} refuses to forward "
                        f"connections for {self._user} (AllowTcpForwarding "
                        "in its sshd_config); ask its admin to allow it, or reach the server "
                        "by https:// on an open port"
                    ) from None
                raise Unreachable(
                    f"{self.name}: {self._label()} answers over SSH but no monkey server "
                    f"listens at {host}:{port} on it ({exc.text or exc.code}); start it there "
                    f"(`monkey server start`) or give its address: "
                    f"ssh://USER@HOST[:PORT]/?server=HOST:PORT"
                ) from None
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if fresh:
                    raise Unreachable(
                        f"{self.name}: the SSH connection to {self._label()} dropped ({exc})"
                    ) from None
        return _bridge(chan)

    def _label(self) -> str:
        """HOST:PORT of the sshd (as ~/.ssh/config resolved it, once connected)."""
        return self._where or f"{self.entry['host']}:{self.entry['port'] or 22}"

    def _up(self, timeout: float, again: bool) -> paramiko.Transport:
        with self._lock:
            if again or (self._transport is not None and not self._transport.is_active()):
                if self._transport is not None:
                    self._transport.close()
                self._transport = None
            if self._transport is None:
                self._transport = self._connect(timeout)
            return self._transport

    def _connect(self, timeout: float) -> paramiko.Transport:
        """Connect, check the host key and log in, each failure one line naming the fix."""
        import logging

        from monkey.config import Home
        from monkey.drivers import ssh_hosts
        from monkey.remote import settings

        # paramiko logs refusals as warnings; the user gets them as the one line below
        logging.getLogger("paramiko").addHandler(logging.NullHandler())

        spec = ssh_hosts.host_spec(self.entry, ssh_hosts.ssh_config())
        self._where, self._user = f"{spec.hostname}:{spec.port}", spec.user
        if self.tofu:  # where the key is recorded
            settings.folder().mkdir(parents=True, exist_ok=True, mode=0o700)
        keys = self._keys = _RemoteKeys(Home(settings.folder()), self.tofu, spec)
        try:
            return ssh_hosts.open_transport(spec, keys, timeout)
        except ssh_hosts.Unreachable as exc:
            why = str(exc).partition(": ")[2] or str(exc)
            why = why[:1].lower() + why[1:]  # as the https line says it
            raise Unreachable(
                f"{self.name}: cannot reach {spec.label} over SSH ({why}); is the main node "
                "up and its sshd running?"
            ) from None
        except ssh_hosts.Untrusted as exc:
            raise RemoteError(f"{self.name}: {exc}") from None
        except ssh_hosts.AuthFailed as exc:
            if str(exc).startswith("no SSH key"):
                raise RemoteError(
                    f"{self.name}: no SSH key to log in to {spec.label}: load one into ssh-agent "
                    "(ssh-add), keep it as ~/.ssh/id_ed25519 (or id_ecdsa, id_rsa), or name it "
                    "with IdentityFile in ~/.ssh/config"
                ) from None
            which = ", ".join(spec.keys) if spec.keys else "ssh-agent and ~/.ssh keys"
            raise RemoteError(
                f"{self.name}: SSH authentication as {spec.user!r} failed on {spec.label} "
                f"with {which}; add your public key to ~/.ssh/authorized_keys there "
                f"(ssh-copy-id -p {spec.port} {spec.user}@{spec.hostname})"
            ) from None
        except MonkeyError as exc:  # a key file that cannot be read
            where = "IdentityFile in ~/.ssh/config"
            raise RemoteError(
                f"{self.name}: {str(exc).replace('`key:` in providers.yml', where)}"
            ) from None


class _RemoteKeys(HostKeys):
    """known_hosts as the SSH provider checks it, with a remote's fix for an unknown key."""

    def __init__(self, home: Any, tofu: bool, spec: Any) -> None:
        super().__init__(home, tofu)
        self.spec = spec
        self.recorded: str | None = None  # the name whose key was trusted on first use

    def check(self, name: str, key: Any, tofu: bool = False, confirm: Any = None) -> None:
        from monkey.drivers.ssh_hosts import Untrusted, fingerprint

        self.refresh()
        if not (self.tofu or tofu) and self.keys.lookup(name) is None:
            spec = self.spec
            raise Untrusted(
                f"host key of {name} is unknown ({key.get_name()} {fingerprint(key)}); verify "
                f"it and add it to ~/.ssh/known_hosts (ssh-keyscan -p {spec.port} "
                f"{spec.hostname} >> ~/.ssh/known_hosts), or add the remote again with "
                "--trust-on-first-use"
            )
        known = self.keys.lookup(name) is not None
        try:
            super().check(name, key, tofu, confirm)
        except Untrusted as exc:
            mine = self.own_path.is_file() and any(
                line.split(" ", 1)[0] == name for line in self.own_path.read_text().splitlines()
            )
            if not mine:
                raise
            raise Untrusted(
                f"{exc}; it was trusted on first use and recorded in {self.own_path} "
                f"(ssh-keygen -R '{name}' -f {self.own_path})"
            ) from None
        if not known:
            self.recorded = name


class _Bridged(socket.socket):
    """The client's end of a socket pair relayed to a channel: a real socket (TLS wraps
    it), which ignores TCP options (the client sets TCP_NODELAY; sshd's side has it)."""

    def setsockopt(self, level: int, *args: Any) -> None:
        if level != socket.IPPROTO_TCP:
            super().setsockopt(level, *args)


def _bridge(chan: paramiko.Channel) -> socket.socket:
    """A socket whose bytes go both ways to CHAN, relayed by a thread until either ends."""
    ours, theirs = socket.socketpair()
    client = _Bridged(fileno=theirs.detach())
    threading.Thread(target=_relay, args=(ours, chan), daemon=True).start()
    return client


def _relay(sock: socket.socket, chan: paramiko.Channel) -> None:
    import paramiko

    try:
        while True:
            ready, _, _ = select.select([sock, chan], [], [])
            if sock in ready:
                data = sock.recv(1 << 16)
                if not data:
                    return
                chan.sendall(data)
            if chan in ready:
                data = chan.recv(1 << 16)
                if not data:
                    return
                sock.sendall(data)
    except (OSError, EOFError, ValueError, paramiko.SSHException):
        return  # the link went down (a cut SSH connection says so as SSHException): the
        # client's read fails and it reconnects
    finally:
        chan.close()
        sock.close()
