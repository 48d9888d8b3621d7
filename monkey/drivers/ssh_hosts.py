"""SSH hosts: their settings (providers.yml over ~/.ssh/config), host keys and transports.

paramiko is imported inside functions: this module is loaded only when an ssh provider is used.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from monkey.config import Home, ProviderConfig, write_private
from monkey.drivers.base import NotReady, unknown_keys
from monkey.models import MonkeyError, Resources, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import paramiko

_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


class Unreachable(NotReady):
    """The host did not answer (network, sshd down): worth retrying soon."""


class AuthFailed(MonkeyError):
    """No key offered was accepted for the user."""


class Untrusted(NotReady):
    """The host's key is not (or no longer) the one known_hosts holds: retried once
    known_hosts changes."""


@dataclass
class HostSpec:
    """One configured host, with ~/.ssh/config applied."""

    name: str
    hostname: str
    port: int = 22
    user: str = ""
    keys: list[str] = field(default_factory=list)
    cpus: int | None = None
    gpus: list[str] | None = None
    memory: int | None = None
    workdir: str = "~/.monkey-agent"
    python: str = "python3"
    proxy_jump: str | None = None
    # A machine monkey created: its key is pinned under this name (its instance id, never
    # reused, unlike its address) at first contact, whatever `trust_on_first_use` says.
    host_key_alias: str | None = None
    # Called with a key seen for the first time, before it is pinned: raises MonkeyError to
    # refuse it (a cloud instance whose console printed other keys).
    confirm_key: Callable[[paramiko.PKey], None] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts names this host (``[host]:port`` off port 22, else its alias)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


_SSH_KEYS = {
    "type",
    "hosts",
    "trust_on_first_use",
    "checkpoint_every",
    "connect_timeout",
    "shared_fs",
}
_SSH_HOST_KEYS = {
    "name",
    "host",
    "port",
    "user",
    "key",
    "cpus",
    "gpus",
    "memory",
    "workdir",
    "python",
    "proxy_jump",
}


def validate_entry(where: str, name: str, entry: dict[str, Any]) -> None:
    """Refuse a bad `type: ssh` entry of providers.yml with one line naming the fix."""

    def bad(what: str) -> MonkeyError:
        return MonkeyError(f"{where}: provider {name!r}: {what}")

    unknown_keys(where, name, entry, _SSH_KEYS)
    hosts = entry.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise bad("needs `hosts:`, a list like [{host: gpu1, user: me, key: ~/.ssh/id_ed25519}]")
    for key in ("checkpoint_every", "connect_timeout"):
        value = entry.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise bad(f"{key} must be a positive number of seconds, got {value!r}")
    shared = entry.get("shared_fs")
    if shared is not None and (not isinstance(shared, str) or not shared.startswith("/")):
        raise bad(
            f"shared_fs must be an absolute path mounted on this machine and every host, got {shared!r}"
        )
    names = set()
    for host in hosts:
        if not isinstance(host, dict) or not isinstance(host.get("host"), str) or not host["host"]:
            raise bad(f"each host needs `host: NAME`, got {host!r}")
        label = f"host {host['host']!r}"
        extra = set(host) - _SSH_HOST_KEYS
        if extra:
            raise bad(
                f"{label} has unknown key {sorted(extra)[0]!r}; allowed: {', '.join(sorted(_SSH_HOST_KEYS))}"
            )
        hname = str(host.get("name") or host["host"])
        if hname in names or "/" in hname:
            raise bad(f"{label}: host names must be unique and contain no '/'; set `name:`")
        names.add(hname)
        port = host.get("port")
        if port is not None and (
            not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
        ):
            raise bad(f"{label}: port must be 1-65535, got {port!r}")
        cpus = host.get("cpus")
        if cpus is not None and (not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1):
            raise bad(f"{label}: cpus must be a positive integer, got {cpus!r}")
        gpus = host.get("gpus")
        if gpus is not None and not (
            (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0)
            or (isinstance(gpus, list) and all(isinstance(g, (int, str)) for g in gpus))
        ):
            raise bad(f"{label}: gpus must be a count or a list of device ids, got {gpus!r}")
        memory = host.get("memory")
        if memory is not None:
            try:
                parse_size(memory if not isinstance(memory, bool) else "?")
            except MonkeyError:
                raise bad(f"{label}: memory must be a size like 64G, got {memory!r}") from None
        for key in ("user", "key", "workdir", "python", "proxy_jump", "name"):
            if host.get(key) is not None and not isinstance(host[key], str):
                raise bad(f"{label}: {key} must be text, got {host[key]!r}")


def could_fit(config: ProviderConfig, resources: Resources) -> bool:
    """False only when the configured cpus, gpus and memory of every host (or of the pinned
    one) rule the job out; what a host does not configure counts as enough."""
    for entry in config.options.get("hosts") or []:
        if resources.host and resources.host != str(entry.get("name") or entry["host"]):
            continue
        cpus, gpus, memory = entry.get("cpus"), entry.get("gpus"), entry.get("memory")
        gpu_count = gpus if isinstance(gpus, int) or gpus is None else len(gpus)
        if (
            (cpus is None or resources.cpus <= cpus)
            and (gpu_count is None or resources.gpus <= gpu_count)
            and (
                memory is None
                or not resources.memory
                or parse_size(resources.memory) <= parse_size(memory)
            )
        ):
            return True
    return False


def ssh_config() -> paramiko.SSHConfig | None:
    """~/.ssh/config parsed, or None when there is none."""
    import paramiko

    path = Path("~/.ssh/config").expanduser()
    if not path.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise MonkeyError(f"{path}: cannot be parsed ({exc}); fix it or move it aside") from None


def host_specs(config: ProviderConfig) -> list[HostSpec]:
    """The provider's hosts, each with its ~/.ssh/config entry applied."""
    sshconf = ssh_config()
    return [host_spec(entry, sshconf) for entry in config.options.get("hosts") or []]


