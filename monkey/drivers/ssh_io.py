"""The SSH transport's pieces below the driver: one host's connection state, paramiko
channel helpers (errors, exact reads, exit checks, disk full) and SFTP tree helpers.
Used by monkey.drivers.ssh."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from monkey.drivers import ssh_remote
from monkey.drivers.ssh_hosts import HostSpec, Unreachable
from monkey.models import Instance, MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import paramiko

    from monkey.drivers.base import Capacity


class Host:
    """One host's connection state; ``lock`` guards the transport and its SFTP session."""

    def __init__(self, instance: str, spec: HostSpec) -> None:
        self.instance = instance
        self.spec = spec
        self.lock = threading.RLock()
        self.transport: paramiko.Transport | None = None
        self.sftp: paramiko.SFTPClient | None = None
        self.helper: paramiko.Channel | None = None
        self.helper_out: Any = None
        self.workdir = ""
        self.capacity: Capacity | None = None
        self.error: str | None = None
        self.transient = False
        self.waits = False  # its error makes jobs wait (not fail): see SSHDriver._failed
        self.tried = False
        self.next_try = 0.0
        self.failures = 0
        self.synced: set[str] = set()
        self.keys_seen: tuple[Any, ...] = ()  # the known_hosts files it last failed with
        self.bytes_sent = 0
        self.thread: threading.Thread | None = None
        self.node: Instance | None = None  # what its provider said of it (cloud instances)
        self.removed = False  # no longer served: its thread ends

    @property
    def up(self) -> bool:
        return self.transport is not None and self.transport.is_active()


@contextmanager
def ssh_errors(host: Host) -> Iterator[None]:
    """paramiko's own errors as MonkeyError (what the core handles), naming the host."""
    import paramiko

    try:
        yield
    except (paramiko.SSHException, EOFError) as exc:
        raise Unreachable(f"{host.instance}: {exc or type(exc).__name__}") from None


def raise_disk_full(channel: paramiko.Channel, host: Host) -> None:
    """MonkeyError "disk full on HOST at PATH (N bytes free)" when the remote step on CHANNEL
    ended for a full disk (a send cut short by its exit only says "Socket is closed")."""
    if not channel.exit_status_ready():
        channel.status_event.wait(5)
    if not channel.exit_status_ready() or channel.recv_exit_status() != ssh_remote.DISK_FULL:
        return
    err = bytearray()
    channel.settimeout(5)
    try:
        while chunk := channel.recv_stderr(1 << 16):
            err += chunk
    except TimeoutError:
        pass
    said = err.decode(errors="replace").strip().splitlines()
    if said and said[-1].startswith("disk full at "):
        raise MonkeyError(
            f"disk full on {host.instance} at {said[-1][len('disk full at ') :]}"
        ) from None


def read_exactly(stream: Any, size: int | None) -> bytes:
    """SIZE bytes (a line when None) from the helper, or MonkeyError when it ends early."""
    data = stream.readline() if size is None else stream.read(size)
    short = not data.endswith(b"\n") if size is None else len(data) != size
    if short:
        raise MonkeyError("the connection to the host dropped mid-reply")
    return data


def drain(channel: paramiko.Channel) -> tuple[int, bytes, bytes]:
    """A channel read to its end: exit code, stdout, stderr."""
    out, err = bytearray(), bytearray()
    while chunk := channel.recv(1 << 16):
        out += chunk
    while chunk := channel.recv_stderr(1 << 16):
        err += chunk
    return channel.recv_exit_status(), bytes(out), bytes(err)


def finish_channel(
    channel: paramiko.Channel, host: Host, check: bool = True, stderr: bool = False
) -> bytes:
    """Read a channel to its end: stdout (or stderr); MonkeyError on a non-zero exit."""
    code, out, err = drain(channel)
    if code == 127 and b"not found" in err:
        raise MonkeyError(
            f"{host.instance}: {host.spec.python!r} is not installed there; set "
            "`python:` for this host in providers.yml"
        )
    if check and code != 0:
        text = err.decode(errors="replace").strip().splitlines()
        raise MonkeyError(
            f"{host.instance}: remote step failed (exit {code}): "
            f"{text[-1] if text else 'no message'}"
        )
    return bytes(err if stderr else out)


