"""Blobs on a worker: checking code lists, fetching missing blobs (alone or in packs) from
presigned URLs, verifying them by their kept check, copying them into work/ (clone_file),
datasets' stamps, and uploading a file. Standard library only (see agent.py)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

from monkey.client_agent.common import RequestError, one_line, safe_relpath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_DIGEST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_:-]{2,199}")
FETCH_TIMEOUT = 60.0  # seconds a blob download or a result upload may stall
FETCH_THREADS = 8  # blob downloads at once (each is one request: latency adds up)


def tree_stamp(root: str) -> dict[str, list[int]]:
    """{relpath: [size, mtime_ns]} of every file under ROOT."""
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = [st.st_size, st.st_mtime_ns]
    return out


def dataset_intact(root: str, stamp: str) -> bool:
    """Whether the files under ROOT are exactly those recorded in the STAMP file."""
    try:
        with open(stamp, "rb") as f:
            return json.loads(f.read()) == tree_stamp(root)
    except (OSError, ValueError):
        return False


def remove_tree(path: str) -> None:
    """Delete a folder even when its subfolders were made read-only."""
    for folder, _dirs, _files in os.walk(path):
        try:
            os.chmod(folder, 0o755)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


FICLONE = 0x40049409  # linux/fs.h: make DEST share SRC's extents (btrfs, xfs, bcachefs...)
_reflink = [True]  # False once the filesystem refused a clone: plain copies from then on


def clone_file(src: str, dest: str) -> None:
    """DEST as a copy of SRC: a reflink (no data copied) where the filesystem has them,
    else a copy. Never a hard link: a job writing to its code would change the blob."""
    if _reflink[0]:
        with open(src, "rb") as fsrc, open(dest, "wb") as fdest:
            try:
                fcntl.ioctl(fdest.fileno(), FICLONE, fsrc.fileno())
                return
            except OSError:
                _reflink[0] = False
    shutil.copyfile(src, dest)


def check_digest(digest: Any) -> str:
    """DIGEST if it is a plain name usable in a path, else RequestError."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise RequestError(f"bad digest {digest!r}")
    return digest


def check_entries(files: Any) -> list[list[Any]]:
    """[[relpath, digest, mode]] with relpaths normalised, or RequestError."""
    if not isinstance(files, list):
        raise RequestError("files must be a list")
    out = []
    for entry in files:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise RequestError(f"bad file entry {entry!r}")
        rel, digest, mode = entry
        rel, digest = safe_relpath(rel), check_digest(digest)
        if not isinstance(mode, int):
            raise RequestError(f"bad mode for {rel!r}")
        out.append([rel, digest, mode])
    return out


def fetch_blobs(blob_urls: Any, blob_packs: Any, blobs_dir: str) -> int:
    """Download every blob of BLOB_URLS ({digest: [url, size]}) and BLOB_PACKS ([[url,
    [[digest, size], ...]]]) that BLOBS_DIR lacks intact (see blob_intact: with its check,
    matching), a few requests at a time; returns how
    many were fetched. RequestError when one cannot be fetched (the blobs fetched besides
    it are kept: they are complete)."""
    if not blob_urls and not blob_packs:
        return 0
    if (
        not isinstance(blob_urls or {}, dict)
        or not isinstance(blob_packs or [], list)
        or not blobs_dir
    ):
        raise RequestError(
            "blob_urls must map digests to [url, size] and blob_packs list "
            "[url, [[digest, size], ...]], with a blobs_dir"
        )
    calls = []
    for digest, entry in (blob_urls or {}).items():
        check_digest(digest)
        if (
            not isinstance(entry, list)
            or len(entry) not in (2, 3)
            or not isinstance(entry[0], str)
            or not _is_size(entry[1])
            or not _is_sha(entry[2:])
        ):
            raise RequestError(f"bad blob_urls entry for {digest}: {entry!r}")
        final = _blob_file(blobs_dir, digest)
        if not blob_intact(final):  # missing, damaged, or kept without its check
            calls.append((entry[0], [(digest, entry[1], final, *entry[2:])]))
    for entry in blob_packs or []:
        if (
            not isinstance(entry, list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], list)
            or not entry[1]
            or not all(
                isinstance(m, list) and len(m) in (2, 3) and _is_size(m[1]) and _is_sha(m[2:])
                for m in entry[1]
            )
        ):
            raise RequestError(f"bad blob_packs entry: {str(entry)[:200]}")
        members = [
            (check_digest(m[0]), m[1], _blob_file(blobs_dir, m[0]), *m[2:]) for m in entry[1]
        ]
        if not all(blob_intact(m[2]) for m in members):
            calls.append((entry[0], members))
    if not calls:
        return 0
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(FETCH_THREADS, len(calls))) as pool:
        futures = [pool.submit(fetch_pack, url, members) for url, members in calls]
        try:
            return sum(future.result() for future in futures)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def _is_sha(rest: list[Any]) -> bool:
    """Whether REST, the optional tail of a blob entry, is empty or one sha256 hex digest."""
    return not rest or (
        isinstance(rest[0], str) and re.fullmatch(r"[0-9a-f]{64}", rest[0]) is not None
    )


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _blob_file(blobs_dir: str, digest: str) -> str:
    return os.path.join(blobs_dir, digest[:2], digest[2:])