def host_spec(entry: dict[str, Any], sshconf: paramiko.SSHConfig | None) -> HostSpec:
    """One host of the shape of a `hosts:` item, with its ~/.ssh/config entry applied (the
    item's own values win)."""
    alias = str(entry["host"])
    found: dict[str, Any] = sshconf.lookup(alias) if sshconf else {}
    gpus: Any = entry.get("gpus")  # a count or a list: made a list of ids
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        gpus = [str(i) for i in range(gpus)]
    elif gpus is not None:
        gpus = [str(g) for g in gpus]
    key = entry.get("key")
    keys = [key] if key else list(found.get("identityfile") or [])
    return HostSpec(
        name=str(entry.get("name") or alias),
        hostname=str(found.get("hostname") or alias),
        port=int(entry.get("port") or found.get("port") or 22),
        user=str(entry.get("user") or found.get("user") or _local_user()),
        keys=[os.path.expanduser(k) for k in keys],
        cpus=entry.get("cpus"),
        gpus=gpus,
        memory=None if entry.get("memory") is None else parse_size(entry["memory"]),
        workdir=str(entry.get("workdir") or "~/.monkey-agent"),
        python=str(entry.get("python") or "python3"),
        proxy_jump=entry.get("proxy_jump") or found.get("proxyjump"),
    )


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_PRINTED_BLOCK = re.compile(
    r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.S
)
_PRINTED_KEY = re.compile(
    r"\b((?:ssh|ecdsa-sha2|sk-ssh|sk-ecdsa-sha2)-[A-Za-z0-9@.-]+) (AAAA[A-Za-z0-9+/]+=*)"
)


def printed_host_keys(console: str | None) -> set[tuple[str, str]]:
    """The ``(type, base64)`` host keys a machine printed on its console (cloud-init's
    ``-----BEGIN SSH HOST KEY KEYS-----`` block; lines may carry a prefix such as ``ec2:``);
    empty when the image printed none (yet)."""
    found: set[tuple[str, str]] = set()
    for block in _PRINTED_BLOCK.findall(console or ""):
        found.update(_PRINTED_KEY.findall(block))
    return found


def check_printed(name: str, key: paramiko.PKey, printed: set[tuple[str, str]]) -> None:
    """Refuse KEY, offered by NAME at first contact, when its console printed host keys and
    KEY is not one of them (someone else answers at its address)."""
    if printed and (key.get_name(), key.get_base64()) not in printed:
        kinds = ", ".join(sorted({kind for kind, _ in printed}))
        raise MonkeyError(
            f"host key of {name} ({key.get_name()} {fingerprint(key)}) is not among the keys its "
            f"console printed ({kinds}); refusing to connect: another machine answers at its address"
        )