# -- SFTP tree helpers (names are checked: a hostile listing cannot leave the folder) ------


def safe_names(entries: list[Any]) -> list[Any]:
    return [e for e in entries if e.filename not in (".", "..") and "/" not in e.filename]


def sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """mkdir -p over SFTP; MonkeyError naming the folder when the user may not create it."""
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        sub = "/".join(parts[:i])
        try:
            sftp.stat(sub)
            continue
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise cannot_create(sub, exc) from None
        try:
            sftp.mkdir(sub, 0o700)
        except OSError as exc:
            try:
                sftp.stat(sub)  # made meanwhile
            except OSError:
                raise cannot_create(sub, exc) from None


def cannot_create(path: str, exc: OSError) -> MonkeyError:
    return MonkeyError(
        f"cannot create {path} on the host ({exc.strerror or exc}); "
        "set this host's `workdir:` to a folder its user can write"
    )


def remove_tree(sftp: paramiko.SFTPClient, path: str) -> None:
    for entry in safe_names(sftp.listdir_attr(path)):
        sub = f"{path}/{entry.filename}"
        if stat.S_ISDIR(entry.st_mode or 0):
            remove_tree(sftp, sub)
        else:
            sftp.remove(sub)
    sftp.rmdir(path)


def same(local: os.stat_result, size: int | None, mtime: int | None) -> bool:
    """Whether two copies match by size and whole-second mtime (SFTP has no finer time).

    A file modified in the last few seconds may have changed again within its second
    without changing size: it never counts as the same.
    """
    return (
        stat.S_ISREG(local.st_mode)
        and local.st_size == size
        and mtime is not None
        and int(local.st_mtime) == mtime
        and mtime < time.time() - 5
    )


def checked_rel(rel: str) -> str:
    """A relative path from the host, refused when it could leave its folder."""
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts or rel == ".":
        raise MonkeyError(f"refusing the unsafe checkpoint path {rel!r} sent by the host")
    return rel


def clear(folder: Path, base: Path) -> None:
    """Remove files standing where FOLDER (under BASE) must be a folder."""
    while folder != base:
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        folder = folder.parent


def push_tree(sftp: paramiko.SFTPClient, local: str, remote: str) -> None:
    """Make the remote folder a copy of LOCAL (regular files and folders only)."""
    existing = {e.filename: e for e in safe_names(sftp.listdir_attr(remote))}
    names = set()
    for name in os.listdir(local) if os.path.isdir(local) else []:
        src, dst = os.path.join(local, name), f"{remote}/{name}"
        info = os.lstat(src)
        have = existing.get(name)
        if stat.S_ISDIR(info.st_mode):
            if have is not None and not stat.S_ISDIR(have.st_mode or 0):
                sftp.remove(dst)
            if have is None or not stat.S_ISDIR(have.st_mode or 0):
                sftp.mkdir(dst, 0o700)
            push_tree(sftp, src, dst)
        elif stat.S_ISREG(info.st_mode):
            if (
                have is not None
                and stat.S_ISREG(have.st_mode or 0)
                and same(info, have.st_size, have.st_mtime)
            ):
                names.add(name)
                continue
            if have is not None and stat.S_ISDIR(have.st_mode or 0):
                remove_tree(sftp, dst)
            sftp.put(src, f"{dst}.monkey-tmp")
            sftp.chmod(f"{dst}.monkey-tmp", stat.S_IMODE(info.st_mode) & 0o700)  # the user's alone
            sftp.utime(f"{dst}.monkey-tmp", (int(info.st_mtime), int(info.st_mtime)))
            sftp.posix_rename(f"{dst}.monkey-tmp", dst)
        else:
            continue
        names.add(name)
    for name, entry in existing.items():
        if name not in names:
            if stat.S_ISDIR(entry.st_mode or 0):
                remove_tree(sftp, f"{remote}/{name}")
            else:
                sftp.remove(f"{remote}/{name}")
