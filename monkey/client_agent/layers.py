"""Apply an image layer (a tar being read) onto an image's root, every entry kept inside it:
an absolute path, a ``..``, a hard link to a path outside the layer's root or a whiteout of
``/`` refuse the layer; links in the root are followed as inside it (a chroot's
resolution), never outside; no device file is made (the unprivileged runner could not use
one), setuid and setgid bits are dropped; OCI whiteouts (``.wh.NAME``, the opaque
``.wh..wh..opq``) remove what lower layers put there. Standard library only: pull.py
imports it beside it, in launcher.py's process."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile

_CHUNK = 1 << 20
_LINKS_MAX = 40  # links followed on the way to one path


class Refused(Exception):
    """A layer entry that would write outside the root, or undo the root itself."""


def apply(tar: tarfile.TarFile, root: str) -> int:
    """Apply the layer TAR onto ROOT; Refused naming the entry that would write outside
    ROOT or undo it. The number of device files not made."""
    here: set[str] = set()  # this layer's entries and their folders: an opaque whiteout spares them
    opaque: list[str] = []
    devices = 0
    for member in tar:
        rel = _relative(member.name)
        if not rel:
            continue  # the root itself ("./")
        parent, _, base = rel.rpartition("/")
        if base == ".wh..wh..opq":
            if not parent:
                raise Refused("an opaque whiteout of / (it would remove the whole image)")
            opaque.append(parent)
            continue
        if base.startswith(".wh."):
            gone = base[4:]
            if not gone or gone in (".", ".."):
                raise Refused(f"a whiteout of no name: {member.name}")
            folder = _resolve(root, parent, create=False)
            if folder is not None:
                _remove(os.path.join(folder, gone))
            continue
        if member.ischr() or member.isblk():
            devices += 1
            continue
        folder = _resolve(root, parent, create=True)
        assert folder is not None
        dest = os.path.join(folder, base)
        here.add(rel)
        while parent:
            here.add(parent)
            parent = parent.rpartition("/")[0]
        _put(tar, member, root, dest)
    for folder in opaque:
        host = _resolve(root, folder, create=False)
        if host is None or not os.path.isdir(host) or os.path.islink(host):
            continue
        for name in os.listdir(host):
            if f"{folder}/{name}" not in here:
                _remove(os.path.join(host, name))
    return devices


def _relative(name: str) -> str:
    """NAME of a layer entry as a path relative to the root; Refused when absolute or
    with a ``..``."""
    if name.startswith("/"):
        raise Refused(f"an absolute path: {name}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"a path with ..: {name}")
    return "/".join(parts)


def _resolve(root: str, rel: str, create: bool) -> str | None:
    """The host path of the folder REL in ROOT, its links followed as inside ROOT (an
    absolute target from ROOT, ``..`` stopping at ROOT); missing folders made when CREATE,
    else None."""
    parts = [p for p in rel.split("/") if p]
    done: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, part)
        try:
            mode = os.lstat(host).st_mode
        except FileNotFoundError:
            if not create:
                return None
            os.mkdir(host, 0o755)
            mode = stat.S_IFDIR
        if stat.S_ISLNK(mode):
            links += 1
            if links > _LINKS_MAX:
                raise Refused(f"too many links on the way to {rel}")
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        if not stat.S_ISDIR(mode):
            if not create:
                return None
            os.unlink(host)  # a file where a later layer has a folder
            os.mkdir(host, 0o755)
        done.append(part)
    return os.path.join(root, *done)


def _remove(path: str) -> None:
    """Remove PATH (a folder with all it holds), never following a link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _put(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, dest: str) -> None:
    """Make MEMBER at DEST (in its folder, already resolved inside ROOT)."""
    mode = member.mode & 0o777  # no setuid, setgid or sticky bit
    try:
        old = os.lstat(dest).st_mode
    except FileNotFoundError:
        old = 0
    if member.isdir():
        if old and not stat.S_ISDIR(old):
            os.unlink(dest)
            old = 0
        if not old:
            os.mkdir(dest, 0o700)
        os.chmod(dest, mode | 0o700)  # the owner keeps writing in it (later layers)
        return
    if old:
        _remove(dest)
    if member.isreg():
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb", buffering=0) as out:
            src = tar.extractfile(member)
            if src is not None:
                shutil.copyfileobj(src, out, _CHUNK)
            os.fchmod(out.fileno(), mode | 0o600)
    elif member.issym():
        os.symlink(member.linkname, dest)
    elif member.islnk():
        target = _relative(member.linkname)
        parent, _, base = target.rpartition("/")
        folder = _resolve(root, parent, create=False)
        source = os.path.join(folder, base) if folder is not None and base else None
        if source is None or not os.path.lexists(source) or os.path.isdir(source):
            raise Refused(f"a hard link to what the layer's root lacks: {member.linkname}")
        os.link(source, dest, follow_symlinks=False)
        return
    elif member.isfifo():
        os.mkfifo(dest, mode | 0o600)
    else:
        return  # another kind of entry (GNU's volume headers...): nothing to make
    try:
        os.utime(dest, (member.mtime, member.mtime), follow_symlinks=False)
    except (OSError, OverflowError, ValueError):
        pass