class HostKeys:
    """~/.ssh/known_hosts plus monkey's own known_hosts (where trust-on-first-use records),
    read again whenever either file changed (an ``ssh-keyscan >> ~/.ssh/known_hosts`` is
    seen by the next connection, without a restart)."""

    def __init__(self, home: Home, trust_on_first_use: bool) -> None:
        self.tofu = trust_on_first_use
        self.own_path = home.root / "known_hosts"
        self.paths = (Path("~/.ssh/known_hosts").expanduser(), self.own_path)
        self.stamp: tuple[Any, ...] = ()  # read at first use: a broken file fails a connection
        import paramiko

        self.keys = paramiko.HostKeys()

    def _stamps(self) -> tuple[Any, ...]:
        found: list[Any] = []
        for path in self.paths:
            try:
                st = path.stat()
                found.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                found.append(None)
        return tuple(found)

    def refresh(self) -> bool:
        """Read the files again when they changed since last read; whether they had."""
        import paramiko

        stamp = self._stamps()
        if stamp == self.stamp:
            return False
        keys = paramiko.HostKeys()
        for path in self.paths:
            if path.is_file():
                try:
                    keys.load(str(path))
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    raise MonkeyError(
                        f"{path}: unreadable known_hosts ({exc}); fix or remove it"
                    ) from None
        self.keys, self.stamp = keys, stamp
        return True

    def known_types(self, name: str) -> list[str]:
        """Key types known for NAME, to ask the server for one of those first."""
        self.refresh()
        found = self.keys.lookup(name)
        return list(found.keys()) if found else []

    def check(
        self,
        name: str,
        key: paramiko.PKey,
        tofu: bool = False,
        confirm: Callable[[paramiko.PKey], None] | None = None,
    ) -> None:
        """Accept KEY for NAME or raise MonkeyError naming host and fingerprint; an unknown
        key is recorded when trusting on first use (the provider's setting, or TOFU), once
        CONFIRM (when given) did not refuse it."""
        self.refresh()
        found = self.keys.lookup(name)
        kind, fp = key.get_name(), fingerprint(key)
        if found and kind in found:
            if found[kind] == key:
                return
            raise Untrusted(
                f"host key of {name} has CHANGED ({kind} {fp}); refusing to connect. If the host "
                f"was really reinstalled, remove its old line from known_hosts (ssh-keygen -R '{name}')"
            )
        if found:
            raise Untrusted(
                f"host {name} offered a {kind} key ({fp}) but known_hosts has only "
                f"{', '.join(found.keys())} for it; refusing to connect"
            )
        if not (self.tofu or tofu):
            raise Untrusted(
                f"host key of {name} is unknown ({kind} {fp}); verify it and add it to "
                f"~/.ssh/known_hosts (ssh-keyscan), or set `trust_on_first_use: true` for this provider"
            )
        if confirm is not None:
            confirm(key)
        self.keys.add(name, kind, key)
        line = f"{name} {kind} {key.get_base64()}\n"
        with self._locked():
            fd = os.open(self.own_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(line)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Monkey's known_hosts to this thread or process alone: a line appended while
        `forget` rewrites the file would go to the replaced file and be lost."""
        import fcntl

        fd = os.open(self.own_path.parent, os.O_RDONLY)  # its folder's lock: no file left
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def forget(self, name: str) -> None:
        """Drop the keys recorded for NAME in monkey's own known_hosts (a machine monkey
        created is gone; ~/.ssh/known_hosts is the user's and stays as it is)."""
        while self.keys.lookup(name) is not None:
            del self.keys[name]
        if not self.own_path.exists():
            return
        with self._locked():
            try:
                lines = self.own_path.read_text().splitlines(keepends=True)
            except FileNotFoundError:
                return
            kept = [line for line in lines if name not in line.split(" ", 1)[0].split(",")]
            if len(kept) != len(lines):
                staged = self.own_path.with_name(f"known_hosts.{os.getpid()}")
                write_private(staged, "".join(kept).encode())
                os.replace(staged, self.own_path)


def _load_key(path: str) -> paramiko.PKey:
    import paramiko

    if not os.path.isfile(path):
        raise MonkeyError(f"SSH key {path} does not exist; fix `key:` in providers.yml")
    encrypted = MonkeyError(
        f"SSH key {path} is encrypted; load it into ssh-agent (ssh-add) and drop `key:`"
    )
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise encrypted from None
    except TypeError as exc:  # cryptography's way of saying so for OpenSSH-format keys
        if "password" in str(exc).lower():
            raise encrypted from None
        raise MonkeyError(f"SSH key {path} cannot be read ({exc})") from None
    except (OSError, paramiko.SSHException, ValueError) as exc:
        hint = (
            "; that is a public key: give the private one, without .pub"
            if path.endswith(".pub")
            else ""
        )
        raise MonkeyError(f"SSH key {path} cannot be read ({exc}){hint}") from None


def _auth_keys(spec: HostSpec) -> list[Any]:
    """Keys to offer: the configured one, else ssh-agent's, else the default files."""
    import paramiko

    if spec.keys:
        return [_load_key(path) for path in spec.keys if os.path.isfile(path)] or [
            _load_key(spec.keys[0])
        ]
    keys: list[Any] = list(paramiko.Agent().get_keys())
    for name in _DEFAULT_KEYS:
        path = Path("~/.ssh").expanduser() / name
        if path.is_file():
            try:
                keys.append(_load_key(str(path)))
            except MonkeyError:
                continue
    if not keys:
        raise AuthFailed(
            f"no SSH key for {spec.name}: set `key:` in providers.yml or load one into ssh-agent"
        )
    return keys


def open_transport(
    spec: HostSpec,
    host_keys: HostKeys,
    timeout: float,
    specs_by_alias: dict[str, HostSpec] | None = None,
) -> paramiko.Transport:
    """A connected, verified and authenticated transport to the host (through ProxyJump)."""
    import paramiko

    jump = None
    try:
        if spec.proxy_jump:
            jump_spec = _jump_spec(spec.proxy_jump, specs_by_alias or {})
            jump = open_transport(jump_spec, host_keys, timeout, specs_by_alias)
            sock: Any = jump.open_channel(
                "direct-tcpip", (spec.hostname, spec.port), ("127.0.0.1", 0), timeout=timeout
            )
        else:
            sock = socket.create_connection((spec.hostname, spec.port), timeout=timeout)
            # Requests are small and answered at once: Nagle's delay would cost each one.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        raise Unreachable(
            f"{spec.name} ({spec.label}) is unreachable: {exc.strerror or exc}"
        ) from None
    except paramiko.SSHException as exc:
        raise Unreachable(f"{spec.name}: jump host cannot reach {spec.label}: {exc}") from None
    transport = paramiko.Transport(sock)
    transport.jump = jump  # kept alive with the transport it carries
    try:
        types = host_keys.known_types(spec.known_hosts_name)
        if types:
            opts = transport.get_security_options()
            opts.key_types = types + [t for t in opts.key_types if t not in types]
        transport.start_client(timeout=timeout)
        host_keys.check(
            spec.known_hosts_name,
            transport.get_remote_server_key(),
            tofu=spec.host_key_alias is not None,
            confirm=spec.confirm_key,
        )
        _authenticate(transport, spec)
    except MonkeyError:
        transport.close()
        raise
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport.close()
        raise Unreachable(f"{spec.name} ({spec.label}): SSH handshake failed: {exc}") from None
    transport.set_keepalive(5)
    return transport