def _blob_stamp(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


def _blob_check_file(path: str) -> str:
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".sha256")


def record_blob(path: str, sha: str) -> None:
    """Keep blob PATH's check beside it: the sha256 of its bytes and its stat now (the same
    format as ssh_remote.CHECK's: blobs a host received are checked alike)."""
    side = _blob_check_file(path)
    tmp = f"{side}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{sha} {_blob_stamp(os.stat(path))}")
    os.replace(tmp, side)


def blob_intact(path: str) -> bool | None:
    """Whether blob PATH still holds the bytes it was stored with, by its check (see
    record_blob): a blob is never written in place, so the same stat means the same bytes;
    another stat is hashed again. None: no check kept (MONKEY_HOME's own store, whose blobs
    the core checks with their blake3 before every start)."""
    try:
        with open(_blob_check_file(path)) as f:
            sha, known = f.read().split(" ", 1)
    except (OSError, ValueError):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return False
    if known == _blob_stamp(st):
        return True
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return False
    if h.hexdigest() != sha:
        return False
    record_blob(path, sha)
    return True


def fetch_pack(url: str, members: list[tuple[Any, ...]]) -> int:
    """Stream URL, which holds MEMBERS (digest, size, final path[, sha256]) end to end in
    that order (one member: a lone blob), each missing one to a temporary file beside its
    final path; only when the whole object had exactly the sizes said, and each the sha256
    said, are they renamed into place. Returns how many were put; RequestError when it is
    shorter or longer, or a blob differs ("damaged blob D in the bucket": the core stores it
    again). The agent cannot check the blake3 digests (not in the standard library): the
    core gives the sha256 of its checked copy."""
    staged: list[tuple[str, str, Any]] = []
    try:
        with _fetching(members[0][0], url) as src:
            for digest, size, final, *want in members:
                if blob_intact(final):
                    _copy(src, digest, size, None)
                    continue
                os.makedirs(os.path.dirname(final), 0o700, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(final))
                sha = hashlib.sha256()
                staged.append((tmp, final, sha))
                with os.fdopen(fd, "wb") as out:
                    _copy(src, digest, size, out, sha)
                if want and sha.hexdigest() != want[0]:
                    raise RequestError(
                        f"damaged blob {digest} in the bucket (sha256 "
                        f"{sha.hexdigest()}, not {want[0]}): it is stored again"
                    )
            if src.read(1):
                digest, size, _final = members[-1]
                why = (
                    "its pack is longer than its index says"
                    if len(members) > 1
                    else f"more than {size} bytes"
                )
                raise RequestError(f"missing blob {digest} could not be fetched: {why}")
        for tmp, final, sha in staged:
            os.chmod(tmp, 0o400)
            os.replace(tmp, final)
            record_blob(final, sha.hexdigest())
        return len(staged)
    finally:
        for tmp, _final, _sha in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextlib.contextmanager
def _fetching(digest: str, url: str) -> Iterator[Any]:
    """The open response of URL, with every failure while it is read (for blob DIGEST, the
    first of a pack) turned into one RequestError line."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as src:
            yield src
    except urllib.error.HTTPError as e:
        raise RequestError(
            f"missing blob {digest} could not be fetched: HTTP {e.code} {e.reason}"
        ) from None
    except urllib.error.URLError as e:
        raise RequestError(f"missing blob {digest} could not be fetched: {e.reason}") from None
    except (OSError, ValueError) as e:  # a reset, a timeout, a full disk, a bad URL
        raise RequestError(f"missing blob {digest} could not be fetched: {one_line(e)}") from None


def _copy(src: Any, digest: str, size: int, out: Any, sha: Any = None) -> None:
    """Copy the next SIZE bytes of SRC to OUT (None: read past them), hashed into SHA when
    given; RequestError when SRC ends first."""
    got = 0
    while got < size and (chunk := src.read(min(1 << 20, size - got))):
        if out is not None:
            out.write(chunk)
            if sha is not None:
                sha.update(chunk)
        got += len(chunk)
    if got != size:
        raise RequestError(
            f"missing blob {digest} could not be fetched: {got} bytes instead of {size}"
        )


def put_file(path: str, url: str) -> None:
    """Send the file at PATH to a presigned PUT URL (S3 takes up to 5 GB in one PUT); a
    ``file://`` URL (the local storage) gets a copy, through a temporary name. OSError
    (urllib.error.URLError/HTTPError are ones) when it fails."""
    import urllib.parse
    import urllib.request

    if url.startswith("file:"):
        target = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        os.makedirs(os.path.dirname(target), 0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(target))
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return
    with open(path, "rb") as src:
        # An explicit type: with urllib's default (a form) S3-compatible services drop the body.
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(os.fstat(src.fileno()).st_size),
        }
        request = urllib.request.Request(url, data=src, method="PUT", headers=headers)
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as reply:
            reply.read()
