"""MONKEY_HOME and its files; providers.yml loading and validation."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monkey.models import MonkeyError, parse_size

# Unix socket paths are limited to 107 bytes; longer homes get a short private folder.
_SOCKET_PATH_MAX = 100
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])


def python_entry(module: str, function: str) -> list[str]:
    """argv running ``module.function()`` with this interpreter and this copy of monkey,
    whether or not monkey is installed (the launcher passes its location, not PYTHONPATH,
    so jobs started below it inherit nothing)."""
    boot = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        f"from {module} import {function}; {function}()"
    )
    return [sys.executable, "-c", boot, _PACKAGE_PARENT]


class Home:
    """Every path under MONKEY_HOME, derived from one folder."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        base = root or os.environ.get("MONKEY_HOME") or Path.home() / ".monkey"
        self.root = Path(base).expanduser().resolve()

    def ensure(self) -> Home:
        """Create the folder layout (idempotent) and return self."""
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in (self.blobs, self.runs, self.secrets, self.private):
            sub.mkdir(exist_ok=True)
        for private in (self.secrets, self.private):
            os.chmod(private, 0o700)
        return self

    @property
    def db(self) -> Path:
        return self.root / "monkey.db"

    @property
    def providers_file(self) -> Path:
        return self.root / "providers.yml"

    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    @property
    def private(self) -> Path:
        """A 0700 folder for sockets and locks only this user may touch."""
        return self.root / "private"

    @property
    def daemon_pid(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def core_status(self) -> Path:
        """Why the running core cannot write, when it cannot (see monkey.core.outage)."""
        return self.private / "core.status"

    @property
    def daemon_lock(self) -> Path:
        return self.private / "daemon.lock"

    @property
    def agent_root(self) -> Path:
        """Where the local agent keeps its state; runs and blobs are shared with the core."""
        return self.root

    def socket_path(self, name: str) -> Path:
        """Path of a private Unix socket, shortened when MONKEY_HOME is deep."""
        path = self.private / f"{name}.sock"
        if len(str(path)) <= _SOCKET_PATH_MAX:
            return path
        tag = hashlib.blake2s(str(self.root).encode(), digest_size=6).hexdigest()
        short = Path(f"/tmp/monkey-{os.getuid()}")
        short.mkdir(mode=0o700, exist_ok=True)
        info = short.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise MonkeyError(
                f"{short} is not a private folder of this user; remove it or set a shorter MONKEY_HOME"
            )
        return short / f"{tag}-{name}.sock"

    def run_dir(self, juid: str, attempt: int) -> Path:
        return self.runs / juid / str(attempt)

    def checkpoint_dir(self, juid: str) -> Path:
        return self.runs / juid / "checkpoint"

    def secrets_file(self, juid: str) -> Path:
        return self.secrets / f"{juid}.json"


def read_yaml(path: Path) -> Any:
    """A YAML file's data; unreadable files and bad syntax give a one-line MonkeyError."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MonkeyError(f"cannot read {path}: {exc.strerror}; check its permissions") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise MonkeyError(f"{path}{line}: invalid YAML; fix the syntax there") from None


@dataclass
class ProviderConfig:
    """One entry of providers.yml."""

    name: str
    type: str
    options: dict[str, Any] = field(default_factory=dict)


PROVIDER_TYPES = ("local", "ssh", "ec2", "gce", "slurm")
_LOCAL_KEYS = {"type", "slots", "gpus"}


def default_local() -> ProviderConfig:
    """The `local` provider that exists with no configuration."""
    return ProviderConfig("local", "local", {})


def load_providers(home: Home) -> dict[str, ProviderConfig]:
    """Read and validate providers.yml; the `local` provider is always present."""
    providers = {"local": default_local()}
    path = home.providers_file
    if not path.exists():
        return providers
    where = f"{path}"
    data = read_yaml(path)
    if data is None:
        return providers
    if not isinstance(data, dict) or not isinstance(data.get("providers", {}), dict):
        raise MonkeyError(f"{where}: expected a mapping `providers: {{NAME: {{type: ...}}}}`")
    unknown = set(data) - {"providers"}
    if unknown:
        raise MonkeyError(f"{where}: unknown top-level key {sorted(unknown)[0]!r}; only `providers` is allowed")
    for name, entry in (data.get("providers") or {}).items():
        if not isinstance(entry, dict):
            raise MonkeyError(f"{where}: provider {name!r} must be a mapping with a `type`")
        kind = entry.get("type")
        if kind not in PROVIDER_TYPES:
            raise MonkeyError(
                f"{where}: provider {name!r} has type {kind!r}; use one of {', '.join(PROVIDER_TYPES)}"
            )
        if kind == "local":
            _validate_local(where, name, entry)
        elif kind == "ssh":
            _validate_ssh(where, name, entry)
        providers[str(name)] = ProviderConfig(str(name), kind, dict(entry))
    return providers


def _validate_local(where: str, name: str, entry: dict[str, Any]) -> None:
    unknown = set(entry) - _LOCAL_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise MonkeyError(f"{where}: provider {name!r} has unknown key {key!r}; allowed: slots, gpus")
    slots = entry.get("slots")
    if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots < 1):
        raise MonkeyError(f"{where}: provider {name!r}: slots must be a positive integer, got {slots!r}")
    gpus = entry.get("gpus")
    if gpus is not None and not (
        (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0)
        or (isinstance(gpus, list) and all(isinstance(g, (int, str)) for g in gpus))
    ):
        raise MonkeyError(
            f"{where}: provider {name!r}: gpus must be a count or a list of device ids, got {gpus!r}"
        )


_SSH_KEYS = {"type", "hosts", "trust_on_first_use", "checkpoint_every", "connect_timeout", "shared_fs"}
_SSH_HOST_KEYS = {"name", "host", "port", "user", "key", "cpus", "gpus", "memory", "workdir",
                  "python", "proxy_jump"}


def _validate_ssh(where: str, name: str, entry: dict[str, Any]) -> None:
    def bad(what: str) -> MonkeyError:
        return MonkeyError(f"{where}: provider {name!r}: {what}")

    unknown = set(entry) - _SSH_KEYS
    if unknown:
        raise bad(f"unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_SSH_KEYS - {'type'}))}")
    hosts = entry.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise bad("needs `hosts:`, a list like [{host: gpu1, user: me, key: ~/.ssh/id_ed25519}]")
    for key in ("checkpoint_every", "connect_timeout"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise bad(f"{key} must be a positive number of seconds, got {value!r}")
    shared = entry.get("shared_fs")
    if shared is not None and (not isinstance(shared, str) or not shared.startswith("/")):
        raise bad(f"shared_fs must be an absolute path mounted on this machine and every host, got {shared!r}")
    names = set()
    for host in hosts:
        if not isinstance(host, dict) or not isinstance(host.get("host"), str) or not host["host"]:
            raise bad(f"each host needs `host: NAME`, got {host!r}")
        label = f"host {host['host']!r}"
        extra = set(host) - _SSH_HOST_KEYS
        if extra:
            raise bad(f"{label} has unknown key {sorted(extra)[0]!r}; allowed: {', '.join(sorted(_SSH_HOST_KEYS))}")
        hname = str(host.get("name") or host["host"])
        if hname in names or "/" in hname:
            raise bad(f"{label}: host names must be unique and contain no '/'; set `name:`")
        names.add(hname)
        port = host.get("port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
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