def _authenticate(transport: paramiko.Transport, spec: HostSpec) -> None:
    import paramiko

    for key in _auth_keys(spec):
        try:
            transport.auth_publickey(spec.user, key)
        except paramiko.AuthenticationException:
            continue
        if transport.is_authenticated():
            return
    which = ", ".join(spec.keys) if spec.keys else "ssh-agent and ~/.ssh keys"
    raise AuthFailed(
        f"{spec.name}: authentication as {spec.user!r} failed on {spec.hostname}:{spec.port} "
        f"with {which}; check `user:` and `key:` in providers.yml"
    )


def _jump_spec(text: str, specs_by_alias: dict[str, HostSpec]) -> HostSpec:
    """The last hop of a ProxyJump value ``[user@]host[:port][,...]``; earlier hops lead to it."""
    *before, hop = [h.strip() for h in text.split(",")]
    user, _, hostport = hop.rpartition("@")
    host, _, port = hostport.partition(":")
    if host in specs_by_alias:
        return specs_by_alias[host]
    sshconf = ssh_config()
    found: dict[str, Any] = sshconf.lookup(host) if sshconf else {}
    keys = [os.path.expanduser(k) for k in found.get("identityfile") or []]
    return HostSpec(
        name=host,
        hostname=str(found.get("hostname") or host),
        port=int(port or found.get("port") or 22),
        user=user or str(found.get("user") or _local_user()),
        keys=keys,
        proxy_jump=",".join(before) or found.get("proxyjump"),
    )
