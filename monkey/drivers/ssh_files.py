"""What the SSH transport moves as files: blobs streamed to a host (checked on both sides)
or copied to the folder every host mounts, log bytes appended to the local copies, and a
host's kept folder (checkpoint, persisted folders) mirrored into MONKEY_HOME."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from monkey.drivers.ssh_io import Host, checked_rel, clear, finish_channel, raise_disk_full

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import paramiko

TAIL_MAX = 8 << 20  # what the host's helper returns of one file per request


def append_chunks(local: list[Path], chunks: list[bytes | None]) -> bool:
    """Append each chunk to its local log; True when one was cut at the helper's limit."""
    more = False
    for path, data in zip(local, chunks):
        if data:
            with open(path, "ab") as out:
                out.write(data)
        more = more or (data is not None and len(data) >= TAIL_MAX)
    return more


def mirror(listing: dict[str, Any], local: Path, get: Callable[[str, str], Any]) -> None:
    """Make the folder LOCAL equal to a host's folder as LISTING describes it (the helper's
    ``listing``: files with size and mtime, dirs), regular files only: GET(rel, path)
    fetches one file to a path; unchanged files are not fetched, gone ones are removed."""
    files = {checked_rel(rel): (size, mtime_ns) for rel, size, mtime_ns in listing["files"]}
    dirs = {checked_rel(d) for d in listing["dirs"]}
    local.mkdir(parents=True, exist_ok=True)
    for rel, (size, mtime_ns) in files.items():
        dst = local / rel
        try:
            info = os.lstat(dst)
            if stat.S_ISREG(info.st_mode) and (info.st_size, info.st_mtime_ns) == (size, mtime_ns):
                continue
        except FileNotFoundError:
            pass
        clear(dst.parent, local)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".monkey-tmp")
        get(rel, str(tmp))
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    for path in sorted(local.rglob("*"), reverse=True):
        rel = path.relative_to(local).as_posix()
        if rel in files or (rel in dirs and path.is_dir() and not path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def share_blobs(blobs: Path, shared: Path, digests: list[str]) -> None:
    """Copy the blobs DIGESTS of the folder BLOBS into SHARED/blobs, the folder every host
    mounts, readable as far as that folder lets anyone in (a hard link would share the
    home's private blob, unreadable to a host's user of another uid)."""
    for digest in digests:
        dst = shared / "blobs" / digest[:2] / digest[2:]
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".tmp-{dst.name}-{os.getpid()}")
        shutil.copyfile(blobs / digest[:2] / digest[2:], tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)


def send_blobs(channel: paramiko.Channel, host: Host, blobs: Path, digests: list[str]) -> int:
    """Stream DIGESTS of the folder BLOBS to the host's receiver on CHANNEL; the bytes sent
    (counted in ``host.bytes_sent`` too). A full disk there is said as such (the receiver
    leaves no partial file), not as the broken pipe it causes."""
    import blake3

    from monkey.snapshot.blobs import BlobDamaged

    sent = 0
    try:
        for digest in digests:
            path = blobs / digest[:2] / digest[2:]
            size = path.stat().st_size
            head = f"{digest} {size}\n".encode()
            channel.sendall(head)
            # The host checks what arrives with the sha256 (it has no blake3); the blake3 of
            # the same bytes proves they are the blob's.
            check, sha = blake3.blake3(), hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    check.update(chunk)
                    sha.update(chunk)
                    channel.sendall(chunk)
            if check.hexdigest() != digest:
                channel.sendall(b"damaged\n")  # refused there: nothing is stored
                raise BlobDamaged(digest, blobs)
            channel.sendall(f"{sha.hexdigest()}\n".encode())
            sent += len(head) + size
        channel.shutdown_write()
        finish_channel(channel, host)
    except Exception:
        raise_disk_full(channel, host)
        raise
    finally:
        host.bytes_sent += sent
    return sent
